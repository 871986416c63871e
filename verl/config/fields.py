"""What a config section declares about its fields, and the one walk over them.

A section is a dataclass (a subclass of :class:`~verl.config.node.ConfigNode`) whose fields are
declared with :func:`option` (a leaf: default, help text, aliases, choices, a range) or
:func:`section` (a nested section). :func:`field_specs` reads them back as :class:`FieldSpec`
records; everything that walks the schema (the OmegaConf tree of the text path, the renderings,
the key listings, the compatibility rules) goes through it. Nothing here builds or checks a
config: that is :mod:`verl.config.node`, which builds on this module.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import typing
from collections.abc import Iterable, Iterator
from typing import Any

from verl.config.yaml_text import format_flow
from verl.errors import ConfigError, closest_name

MISSING = dataclasses.MISSING


def is_section_type(tp: Any) -> bool:
    """Whether annotation ``tp`` is a config section class (a ConfigNode subclass)."""
    return isinstance(tp, type) and getattr(tp, "__config_section__", False)


def option(default: Any = MISSING, *, help: str, aliases: Iterable[str] = (), link: str | None = None,
           fallback: Any = None, choices: Iterable[str] | None = None, bounds: str | None = None,
           example: str | None = None) -> Any:
    """Declare a leaf field: its default, its help text and other names that mean the same key.

    Mutable defaults (lists, dicts) are copied per instance. ``link`` makes a field that is left
    at None follow another key of the whole config, as verl's ``${oc.select:data.max_prompt_length,512}``
    does: reading it gives that key's current value, or ``fallback`` when the section stands alone.
    ``choices`` (the values a text key takes) and ``bounds`` (a number's range: ``"> 0"``, ``">= 1"``,
    ``"[0, 1]"``, ``"(0, 1]"``) are checked whenever the key is set, and named in its help text.
    ``example``: what a wrong type's error offers after "e.g. KEY=" (default: the default value).
    """
    notes = []
    if choices is not None:
        choices = tuple(choices)
        notes.append(f"One of: {', '.join(choices)}.")
    if bounds is not None:
        parse_bounds(bounds)  # a malformed range fails where it is declared
        notes.append(f"Range: {bounds}.")
    help = " ".join([help, *notes])
    metadata = {"help": help, "aliases": tuple(aliases), "choices": choices, "bounds": bounds, "example": example}
    if link is not None:
        if default is not None:
            raise TypeError(f"a linked option defaults to None (it follows {link}), got {default!r}")
        metadata.update(link=link, fallback=fallback)
        # A factory, not a default: the class then has no attribute of that name, so reading the
        # field on a section goes through its __getattr__, which follows the link (node.py).
        return dataclasses.field(default_factory=type(None), metadata=metadata)
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=functools.partial(copy.deepcopy, default),
                                 metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(default: type | Any, *, help: str, aliases: Iterable[str] = ()) -> Any:
    """Declare a nested section; `default` is its class, or an instance whose values differ."""
    factory = default if isinstance(default, type) else default.copy
    return dataclasses.field(default_factory=factory, metadata={"help": help, "aliases": tuple(aliases)})


@functools.cache
def parse_bounds(text: str) -> tuple[float, bool, float, bool, str]:
    """``"> 0"`` / ``">= 1"`` / ``"<= 1"`` / ``"[0, 1]"`` / ``"(0, 1]"`` -> (low, low inclusive, high, high
    inclusive, what a value must be: ``">= 1"``, ``"in [0, 1]"``)."""
    text = text.strip()
    for op, inclusive in ((">=", True), (">", False), ("<=", True), ("<", False)):
        if text.startswith(op):
            value = float(text[len(op):])
            wanted = f"{op} {value:g}"
            return (value, inclusive, float("inf"), False, wanted) if op[0] == ">" else \
                (float("-inf"), False, value, inclusive, wanted)
    if text[:1] in "[(" and text[-1:] in "])" and "," in text:
        low, high = (float(part) for part in text[1:-1].split(","))
        return low, text[0] == "[", high, text[-1] == "]", f"in {text}"
    raise TypeError(f"bounds {text!r}: write '> 0', '>= 1', '<= 1', '[0, 1]' or '(0, 1]'")


def _check_domain(spec: FieldSpec, value: Any, key: str) -> None:
    """A value outside the key's declared choices or range: an error naming both (None passes: it is
    the "not set" of an optional key)."""
    if value is None:
        return
    if spec.choices is not None and value not in spec.choices:
        close = closest_name(value, spec.choices, cutoff=0.6)
        hint = f"; did you mean {key}={close}?" if close else ""
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(spec.choices)}{hint}")
    if spec.bounds is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        low, low_in, high, high_in, wanted = parse_bounds(spec.bounds)
        if not ((value >= low if low_in else value > low) and (value <= high if high_in else value < high)):
            raise ConfigError(f"{key}={value} must be {wanted}")  # NaN fails both comparisons


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
    metadata: Any = dataclasses.field(default=None, compare=False)  # the dataclass field's (rules ride on it)


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
                                  f.metadata.get("choices"), f.metadata.get("bounds"), f.metadata)
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


@dataclasses.dataclass(frozen=True)
class Entry:
    """One field met by :func:`walk`: its dotted canonical key, its spec, the section that holds it
    (``owner``) and its stored value (a nested section's node; in a walk over a class, the field's
    default)."""

    key: str
    spec: FieldSpec
    owner: Any
    value: Any

    @property
    def is_section(self) -> bool:
        return self.spec.node_type is not None


def walk(node: Any, prefix: str = "") -> Iterator[Entry]:
    """Every field below ``node`` (a section, or a section class), depth first in declaration
    order: a nested section's own entry, then its fields. The one walk over the schema: the text
    path's tree, the dicts, the renderings, the key listings and the compatibility rules all use it."""
    for name, spec in field_specs(node if isinstance(node, type) else type(node)).items():
        value = spec.default if isinstance(node, type) else raw_value(node, name)
        yield Entry(prefix + name, spec, node, value)
        if spec.node_type is not None:
            yield from walk(spec.node_type if isinstance(node, type) else value, f"{prefix}{name}.")


