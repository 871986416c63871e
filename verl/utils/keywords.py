"""Keyword arguments of the tutorial's classes that a newcomer misnames (``PPOTrainer(worker=...)``,
``ActorRolloutRefWorker(cfg=...)``): Python's TypeError, with the argument meant and the ones taken."""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Sequence


def meant(key: str, names: Sequence[str]) -> str | None:
    """The argument ``key`` most likely stands for: one whose name holds it or is held in it (``worker`` for
    ``actor_rollout_ref_worker``, ``ppo_config`` for ``config``), else the closest spelling; None if none is close."""
    held = [name for name in names if key in name or name in key]
    close = held or difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return close[0] if close else None


def hint_keywords(function: Callable) -> Callable:
    """``function`` (an ``__init__``), where a keyword it does not take raises TypeError naming the argument
    meant and every one it takes, before anything runs. A function that takes ``**kwargs`` is returned as is."""
    params = inspect.signature(function).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return function
    names = [n for n, p in params.items() if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    owner = function.__qualname__.removesuffix(".__init__")

    @functools.wraps(function)
    def checked(*args, **kwargs):
        for key in kwargs:
            if key not in params:
                close = meant(key, names)
                hint = f" (did you mean {close}=?)" if close else ""
                raise TypeError(f"{owner}() got an unexpected keyword argument {key!r}{hint}; it takes "
                                f"{', '.join(names)}")
        return function(*args, **kwargs)
    return checked
