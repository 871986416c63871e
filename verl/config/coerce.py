"""The config's one type system: values checked against a field's annotation, with errors that name the key.

Two modes, one set of annotations:

* `coerce` checks a value strictly: what Python code passes (``TrainerConfig(...)``, attribute
  assignment) must already have the field's type (an int is fine for a float, numpy's numbers for
  numbers, a ``pathlib.Path`` for text), so ``'1e-4'`` is
  refused for a float. Every value, from any path, goes through it when a section is built.
* `from_text` / `text_value` type text first: what a value read from a YAML file or the command line
  becomes for the field (``'1e-4'`` a float, ``yes`` a bool, ``2.5`` the str ``'2.5'``), as OmegaConf's
  typed nodes did. Only scalar annotations (``int``, ``float``, ``bool``, ``str``, a ``Literal`` of
  strings, each optionally ``| None``) and lists and dicts of them are typed; unions of several
  types, ``Any`` and untyped lists and dicts take text as given. The text path
  (`verl.config.omega`) calls it when a value is set and again once interpolations are resolved;
  then `coerce` checks the result (choices, ranges and unions are checked there, not here).

Section-typed fields (ConfigNode subclasses) are handled by `verl.config.node`, not here.
"""

from __future__ import annotations

import copy
import numbers
import os
import types
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union, get_args, get_origin

import numpy as np

from verl.errors import ConfigError, closest_name

NoneType = type(None)
_SCALARS = (int, float, bool, str)
# A bool field's words (any case), as YAML 1.1 and OmegaConf spell them; 1 and 0 as text too.
_BOOL_WORDS = {**dict.fromkeys(("true", "yes", "y", "on", "1"), True),
               **dict.fromkeys(("false", "no", "n", "off", "0"), False)}


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
    inner, _ = _optional(tp)
    return inner is dict or get_origin(inner) is dict


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

    A value must already have the right type: text from YAML files and the command line is typed by
    `from_text` before it gets here. `key` is the full dotted key, used in errors. Raises ConfigError
    naming the key, the expected type and the value.
    """
    if type(value).__module__.startswith("omegaconf"):
        value = _plain(value)
    elif type(value).__module__ == "torch" and type(value).__name__ in ("dtype", "device") and (
            scalar_type(tp) is str or str in get_args(tp)):  # a dtype or device setting: the text of its name
        value = str(value).removeprefix("torch.")  # torch.bfloat16 -> "bfloat16", torch.device("cuda", 0) -> "cuda:0"
    if tp is Any:
        return value
    origin = get_origin(tp)
    if isinstance(value, os.PathLike) and (tp is str or str in get_args(tp)):
        return os.fspath(value)  # a pathlib.Path for a path setting: the text it stands for
    if origin in (Union, types.UnionType):
        return _coerce_union(value, tp, key, example)
    if origin is Literal:
        if any(value == c and type(value) is type(c) for c in get_args(tp)):
            return value
        allowed = ", ".join(repr(c) for c in get_args(tp))
        close = closest_name(value, get_args(tp), cutoff=0.6)
        hint = f"; did you mean {key}={close}?" if close else ""
        raise ConfigError(f"{key}={_short_repr(value)} is not allowed; choose one of {allowed}{hint}")
    if list in (tp, origin) or dict in (tp, origin):
        if not isinstance(value, Mapping if dict in (tp, origin) else (list, tuple)):
            raise mismatch(value, tp, key, example)
        return copy.deepcopy(dict(value)) if tp is dict else each(value, tp, key, lambda v, t, k, _: coerce(v, t, k))
    if tp is float and isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return float(value)  # an int, or numpy's float32 / int64 (a value computed with numpy)
    if tp is int and isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return int(value)  # numpy's int64 (`len(df) // 4`, `np.ceil(...).astype(int)`)
    if tp is bool and isinstance(value, np.bool_):
        return bool(value)
    # An int field's ints were taken above: what is left for it (a bool) is refused.
    if isinstance(tp, type) and tp is not int and isinstance(value, tp):
        return value
    raise mismatch(value, tp, key, example)


def _plain(value: Any) -> Any:
    """An OmegaConf ``ListConfig`` / ``DictConfig`` (a section of a config loaded with OmegaConf, handed to
    ``TrainerConfig(**cfg)``) as the plain list / dict it holds, interpolations resolved. Before, a list in one
    was refused as "expects str | list[str], got ['console'] (ListConfig)", and a dict setting kept the
    OmegaConf nodes inside it."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


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
    """Whether ``value`` already has the type of union member ``tp`` (a tuple counts as a list, any mapping as
    a dict; a bool is not an int)."""
    origin = get_origin(tp) or tp
    if origin is Literal:
        return value in get_args(tp)
    if origin is int and isinstance(value, bool):
        return False
    return isinstance(origin, type) and isinstance(value, {list: (list, tuple), dict: Mapping}.get(origin, origin))


# ------------------------------------------------------------------ text
class TextError(ValueError):
    """A value read as text that its field's type does not take. The message says why, in the words
    OmegaConf's nodes used, which the errors of unresolvable interpolations have always quoted."""


