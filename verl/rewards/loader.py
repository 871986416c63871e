"""Loading a user's reward function from a python file, by path."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable

from verl.rewards.errors import RewardError


def load_reward_function(path: str | os.PathLike, name: str = "compute_score") -> Callable[..., Any]:
    """Import the python file at ``path`` and return its function ``name``.

    The file is executed on every call (an edited file is picked up) and registered in
    ``sys.modules`` under a name derived from its absolute path, so that its functions pickle by
    reference within this process.
    """
    path = Path(os.path.expanduser(str(path))).resolve()
    if not path.is_file():
        raise RewardError(f"reward function file not found: {path}; "
                          f"set custom_reward_function.path to an existing .py file")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"verl_custom_reward_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RewardError(f"cannot import {path} as a python module (custom_reward_function.path)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[module_name]
        raise RewardError(f"importing reward file {path} raised {type(e).__name__}: {e}") from e

    if not hasattr(module, name):
        defined = sorted(n for n, v in vars(module).items()
                         if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module_name)
        raise RewardError(f"{path} has no attribute {name!r}; callables it defines: {defined or 'none'}; "
                          f"set custom_reward_function.name to one of them")
    fn = getattr(module, name)
    if not callable(fn):
        raise RewardError(f"{path}: {name!r} is a {type(fn).__name__}, not a function "
                          f"(custom_reward_function.name)")
    return fn
