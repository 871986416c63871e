"""Running a user's python file (a reward function, a dataset class) as a module, by path."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable


def import_user_file(path: str | os.PathLike, *, prefix: str, what: str, key: str,
                     error: Callable[[str], Exception]) -> tuple[ModuleType, Path]:
    """``(module, absolute path)`` of the python file at ``path``.

    The file runs on every call (an edited file is picked up) and is registered in ``sys.modules``
    under ``prefix`` plus a name derived from its absolute path, so what it defines pickles by
    reference within this process. A missing file, or one whose import raises, is ``error(message)``
    naming ``what`` the file is and the config ``key`` that gives it.
    """
    path = Path(os.path.expanduser(str(path))).resolve()
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.py"))
        listed = f" (it holds {', '.join(inside[:5])}{', ...' if len(inside) > 5 else ''})" if inside else \
            " (it holds no .py file)"
        raise error(f"{key}={path} is a folder, not a {what}{listed}; set {key} to the .py file itself")
    if not path.is_file():
        raise error(f"{what} not found: {path}; set {key} to an existing .py file")
    module_name = f"{prefix}_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise error(f"cannot import {path} as a python module ({key})")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[module_name]
        raise error(f"importing {what} {path} raised {type(e).__name__}: {e}") from e
    return module, path
