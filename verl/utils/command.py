"""The garbage collector in verl's command-line processes: what they import and build is never scanned twice.

A training process holds millions of Python objects that live as long as it does: the modules,
classes and functions of torch, transformers and verl. Python's cyclic garbage collector scans all of
them in each of its full collections: about seven while a run starts on a 2-core machine (0.7 s), and
several more while the interpreter shuts down (about a second after the last line of output, in every
``python -m verl.trainer.main_ppo`` and in every such process a test starts).

:func:`gc.freeze` moves the objects that exist at a moment to a permanent generation that no
collection scans. A command freezes twice:

* :func:`run_command` (the ``if __name__ == "__main__"`` line of each entry module, and ``verl``'s
  console script) freezes once the command's modules are imported, before it parses its arguments;
* :func:`freeze_heap_at_exit` (registered by every entry point) freezes at the exit, after the work.

Nothing else changes: objects are still freed by reference counting when their last reference goes
(files closed and flushed, tensors released), every later collection still runs over what is built
afterwards, and the other exit callbacks run (the loggers' flushes, Ray's and the process group's
shutdown, temporary folders removed). What a freeze holds and later becomes unreachable in a
reference cycle is not reclaimed: at the start, a few objects made while importing; at the exit,
nothing Python promised to finalise (the operating system takes the memory back). A process that
calls an entry point's ``main()`` as a function (a test, a notebook) is not frozen at the start,
where garbage from its earlier work would stay for good; it only gets the freeze at its own exit.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
from collections.abc import Callable
from typing import NoReturn

_registered = False


def freeze_heap_at_exit() -> None:
    """Register an exit callback that calls :func:`gc.freeze` (once per process; later calls do nothing)."""
    global _registered
    if not _registered:
        atexit.register(gc.freeze)
        _registered = True


def run_command(main: Callable[[], int]) -> NoReturn:
    """``sys.exit(main())`` for a command-line process, with the heap imported so far frozen first
    (and a reader that stops early ending it quietly, :func:`quiet_broken_pipe`)."""
    gc.freeze()
    freeze_heap_at_exit()
    sys.exit(quiet_broken_pipe(main))


def quiet_broken_pipe(call: Callable[[], int]) -> int:
    """``call()``; when what reads the output stops first (``verl train --help | head``, ``less`` quit
    early), the command ends with exit status 141 (as a program killed by SIGPIPE) and no traceback.
    Standard output then points at /dev/null, so that Python's last flush of it does not fail again."""
    try:
        return call()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
