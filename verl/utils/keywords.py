"""Keyword arguments of the tutorial's classes that a newcomer misnames (``PPOTrainer(worker=...)``,
``ActorRolloutRefWorker(cfg=...)``): Python's TypeError, with the argument meant and the ones taken."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

from verl.errors import closest_name


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
                close = closest_name(key, names, containing=True)
                hint = f" (did you mean {close}=?)" if close else ""
                raise TypeError(f"{owner}() got an unexpected keyword argument {key!r}{hint}; it takes "
                                f"{', '.join(names)}")
        return function(*args, **kwargs)
    return checked
