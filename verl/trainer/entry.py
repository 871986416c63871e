"""What every command-line entry point shares: help, clean errors, and Ctrl-C."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading

from verl.config import TrainerConfig
from verl.distributed.process_group import is_main_process, launched_distributed, leave_job
from verl.errors import VerlError, disk_full_message
from verl.trainer.stop import RunInterrupted
from verl.utils.command import freeze_heap_at_exit


def print_config_request(args: list[str]) -> list[str] | None:
    """The other arguments when ``args`` hold Hydra's print-config flag (``--cfg job``, ``-c job``,
    ``--cfg=job``; verl's scripts use it to show the config a run would use), else None."""
    flag = next((i for i, a in enumerate(args) if a in ("--cfg", "-c") or a.startswith("--cfg=")), None)
    if flag is None:
        return None
    return args[:flag] + args[flag + (1 if "=" in args[flag] else 2):]


@contextlib.contextmanager
def sigterm_stops_at_once():
    """Within the block, a SIGTERM whose default action would end the process without a word (while the
    model loads, during the validation before or after the steps, the export, the report) raises
    :class:`RunInterrupted` instead, as Ctrl-C raises KeyboardInterrupt there: the loggers close and the
    run says it stopped (exit 143). During the steps the run loop takes it (it stops at the next step
    boundary with a checkpoint). Under torchrun, and where SIGTERM has a handler, nothing changes: the
    watchdog takes it there (:mod:`verl.distributed.watchdog`)."""
    if (threading.current_thread() is not threading.main_thread() or launched_distributed()
            or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL):
        yield
        return

    owner = os.getpid()

    def on_sigterm(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends the process at once
        if os.getpid() != owner:  # a forked child that inherited the handler: the default action
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise RunInterrupted(signum, "stopped at once by SIGTERM outside the training steps: the checkpoints "
                                     "already written are complete; run the same command again to resume from the "
                                     "latest one", clean=False)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) == on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_entry(job, args: list[str], doc: str | None) -> int:
    """Run ``job()``; a :class:`VerlError` or a full disk prints its message alone and exits 2. A run stopped by
    Ctrl-C exits 130, by SIGTERM 143 (see :mod:`verl.trainer.stop` and :func:`sigterm_stops_at_once`)."""
    if any(a in ("-h", "--help") for a in args):
        print((doc or "").strip() + "\n\nKeys (key=value):\n" + TrainerConfig.format_help())
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=os.environ.get("VERL_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    freeze_heap_at_exit()  # about a second less between the last line and the exit (verl.utils.command)
    try:
        with sigterm_stops_at_once():
            job()
    except VerlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk: one line (the checkpoint's own save says more, as a VerlError)
        message = disk_full_message(exc)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2
    except RunInterrupted as stop:
        if is_main_process() or not stop.clean:  # a clean stop is the same on every rank: said once
            print(f"interrupted: {stop}", file=sys.stderr)
        if stop.clean:
            leave_job(stop.exit_code)  # every rank stopped at the same step: leave as a finished rank does
        return stop.exit_code
    except KeyboardInterrupt:
        print("\ninterrupted: checkpoints already written are complete; run the same command again to "
              "resume from the latest one.", file=sys.stderr)
        return 130
    leave_job(0)  # under torchrun: exit now, past an occasional abort in torch's shutdown (see leave_job)
    return 0


def config_entry(config_cls, job, args: list[str], doc: str | None) -> int:
    """An entry point over one config class: ``--help`` lists its keys, ``--cfg job`` prints the config
    the command would use, else ``job(config)`` under :func:`run_entry`."""
    if any(a in ("-h", "--help") for a in args):
        print((doc or "").strip() + "\n\nKeys (key=value):\n" + config_cls.format_help())
        return 0
    rest = print_config_request(args)
    if rest is not None:
        return run_entry(lambda: print(config_cls.from_cli(rest).to_yaml(), end=""), rest, doc)
    return run_entry(lambda: job(config_cls.from_cli(args)), args, doc)
