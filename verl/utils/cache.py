"""Where verl keeps what it can rebuild: the built-in tiny model and the demo's warm start."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$VERL_CACHE_DIR`` (default ``~/.cache/verl``) joined with ``parts``; created on demand."""
    root = os.environ.get("VERL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "verl")
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def cache_lock(name: Path, waiting: str | None = None):
    """Hold an exclusive lock on ``<name>.lock`` while one process builds a cache entry, so two runs
    started together (two terminals, parallel tests) never write the same folder at once. The lock is
    the kernel's (``flock``): a process that dies releases it. ``waiting`` is printed once if another
    process holds it."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): build unlocked, as before
        yield
        return
    path = Path(f"{name}.lock")
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting:
                print(waiting, flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