def is_interpolation(value: Any) -> bool:
    """Whether `value` is text holding an OmegaConf interpolation, ``${...}``: typed once resolved."""
    return isinstance(value, str) and "${" in value


def _optional(tp: Any) -> tuple[Any, bool]:
    """(`tp` without None, whether None is allowed); a union of several other types stays `tp`."""
    if get_origin(tp) not in (Union, types.UnionType) or NoneType not in get_args(tp):
        return tp, False
    rest = [a for a in get_args(tp) if a is not NoneType]
    return (rest[0] if len(rest) == 1 else tp), True


def scalar_type(tp: Any) -> type | None:
    """`int`, `float`, `bool` or `str` for a scalar annotation, optionally `| None` (a `Literal` of
    strings is `str`: its choices are checked later, by `coerce`); None for any other annotation."""
    inner, _ = _optional(tp)
    if inner in _SCALARS:
        return inner
    if get_origin(inner) is Literal and all(isinstance(c, str) for c in get_args(inner)):
        return str
    return None


def element_type(tp: Any) -> Any:
    """The annotation of the elements of a list (``list[float] | None`` -> ``float``) or of the values
    of a dict (``dict[str, int]`` -> ``int``); `Any` for any other annotation."""
    inner, _ = _optional(tp)
    args = get_args(inner)
    if get_origin(inner) is list and len(args) == 1:
        return args[0]
    if get_origin(inner) is dict and len(args) == 2:
        return args[1]
    return Any


def each(value: list | tuple | Mapping, tp: Any, key: str, fn: Callable[[Any, Any, str, Any], Any]) -> list | dict:
    """A new list or dict of ``fn(element, its annotation, its key, its index or name)`` over the elements
    of ``value``: the one walk of a value's elements (`coerce`, `text_value`, the text path's resolved values)."""
    elem = element_type(tp)
    if isinstance(value, Mapping):
        return {k: fn(v, elem, f"{key}.{k}", k) for k, v in value.items()}
    return [fn(v, elem, f"{key}[{i}]", i) for i, v in enumerate(value)]


def from_text(value: Any, tp: Any, key: str, example: str | Callable[[], str] = "") -> Any:
    """`value`, read from a YAML file or the command line, typed for the annotation `tp` (see
    `text_value`). Raises the wrong-type error (`mismatch`) for the whole value at `key`, so that it
    names the override or YAML key that set it."""
    if isinstance(value, str) and value == "None" and NoneType in get_args(tp):
        # Python's spelling: YAML and Hydra read it as text, so a path became a file called 'None'.
        raise ConfigError(f"{key}=None is the text 'None' here, not an empty value; write {key}=null "
                          f"(YAML's None), or leave the key out for its default")
    try:
        return text_value(value, tp)
    except TextError:
        raise mismatch(value, tp, key, example) from None


def text_value(value: Any, tp: Any) -> Any:
    """What a value read as text becomes for the annotation `tp`: a scalar annotation converts it to
    an `int`, `float`, `bool` or `str` (None only where the annotation allows it), a list or dict of
    scalars converts each element; other annotations, and values that are not a list or dict for a
    list or dict annotation, are left as given (`coerce` judges them). Raises TextError."""
    inner, optional = _optional(tp)
    scalar = scalar_type(tp)
    if scalar is not None:
        if value is None and not optional:
            raise TextError(f"Incompatible value 'None' for field of type '{scalar.__name__}'")
        if value is None or is_interpolation(value):  # an interpolation stays text until it is resolved
            return value
        return _TEXT_TO[scalar](value)
    if isinstance(value, {list: (list, tuple), dict: Mapping}.get(get_origin(inner), ())):
        # A nested list or dict is left for `coerce` to judge.
        return each(value, tp, "", lambda v, t, *_: v if isinstance(v, (list, tuple, Mapping)) else text_value(v, t))
    return value


def _text_int(value: Any) -> int:
    """An int, or text of one (``'3'``, ``'1_000'``); a float (even ``2.0``) and a bool are refused."""
    if type(value) in (int, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise TextError(f"Value '{value}' of type '{type(value).__name__}' could not be converted to Integer")


def _text_float(value: Any) -> float:
    """A number, or text of one (``'1e-4'``, ``'inf'``, ``'1_000'``), as a float; a bool is refused."""
    if type(value) in (int, float, str):
        try:
            return float(value)
        except (ValueError, OverflowError):
            pass
    raise TextError(f"Value '{value}' of type '{type(value).__name__}' could not be converted to Float")


def _text_bool(value: Any) -> bool:
    """A bool, 1 or 0, or one of the words true/false, yes/no, y/n, on/off, 1/0 (any case)."""
    if type(value) is bool:
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _BOOL_WORDS:
        return _BOOL_WORDS[value.lower()]
    raise TextError(f"Value '{value}' is not a valid bool (type {type(value).__name__})")


def _text_str(value: Any) -> str:
    """Any scalar as its text (``2.5`` -> ``'2.5'``); a list or dict is refused."""
    if isinstance(value, (list, tuple, Mapping, bytes)):
        raise TextError(f"Cannot convert '{type(value).__name__}' to string: '{value}'")
    return str(value)


_TEXT_TO = {int: _text_int, float: _text_float, bool: _text_bool, str: _text_str}
