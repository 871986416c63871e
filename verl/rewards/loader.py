"""Loading a user's reward function from a python file, by path."""

from __future__ import annotations

import os
from typing import Any, Callable

from verl.errors import RewardError
from verl.utils.user_file import import_user_file


def load_reward_function(path: str | os.PathLike, name: str = "compute_score") -> Callable[..., Any]:
    """Import the python file at ``path`` and return its function ``name``.

    The file is executed on every call (an edited file is picked up) and registered in
    ``sys.modules`` under a name derived from its absolute path, so that its functions pickle by
    reference within this process.
    """
    module, path = import_user_file(path, prefix="verl_custom_reward", what="reward function file",
                                    key="custom_reward_function.path", error=RewardError)
    module_name = module.__name__

    if not hasattr(module, name):
        defined = sorted(n for n, v in vars(module).items()
                         if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module_name)
        raise RewardError(f"{path} has no attribute {name!r}; callables it defines: {defined or 'none'}; "
                          f"set custom_reward_function.name to one of them")
    fn = getattr(module, name)
    if isinstance(fn, type):  # calling the class would make an instance per response, never a score
        made = "an instance of it" + (" (it has __call__)" if "__call__" in vars(fn) else " whose __call__ scores")
        raise RewardError(f"{path}: {name!r} is a class, and the reward function is called once per response; "
                          f"make {made} in the file, e.g. {name.lower()} = {name}(), and set "
                          f"custom_reward_function.name={name.lower()}")
    if not callable(fn):
        raise RewardError(f"{path}: {name!r} is a {type(fn).__name__}, not a function "
                          f"(custom_reward_function.name)")
    return fn
