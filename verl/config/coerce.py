"""Checking and converting leaf values against a field's type annotation.

Two modes. Values from Python (`strict`) must already have the right type, except that an int
is fine for a float. Values parsed from text (command line, YAML files) are converted where the
intent is clear: "1e-4" -> 1e-4 for a float, "true" -> True for a bool, 123 -> "123" for a str.
Section-typed fields (ConfigNode subclasses) are handled by `verl.config.node`, not here.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Mapping
from typing import Any, Literal, Union, get_args, get_origin

from verl.config.errors import ConfigError

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


def mismatch(value: Any, tp: Any, key: str, example: str = "") -> ConfigError:
    """The wrong-type error: key, expected type, the value given, and an example of a good one."""
    fix = f"; e.g. {key}={example}" if example else ""
    return ConfigError(f"{key} expects {type_name(tp)}, got {_short_repr(value)} "
                       f"({type(value).__name__}){fix}")


def coerce(value: Any, tp: Any, key: str, *, text: bool = False, raw: str | None = None,
           example: str = "") -> Any:
    """Return `value` checked against (and, in text mode, converted to) the annotation `tp`.

    `key` is the full dotted key, used in errors. `raw` is the unparsed command-line text, which
    a str field takes verbatim (so `name=true` is "true" and `tag=007` is "007").
    Raises ConfigError naming the key, the expected type and the value.
    """
    if tp is Any:
        return value
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return _coerce_union(value, tp, key, text, raw, example)
    if origin is Literal:
        return _coerce_literal(value, tp, key, text, raw)
    if tp is list or origin is list:
        if not isinstance(value, (list, tuple)):
            raise mismatch(value, tp, key, example)
        (elem,) = get_args(tp) or (Any,)
        return [coerce(v, elem, f"{key}[{i}]", text=text) for i, v in enumerate(value)]
    if tp is dict or origin is dict:
        if not isinstance(value, Mapping):
            raise mismatch(value, tp, key, example)
        args = get_args(tp)
        if args:
            return {k: coerce(v, args[1], f"{key}.{k}", text=text) for k, v in value.items()}
        return copy.deepcopy(dict(value))
    if tp is bool:
        return _coerce_bool(value, key, text, example)
    if tp is int:
        return _coerce_int(value, key, text, example)
    if tp is float:
        return _coerce_float(value, key, text, example)
    if tp is str:
        return _coerce_str(value, key, text, raw, example)
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise mismatch(value, tp, key, example)


def _coerce_union(value, tp, key, text, raw, example):
    members = get_args(tp)
    if value is None and NoneType in members:
        return None
    choices = [m for m in members if m is not NoneType]
    # A value that already has one of the member types keeps it (a str stays a str in
    # `str | list[str]`); otherwise the first member that accepts it wins.
    for member in choices:
        if _already(value, member):
            return coerce(value, member, key, text=text, raw=raw)
    for member in choices:
        try:
            return coerce(value, member, key, text=text, raw=raw)
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


def _coerce_literal(value, tp, key, text, raw):
    choices = get_args(tp)
    if any(value == c and type(value) is type(c) for c in choices):
        return value
    if text and not isinstance(value, str) and raw is not None and raw.strip() in choices:
        return raw.strip()
    allowed = ", ".join(repr(c) for c in choices)
    raise ConfigError(f"{key}={_short_repr(value)} is not allowed; choose one of {allowed}")


def _coerce_bool(value, key, text, example):
    if isinstance(value, bool):
        return value
    if text and isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise mismatch(value, bool, key, example or "true")


def _coerce_int(value, key, text, example):
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if text and isinstance(value, float) and value.is_integer():
        return int(value)
    if text and isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise mismatch(value, int, key, example)


def _coerce_float(value, key, text, example):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if text and isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise mismatch(value, float, key, example)


def _coerce_str(value, key, text, raw, example):
    if isinstance(value, str):
        return value
    if text and raw is not None:
        return raw.strip()
    if text and isinstance(value, bool):
        return "true" if value else "false"
    if text and isinstance(value, (int, float)):
        return str(value)
    raise mismatch(value, str, key, example)
