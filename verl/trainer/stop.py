"""Ctrl-C and SIGTERM end a run at the next step boundary, with a checkpoint of that step.

The conventions (those of a shell, which reports a process a signal ended as 128 + the signal):

* the first SIGINT (Ctrl-C) or SIGTERM (``kill``, a scheduler's preemption, torchrun passing either
  on) lets the current step finish; the run saves a checkpoint of it (unless that step was just
  saved), closes its loggers and exits with **130** after SIGINT, **143** after SIGTERM. The same
  command resumes from that checkpoint. One that lands during a save stops the run once that save is
  complete, without another step;
* a second one stops at once (exit 130 / 143); the checkpoints already written are complete,
  since every save is atomic. Outside the steps (loading, validation before or after them, the
  export) either stops at once (:func:`verl.trainer.entry.sigterm_stops_at_once` for SIGTERM).

Under torchrun the launcher passes the signal on to every rank, each at its own moment. The ranks
decide together: at every step boundary they add up their flags (one small all-reduce), so all of
them stop after the same step and none waits in a collective that the others never join. The
launcher waits ``--shutdown_timeout`` (30 s by default) for its ranks before it kills them, so a
step and a save longer than that are cut short: the previous checkpoint then stands.
"""

from __future__ import annotations

import os
import signal
import threading

import torch

from verl.distributed.process_group import all_reduce_sum

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(KeyboardInterrupt):
    """The run stopped on a signal; ``exit_code`` is 128 + its number. ``clean``: it stopped at a step
    boundary on every rank (its checkpoint written), not at once on a second signal."""

    def __init__(self, signum: int, message: str, *, clean: bool):
        super().__init__(message)
        self.exit_code = 128 + signum
        self.clean = clean


class StopSignals:
    """Within ``with StopSignals(watchdog) as stop:`` SIGINT and SIGTERM only ask the run to stop;
    :meth:`requested` (a collective: every rank calls it at every step boundary) says whether some
    rank was asked, and by which signal. Outside the main thread (a run inside a worker thread) it
    changes nothing: signals reach only the main thread."""

    def __init__(self, watchdog):
        self.watchdog = watchdog
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._on_signal) for sig in SIGNALS}
            # Under torchrun the watchdog's thread sees SIGTERM first: it must leave the first one to us.
            self.watchdog.graceful_sigterm = True
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        self.watchdog.graceful_sigterm = False

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            self._restore()
            raise RunInterrupted(signum, f"stopped at once by a second {name}: the checkpoints already written are "
                                         f"complete; run the same command again to resume from the latest one",
                                 clean=False)
        self.signum = signum
        # os.write: print() may be inside a write of the main thread that this handler interrupted.
        os.write(2, f"\nreceived {name}: stopping after this step with a checkpoint ({name} again stops "
                    f"at once)\n".encode())

    def requested(self) -> int | None:
        """The signal some rank received (SIGINT before SIGTERM when both were), or None; the same on
        every rank. A collective."""
        flags = torch.tensor([float(self.signum == sig) for sig in SIGNALS])
        all_reduce_sum(flags)
        for sig, flag in zip(SIGNALS, flags.tolist()):
            if flag > 0:
                return int(sig)
        return None
