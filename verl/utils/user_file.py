"""Running a user's python file (a reward function, a dataset class) as a module, by path."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable


def import_user_file(path: str | os.PathLike, *, prefix: str, what: str, key: str,
                     error: Callable[[str], Exception]) -> tuple[ModuleType, Path]:
    """``(module, absolute path)`` of the python file at ``path``.

    The file runs on every call (an edited file is picked up) and is registered in ``sys.modules``
    under ``prefix`` plus a name derived from its absolute path, so what it defines pickles by
    reference within this process. The file's folder joins the end of ``sys.path``, so that the
    modules beside it import. A missing file, or one whose import raises, is ``error(message)``
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
    if str(path.parent) not in sys.path:  # its own helper modules beside it import, as `python file.py` finds them;
        sys.path.append(str(path.parent))  # last, so that a helper never shadows an installed module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[module_name]
        raise error(f"importing {what} {path} raised {type(e).__name__}: {e}{_upstream_hint(e)}") from e
    return module, path


def _upstream_hint(error: Exception) -> str:
    """For a module (or name) of upstream verl that this project does not have: which ones are here."""
    if not isinstance(error, ImportError) or not (error.name or "").startswith("verl."):
        return ""
    missing = error.name
    if not isinstance(error, ModuleNotFoundError):  # from verl.x import y: y is not in verl.x here
        found = re.search(r"cannot import name '([^']+)'", str(error))
        missing = f"{error.name}.{found.group(1)}" if found else error.name
    if missing.startswith("verl.utils.reward_score."):
        return (f" ({missing} is a scorer module of upstream verl that this project does not have; here "
                f"verl.utils.reward_score has default_compute_score and the modules gsm8k, math, math_dapo and "
                f"geo3k: see docs/rewards.md)")
    return (f" ({missing} is a module of upstream verl that this project does not have; docs/rewards.md, "
            f"docs/data.md and docs/agents.md list the verl modules a user file can import here)")
