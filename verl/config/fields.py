"""What a config section declares about its fields, and the one walk over them.

A section is a dataclass (a subclass of :class:`~verl.config.node.ConfigNode`) whose fields are
declared with :func:`option` (a leaf: default, help text, aliases, choices, a range) or
:func:`section` (a nested section). :func:`field_specs` reads them back as :class:`FieldSpec`
records; everything that walks the schema (the typed OmegaConf tree, the renderings, the key
listings, the compatibility rules) goes through it. Nothing here builds or checks a config: that
is :mod:`verl.config.node`, which builds on this module.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import typing
from collections.abc import Iterable
from typing import Any

from verl.config.yaml_text import format_flow
from verl.errors import ConfigError

MISSING = dataclasses.MISSING


def is_section_type(tp: Any) -> bool:
    """Whether annotation ``tp`` is a config section class (a ConfigNode subclass)."""
    return isinstance(tp, type) and getattr(tp, "__config_section__", False)


def option(default: Any = MISSING, *, help: str, aliases: Iterable[str] = (), link: str | None = None,
           fallback: Any = None, choices: Iterable[str] | None = None, bounds: str | None = None) -> Any:
    """Declare a leaf field: its default, its help text and other names that mean the same key.

    Mutable defaults (lists, dicts) are copied per instance. ``link`` makes a field that is left
    at None follow another key of the whole config, as verl's ``${oc.select:data.max_prompt_length,512}``
    does: reading it gives that key's current value, or ``fallback`` when the section stands alone.
    ``choices`` (the values a text key takes) and ``bounds`` (a number's range: ``"> 0"``, ``">= 1"``,
    ``"[0, 1]"``, ``"(0, 1]"``) are checked whenever the key is set, and named in its help text.
    """
    notes = []
    if choices is not None:
        choices = tuple(choices)
        notes.append(f"One of: {', '.join(choices)}.")
    if bounds is not None:
        parse_bounds(bounds)  # a malformed range fails where it is declared
        notes.append(f"Range: {bounds}.")
    if notes:
        help = " ".join([help, *notes])
    metadata = {"help": help, "aliases": tuple(aliases), "choices": choices, "bounds": bounds}
    if link is not None:
        if default is not None:
            raise TypeError(f"a linked option defaults to None (it follows {link}), got {default!r}")
        metadata.update(link=link, fallback=fallback)
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=functools.partial(copy.deepcopy, default),
                                 metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(default: type | Any, *, help: str) -> Any:
    """Declare a nested section; `default` is its class, or an instance whose values differ."""
    factory = default if isinstance(default, type) else default.copy
    return dataclasses.field(default_factory=factory, metadata={"help": help, "aliases": ()})


def parse_bounds(text: str) -> tuple[float, bool, float, bool]:
    """``"> 0"`` / ``">= 1"`` / ``"<= 1"`` / ``"[0, 1]"`` / ``"(0, 1]"`` -> (low, low inclusive, high, high inclusive)."""
    text = text.strip()
    for op, inclusive in ((">=", True), (">", False), ("<=", True), ("<", False)):
        if text.startswith(op):
            value = float(text[len(op):])
            return (value, inclusive, float("inf"), False) if op[0] == ">" else (float("-inf"), False, value, inclusive)
    if text[:1] in "[(" and text[-1:] in "])" and "," in text:
        low, high = (float(part) for part in text[1:-1].split(","))
        return low, text[0] == "[", high, text[-1] == "]"
    raise TypeError(f"bounds {text!r}: write '> 0', '>= 1', '<= 1', '[0, 1]' or '(0, 1]'")


def _check_domain(spec: FieldSpec, value: Any, key: str) -> None:
    """A value outside the key's declared choices or range: an error naming both (None passes: it is
    the "not set" of an optional key)."""
    if value is None:
        return
    if spec.choices is not None and value not in spec.choices:
        close = difflib.get_close_matches(str(value), spec.choices, n=1, cutoff=0.6)
        hint = f"; did you mean {key}={close[0]}?" if close else ""
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(spec.choices)}{hint}")
    if spec.bounds is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        low, low_in, high, high_in = parse_bounds(spec.bounds)
        above = value >= low if low_in else value > low
        below = value <= high if high_in else value < high
        if not (above and below):  # NaN fails both
            raise ConfigError(f"{key}={value} must be {_describe_bounds(spec.bounds)}")


def _describe_bounds(text: str) -> str:
    low, low_in, high, high_in = parse_bounds(text)
    if high == float("inf"):
        return f"{'>=' if low_in else '>'} {low:g}"
    if low == float("-inf"):
        return f"{'<=' if high_in else '<'} {high:g}"
    return f"in {text}"


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """What the mechanism knows about one field of a section."""

    name: str
    type: Any
    help: str
    aliases: tuple[str, ...]
    node_type: type | None  # set when the field is a nested section
    default: Any  # the default value, or a fresh one for factory defaults
    choices: tuple[str, ...] | None = None
    bounds: str | None = None


@functools.cache
def field_specs(cls: type) -> dict[str, FieldSpec]:
    """The fields of a section class by canonical name, in declaration order."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} must be decorated with @dataclass")
    hints = typing.get_type_hints(cls)
    specs = {}
    for f in dataclasses.fields(cls):
        help_text = f.metadata.get("help", "")
        if not help_text:
            raise TypeError(f"{cls.__name__}.{f.name} needs help text: declare it with option(..., help=...)")
        tp = hints[f.name]
        node_type = tp if is_section_type(tp) else None
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        specs[f.name] = FieldSpec(f.name, tp, help_text, f.metadata.get("aliases", ()), node_type, default,
                                  f.metadata.get("choices"), f.metadata.get("bounds"))
    return specs


@functools.cache
def alias_map(cls: type) -> dict[str, str]:
    """Every accepted name (canonical and alias) -> canonical name."""
    names = {}
    for spec in field_specs(cls).values():
        for name in (spec.name, *spec.aliases):
            if name in names:
                raise TypeError(f"{cls.__name__}: '{name}' names two fields")
            names[name] = spec.name
    return names


@functools.cache
def dotted_keys(cls: type, prefix: str = "") -> tuple[str, ...]:
    """Every dotted key of the tree below `cls` (sections, leaves and aliases), in order."""
    keys = []
    for spec in field_specs(cls).values():
        for name in (spec.name, *spec.aliases):
            key = f"{prefix}{name}"
            keys.append(key)
            if spec.node_type is not None:
                keys.extend(dotted_keys(spec.node_type, key + "."))
    return tuple(keys)


def example_of(spec: FieldSpec) -> str:
    """A good value of a leaf for error messages: its default, as typed on the command line."""
    return "" if spec.default is None or spec.node_type else format_flow(spec.default)


def raw_value(node: Any, name: str) -> Any:
    """The stored value of field ``name``: None for a linked field that follows another key."""
    return object.__getattribute__(node, name)