@functools.cache
def dotted_keys(cls: type) -> tuple[str, ...]:
    """Every dotted key of the tree below `cls` (sections, leaves and aliases, a section's keys under
    each of its names), in order: each spelling of a field, then the keys below that spelling."""
    spellings: dict[str, list[tuple[tuple, str]]] = {"": [((), "")]}
    out = []
    for n, entry in enumerate(walk(cls)):
        mine = spellings.setdefault(entry.key, [])
        for order, spelled in spellings[entry.key.rpartition(".")[0]]:
            for j, name in enumerate((entry.spec.name, *entry.spec.aliases)):
                mine.append((order + ((n, j),), f"{spelled}.{name}" if spelled else name))
        out.extend(mine)
    return tuple(key for _, key in sorted(out))


def example_of(spec: FieldSpec) -> str:
    """A good value for error messages, as typed on the command line: a leaf's default; for a section,
    its first keys with their defaults (``{param_dtype: bf16, reduce_dtype: float32, ...}``); or the
    field's own ``example``."""
    if spec.metadata.get("example"):
        return spec.metadata["example"]
    if spec.node_type is not None:
        fields = list(field_specs(spec.node_type).values())
        shown = [f for f in fields if f.node_type is None and f.default is not None][:3]
        more = ", ..." if len(shown) < len(fields) else ""
        return "{" + ", ".join(f"{f.name}: {format_flow(f.default)}" for f in shown) + more + "}"
    return "" if spec.default is None else format_flow(spec.default)


@functools.cache
def links(cls: type) -> dict[str, tuple[str, Any]]:
    """The linked fields of a section class (`option(link=...)`): name -> (the key it follows, fallback)."""
    return {name: (spec.metadata["link"], spec.metadata["fallback"])
            for name, spec in field_specs(cls).items() if "link" in spec.metadata}


def stored_name(cls: type, name: str) -> str:
    """The instance attribute that holds field ``name``: the name itself, or for a linked field another one."""
    return f"_linked_{name}" if name in links(cls) else name


def raw_value(node: Any, name: str) -> Any:
    """The stored value of field ``name``: None for a linked field that follows another key."""
    return object.__getattribute__(node, stored_name(type(node), name))
