"""Where verl keeps what it can rebuild: the built-in tiny model and the demo's warm start."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$VERL_CACHE_DIR`` (default ``~/.cache/verl``) joined with ``parts``; created on demand."""
    root = os.environ.get("VERL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "verl")
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
