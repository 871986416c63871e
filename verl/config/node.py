"""`ConfigNode`: typed, documented, validated config sections built on dataclasses.

A section is a `@dataclass` subclass of `ConfigNode` whose fields are declared with `option()`
(a leaf: default, help text, optional alias names) or `section()` (a nested section). Every
assignment is checked against the annotation, at construction and afterwards, and an unknown
key fails with a did-you-mean hint. Each node knows its parent, so errors name the full dotted
key (`actor_rollout_ref.actor.optim.lr`) even when raised deep inside a nested dict.

A node has exactly one parent: assigning a node that already sits in a tree stores a copy,
assigning a free one adopts it.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import logging
import os
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from verl.config import omega
from verl.config.coerce import coerce, is_dict_type, mismatch
from verl.config.key_errors import unknown_key_error
from verl.config.omega import format_flow
from verl.config.overrides import backend_first, group_choice, is_hydra_setting, parse_override, split_config_file
from verl.errors import ConfigError

MISSING = dataclasses.MISSING
logger = logging.getLogger("verl.config")


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


def section(default: type[ConfigNode] | ConfigNode, *, help: str) -> Any:
    """Declare a nested section; `default` is its class, or an instance whose values differ."""
    factory = default.copy if isinstance(default, ConfigNode) else default
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
    node_type: type[ConfigNode] | None  # set when the field is a nested section
    default: Any  # the default value, or a fresh one for factory defaults
    choices: tuple[str, ...] | None = None
    bounds: str | None = None


@functools.cache
def field_specs(cls: type[ConfigNode]) -> dict[str, FieldSpec]:
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
        node_type = tp if isinstance(tp, type) and issubclass(tp, ConfigNode) else None
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        specs[f.name] = FieldSpec(f.name, tp, help_text, f.metadata.get("aliases", ()), node_type, default,
                                  f.metadata.get("choices"), f.metadata.get("bounds"))
    return specs


@functools.cache
def alias_map(cls: type[ConfigNode]) -> dict[str, str]:
    """Every accepted name (canonical and alias) -> canonical name."""
    names = {}
    for spec in field_specs(cls).values():
        for name in (spec.name, *spec.aliases):
            if name in names:
                raise TypeError(f"{cls.__name__}: '{name}' names two fields")
            names[name] = spec.name
    return names


@functools.cache
def dotted_keys(cls: type[ConfigNode], prefix: str = "") -> tuple[str, ...]:
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


def raw_value(node: ConfigNode, name: str) -> Any:
    """The stored value of field ``name``: None for a linked field that follows another key."""
    return object.__getattribute__(node, name)


def _follow_link(self, name: str) -> Any:
    value = object.__getattribute__(self, name)
    if value is None and name in object.__getattribute__(self, "_links"):
        link, fallback = self._links[name]
        root = self._root()
        if root is self:
            return fallback
        try:
            return root.get(link)
        except ConfigError:  # a tree without that key
            return fallback
    return value


class _NodeMeta(type):
    # Sections with linked fields (see `option(link=...)`) read them through `_follow_link`.
    def __new__(mcs, name, bases, namespace):
        links = {}
        for base in bases:
            links.update(getattr(base, "_links", {}))
        for key, value in namespace.items():
            if isinstance(value, dataclasses.Field) and "link" in value.metadata:
                links[key] = (value.metadata["link"], value.metadata["fallback"])
        if links:
            namespace["_links"] = links
            namespace["__getattribute__"] = _follow_link
        return super().__new__(mcs, name, bases, namespace)

    # Construction goes through `_build`, which resolves aliases and rejects unknown keys with
    # a hint before the dataclass __init__ (which would only say "unexpected keyword") runs.
    def __call__(cls, *args, **kwargs):
        if args:
            raise ConfigError(f"{cls.__name__} takes keyword arguments only, e.g. {cls.__name__}(key=value)")
        return cls._build(kwargs, parent=None, key=None)


class ConfigNode(metaclass=_NodeMeta):
    """Base class of config sections: validated attributes, dict/YAML/override round-trips."""

    _parent: ConfigNode | None = None
    _key: str | None = None

    # ---------------------------------------------------------------- construction
    @classmethod
    def _build(cls, data: Mapping, *, parent: ConfigNode | None, key: str | None):
        node = cls.__new__(cls)
        object.__setattr__(node, "_parent", parent)
        object.__setattr__(node, "_key", key)
        kwargs, given = {}, {}
        for name, value in data.items():
            spec = node._spec(name)
            if spec.name in kwargs:
                raise ConfigError(f"{node._path(given[spec.name])} and {node._path(name)} name the same "
                                  f"key; give only one of them")
            given[spec.name] = name
            kwargs[spec.name] = node._check(spec, value)
        node.__init__(**kwargs)
        return node

    @classmethod
    def from_dict(cls, data: Mapping, base: ConfigNode | None = None):
        """Build from nested dicts (Python values); with `base`, merge `data` into a copy of it."""
        if base is None:
            return cls._build(data, parent=None, key=None)
        cfg = base.copy()
        cfg.update(data)
        return cfg

    @classmethod
    def from_yaml(cls, source: str | os.PathLike, base: ConfigNode | None = None):
        """Build from a YAML file path or YAML text; with `base`, merge into a copy of it."""
        return cls._from_text(base, source, [])

    @classmethod
    def from_overrides(cls, args: Iterable[str], base: ConfigNode | None = None):
        """Build from `a.b.c=value` strings, starting from `base` (copied) or the defaults."""
        return cls._from_text(base, None, list(args))

    @classmethod
    def from_cli(cls, args: Iterable[str], base: ConfigNode | None = None):
        """Command-line arguments: an optional `--config-file PATH` (YAML merged into `base` or the
        defaults), then `a.b.c=value` overrides applied in order."""
        path, overrides = split_config_file(list(args))
        return cls._from_text(base, path, overrides)

    @classmethod
    def _from_text(cls, base: ConfigNode | None, yaml_source, args: list[str]):
        """YAML and overrides applied on OmegaConf (`verl.config.omega`): typed, checked against the
        schema, ``${...}`` resolved last against the final values; then back to the dataclasses."""
        tree = omega.typed_tree(base if base is not None else cls())
        if yaml_source is not None:
            omega.merge_mapping(tree, cls, omega.read_yaml(yaml_source))
        overrides = [parse_override(arg) for arg in args]
        backend_first(overrides)
        defaults = None
        for override in overrides:
            if override.package is not None:
                group_choice(override)
            elif is_hydra_setting(override):
                logger.warning("%s: a setting of Hydra itself, which does not run here; ignored (config files "
                               "are given with --config-file, or --config-path/--config-name)", override.key)
            else:
                if override.op == "delete" and defaults is None:
                    defaults = omega.typed_tree(cls())
                omega.apply(tree, cls, override, defaults)
        return cls._build(omega.resolved(tree), parent=None, key=None)

    # ---------------------------------------------------------------- attribute access
    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        spec = self._spec(name)
        object.__setattr__(self, spec.name, self._check(spec, value))

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: aliases, and unknown names.
        if name.startswith("_"):
            raise AttributeError(name)
        canonical = alias_map(type(self)).get(name)
        if canonical is not None and canonical != name:
            return getattr(self, canonical)
        raise AttributeError(str(self._unknown(name, name)))

    def _path(self, name: str | None = None) -> str:
        parts = [name] if name else []
        node = self
        while node._parent is not None:
            parts.append(node._key)
            node = node._parent
        return ".".join(reversed(parts))

    def _root(self) -> ConfigNode:
        node = self
        while node._parent is not None:
            node = node._parent
        return node

    def _unknown(self, name: str, tail: str, note: str = "") -> ConfigError:
        root = self._root()
        return unknown_key_error(self._path(tail), self._path(), list(alias_map(type(self))),
                                 dotted_keys(type(root)), note)

    def _spec(self, name: Any, tail: str | None = None, note: str = "") -> FieldSpec:
        canonical = alias_map(type(self)).get(name) if isinstance(name, str) else None
        if canonical is None:
            raise self._unknown(str(name), tail or str(name), note)
        return field_specs(type(self))[canonical]

    def _check(self, spec: FieldSpec, value: Any) -> Any:
        """`value` validated for field `spec`; sections are built from dicts or adopted."""
        if spec.node_type is None:
            value = coerce(value, spec.type, self._path(spec.name), example=lambda: example_of(spec))
            if spec.choices is not None or spec.bounds is not None:
                _check_domain(spec, value, self._path(spec.name))
            return value
        if isinstance(value, spec.node_type):
            if value._parent is not None and (value._parent is not self or value._key != spec.name):
                value = value.copy()
            object.__setattr__(value, "_parent", self)
            object.__setattr__(value, "_key", spec.name)
            return value
        if isinstance(value, Mapping):
            return spec.node_type._build(value, parent=self, key=spec.name)
        raise mismatch(value, spec.node_type, self._path(spec.name), "{key: value, ...}")

    # ---------------------------------------------------------------- dotted access
    def get(self, key: str, default: Any = MISSING) -> Any:
        """The value at a dotted key (`"actor_rollout_ref.actor.optim.lr"`); aliases accepted. With
        ``default``, a key that is not there gives it back (as ``DictConfig.get`` does, for code
        written against verl's OmegaConf sections); without, it is an error with a did-you-mean."""
        if default is not MISSING:
            try:
                return self.get(key)
            except ConfigError:
                return default
        value: Any = self
        parts = key.split(".")
        for i, part in enumerate(parts):
            if isinstance(value, ConfigNode):
                value = getattr(value, value._spec(part, ".".join(parts[i:])).name)
            elif isinstance(value, dict) and part in value:
                value = value[part]
            else:
                where = ".".join(parts[:i])
                raise ConfigError(f"{self._path(key)} not found: {self._path(where)} has no key '{part}'")
        return value

    def set(self, key: str, value: Any) -> None:
        """Validated assignment at a dotted key; below a free-form dict field, keys are added."""
        parts = key.split(".")
        node = self
        for i, part in enumerate(parts[:-1]):
            spec = node._spec(part, ".".join(parts[i:]))
            child = getattr(node, spec.name)
            if isinstance(child, ConfigNode):
                node = child
                continue
            if is_dict_type(spec.type):
                if child is None:
                    child = {}
                    object.__setattr__(node, spec.name, child)
                _set_in_dict(child, parts[i + 1:], value)
                return
            raise ConfigError(f"{node._path(spec.name)} is a value, not a section, so it has no key "
                              f"'{parts[i + 1]}'; set it with {node._path(spec.name)}=...")
        spec = node._spec(parts[-1], parts[-1])
        object.__setattr__(node, spec.name, node._check(spec, value))

    def update(self, data: Mapping) -> None:
        """Deep-merge nested dicts: given keys change, the rest keep their current values."""
        for name, value in data.items():
            spec = self._spec(name)
            current = getattr(self, spec.name)
            if isinstance(current, ConfigNode) and isinstance(value, Mapping):
                current.update(value)
            else:
                object.__setattr__(self, spec.name, self._check(spec, value))

    # ---------------------------------------------------------------- overrides
    def to_overrides(self) -> list[str]:
        """`a.b.c=value` strings for every value that differs from a fresh default instance."""
        defaults = _flatten(type(self)())
        out = []
        for key, value in _flatten(self).items():
            default = defaults.get(key, MISSING)
            if type(value) is not type(default) or value != default:
                out.append(f"{key}={format_flow(value)}")
        return out

    # ---------------------------------------------------------------- conversions
    def to_dict(self) -> dict[str, Any]:
        """Nested plain dicts under canonical names (no aliases); values are copies."""
        out = {}
        for name in field_specs(type(self)):
            value = raw_value(self, name)
            out[name] = value.to_dict() if isinstance(value, ConfigNode) else copy.deepcopy(value)
        return out

    def to_yaml(self) -> str:
        """Block YAML of `to_dict()`; `from_yaml` reads it back to an equal config."""
        return omega.to_yaml(self.to_dict())

    def copy(self):
        """A deep, detached copy (no parent)."""
        return type(self)._build(self.to_dict(), parent=None, key=None)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    # ---------------------------------------------------------------- documentation
    @classmethod
    def describe(cls, key: str) -> str:
        """The help text of a dotted key (aliases accepted), e.g. `describe("data.batch_size")`."""
        node_cls, parts = cls, key.split(".")
        for i, part in enumerate(parts):
            canonical = alias_map(node_cls).get(part)
            if canonical is None:
                prefix = ".".join(parts[:i])
                raise unknown_key_error(key, prefix, list(alias_map(node_cls)), dotted_keys(cls))
            spec = field_specs(node_cls)[canonical]
            if i == len(parts) - 1:
                return spec.help
            if spec.node_type is None:
                raise ConfigError(f"{'.'.join(parts[:i + 1])} is a value, not a section; it has no key '{parts[i + 1]}'")
            node_cls = spec.node_type
        raise AssertionError("unreachable")

    @classmethod
    def format_help(cls) -> str:
        """A `--help`-style listing: every dotted key with its type, default and help text."""
        from verl.config.render import render_help  # render builds on this module

        return render_help(cls)


def _set_in_dict(container: dict, parts: list[str], value: Any) -> None:
    for i, part in enumerate(parts[:-1]):
        if not isinstance(container.get(part), dict):
            container[part] = {}
        container = container[part]
    container[parts[-1]] = copy.deepcopy(value)


def _flatten(node: ConfigNode, prefix: str = "") -> dict[str, Any]:
    """Leaf values by dotted key; a free-form dict field counts as one leaf."""
    out = {}
    for name in field_specs(type(node)):
        value = raw_value(node, name)
        if isinstance(value, ConfigNode):
            out.update(_flatten(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out
