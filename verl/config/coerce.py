"""Checking Python values against a field's type annotation, with errors that name the key.

Text (YAML files, the command line) is typed by OmegaConf first (`verl.config.omega`); what reaches
this check is Python values. Section-typed fields (ConfigNode subclasses) are handled by
`verl.config.node`, not here.
"""

from __future__ import annotations

import copy
import difflib
import types
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union, get_args, get_origin

from verl.errors import ConfigError

NoneType = type(None)


def type_name(tp: Any) -> str:
    """A short human name for an annotation: `int | None`, `list[float]`, `one of 'a', 'b'`."""
    if tp is NoneType or tp is None:
        return "None"
    if tp is Any:
        return "any value"
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(tp))
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in get_args(tp))
    if origin in (list, dict):
        args = get_args(tp)
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]" if args else origin.__name__
    return getattr(tp, "__name__", str(tp))


def is_dict_type(tp: Any) -> bool:
    """True for free-form mapping fields (`dict`, `dict[str, Any]`, optionally `| None`)."""
    if tp is dict or get_origin(tp) is dict:
        return True
    if get_origin(tp) in (Union, types.UnionType):
        return any(is_dict_type(a) for a in get_args(tp) if a is not NoneType)
    return False


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def mismatch(value: Any, tp: Any, key: str, example: str | Callable[[], str] = "") -> ConfigError:
    """The wrong-type error: key, expected type, the value given, and an example of a good one
    (``example`` may be a function, called only here)."""
    example = example() if callable(example) else example
    fix = f"; e.g. {key}={example}" if example else ""
    return ConfigError(f"{key} expects {type_name(tp)}, got {_short_repr(value)} "
                       f"({type(value).__name__}){fix}")


def coerce(value: Any, tp: Any, key: str, *, example: str | Callable[[], str] = "") -> Any:
    """Return `value` checked against the annotation `tp` (an int is fine for a float, and becomes one).

    Text from YAML files and the command line is typed by OmegaConf before it gets here
    (`verl.config.omega`); a Python value must already have the right type. `key` is the full dotted
    key, used in errors. Raises ConfigError naming the key, the expected type and the value.
    """
    if tp is Any:
        return value
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return _coerce_union(value, tp, key, example)
    if origin is Literal:
        if any(value == c and type(value) is type(c) for c in get_args(tp)):
            return value
        allowed = ", ".join(repr(c) for c in get_args(tp))
        close = difflib.get_close_matches(str(value), [str(c) for c in get_args(tp)], n=1, cutoff=0.6)
        hint = f"; did you mean {key}={close[0]}?" if close else ""
        raise ConfigError(f"{key}={_short_repr(value)} is not allowed; choose one of {allowed}{hint}")
    if tp is list or origin is list:
        if not isinstance(value, (list, tuple)):
            raise mismatch(value, tp, key, example)
        (elem,) = get_args(tp) or (Any,)
        return [coerce(v, elem, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is dict or origin is dict:
        if not isinstance(value, Mapping):
            raise mismatch(value, tp, key, example)
        args = get_args(tp)
        if args:
            return {k: coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
        return copy.deepcopy(dict(value))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, bool):
        raise mismatch(value, tp, key, example)
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise mismatch(value, tp, key, example)


def _coerce_union(value, tp, key, example):
    members = get_args(tp)
    if value is None and NoneType in members:
        return None
    choices = [m for m in members if m is not NoneType]
    if len(choices) == 1 and get_origin(choices[0]) is Literal:  # `Literal[...] | None`: the choices' error
        return coerce(value, choices[0], key, example=example)
    # A value that already has one of the member types keeps it (an int stays an int in
    # `int | float`); otherwise the first member that accepts it wins.
    for member in choices:
        if _already(value, member):
            return coerce(value, member, key)
    for member in choices:
        try:
            return coerce(value, member, key)
        except ConfigError:
            continue
    raise mismatch(value, tp, key, example)


def _already(value: Any, tp: Any) -> bool:
    origin = get_origin(tp) or tp
    if origin is Literal:
        return value in get_args(tp)
    if origin is float:
        return isinstance(value, float)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        return isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, Mapping)
    return isinstance(origin, type) and isinstance(value, origin)
