"""`ConfigNode`: typed, documented, validated config sections built on dataclasses.

A section is a `@dataclass` subclass of `ConfigNode` whose fields are declared with `option()`
(a leaf: default, help text, optional alias names) or `section()` (a nested section). Every
assignment is checked against the annotation, at construction and afterwards, and an unknown
key fails with a did-you-mean hint. The check is strict (`verl.config.coerce`: ``'1e-4'`` is not
a float); text from YAML files and the command line (`from_yaml`, `from_overrides`, `from_cli`)
is typed for its field on the text path (`verl.config.omega`) before it gets here. Each node
knows its parent, so errors name the full dotted key (`actor_rollout_ref.actor.optim.lr`) even
when raised deep inside a nested dict.

A node has exactly one parent: assigning a node that already sits in a tree stores a copy,
assigning a free one adopts it.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from verl.config import omega
from verl.config.coerce import coerce, mismatch
from verl.config.fields import (MISSING, FieldSpec, _check_domain, alias_map, dotted_keys, example_of,  # noqa: F401
                                field_specs, links, option, raw_value, section, stored_name, walk)
from verl.config.key_errors import unknown_key_error
from verl.config.render import render_help
from verl.config.overrides import backend_first, is_hydra_setting, parse_override, split_config_file
from verl.config.yaml_text import format_flow, read_yaml, to_yaml
from verl.errors import ConfigError

logger = logging.getLogger("verl.config")


def _override_list(args: Iterable[str]) -> list[str]:
    """The overrides as a list; one string of them all (a command line pasted in) is refused with its split,
    not read letter by letter ("override 'a' has no '='")."""
    if isinstance(args, str):
        import shlex

        raise ConfigError(f"the overrides are a list of 'key=value' strings, one per item, got one string "
                          f"{args!r:.120}; write {shlex.split(args)!r:.200} (shlex.split splits a command line)")
    return list(args)


class _NodeMeta(type):
    # Construction goes through `_build`, which resolves aliases and rejects unknown keys with
    # a hint before the dataclass __init__ (which would only say "unexpected keyword") runs.
    def __call__(cls, *args, **kwargs):
        if args:
            raise ConfigError(f"{cls.__name__} takes keyword arguments only, e.g. {cls.__name__}(key=value)")
        return cls._build(kwargs, parent=None, key=None)


class ConfigNode(metaclass=_NodeMeta):
    """Base class of config sections: validated attributes, dict/YAML/override round-trips."""

    __config_section__ = True  # what verl.config.fields.is_section_type looks for
    _parent: ConfigNode | None = None
    _key: str | None = None

    # ---------------------------------------------------------------- construction
    @classmethod
    def _build(cls, data: Mapping, *, parent: ConfigNode | None, key: str | None):
        """The defaults with ``data`` merged in (`update`): construction is one merge, so a nested section
        given as a dict keeps its own defaults for the keys the dict leaves out."""
        node = cls.__new__(cls)
        object.__setattr__(node, "_parent", parent)
        object.__setattr__(node, "_key", key)
        node.__init__()
        node.update(data)
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
        return cls._from_text(base, None, _override_list(args))

    @classmethod
    def from_cli(cls, args: Iterable[str], base: ConfigNode | None = None):
        """Command-line arguments: an optional `--config-file PATH` (YAML merged into `base` or the
        defaults), then `a.b.c=value` overrides applied in order."""
        path, overrides = split_config_file(_override_list(args))
        return cls._from_text(base, path, overrides)

    @classmethod
    def _from_text(cls, base: ConfigNode | None, yaml_source, args: list[str]):
        """YAML and overrides applied on OmegaConf (`verl.config.omega`): keys checked against the
        schema and values typed as text (`coerce.from_text`) as they are set, ``${...}`` resolved last
        against the final values; then back to the dataclasses, which check them strictly."""
        tree = (base if base is not None else cls()).to_dict()
        if yaml_source is not None:
            omega.merge_mapping(tree, cls, read_yaml(yaml_source))
        overrides = [parse_override(arg) for arg in args]
        backend_first(overrides)  # also checks each config-group choice (group@package=choice), once
        for override in (o for o in overrides if o.package is None):
            if is_hydra_setting(override):
                logger.warning("%s: a setting of Hydra itself, which does not run here; ignored (config files "
                               "are given with --config-file, or --config-path/--config-name)", override.key)
            else:
                omega.apply(tree, cls, override)
        return cls._build(omega.resolved(tree, cls), parent=None, key=None)

    # ---------------------------------------------------------------- attribute access
    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        spec = self._spec(name)
        self._store(spec.name, self._check(spec, value))

    def _store(self, name: str, value: Any) -> None:
        """Keep a checked value. A linked field (`option(link=...)`) is kept under `stored_name`, so
        that reading it goes through `__getattr__`, which follows the link while it is None."""
        object.__setattr__(self, stored_name(type(self), name), value)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: linked fields, aliases, and unknown names.
        if name.startswith("_"):
            raise AttributeError(name)
        link = links(type(self)).get(name)
        if link is not None:
            # A linked field left at None reads the key it follows in the whole config, or its
            # fallback for a section standing alone or a tree without that key.
            key, fallback = link
            value, root = raw_value(self, name), self._root()
            if value is not None:
                return value
            return fallback if root is self else root.get(key, fallback)
        canonical = alias_map(type(self)).get(name)
        if canonical is not None and canonical != name:
            return getattr(self, canonical)
        raise AttributeError(str(self._unknown(name)))

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

    def _unknown(self, name: str) -> ConfigError:
        """The error of a name this section does not have, with a did-you-mean over the whole tree."""
        if "." in name and self._path(name) in dotted_keys(type(self._root())):
            # A command-line key handed to Python (a flat dict of overrides): said as such, not "did you
            # mean" the very same key.
            first, *rest = name.split(".")
            nested = "".join(f"{part}=dict(" for part in [first, *rest[:-1]]) + f"{rest[-1]}=...{')' * len(rest)}"
            where = f"{type(self).__name__}(...)" if self._parent is None else f"the {self._path()} section"
            return ConfigError(f"'{name}' is a dotted key, the command line's form: in Python nest it, {nested} in "
                               f"{where}, or set it with config.set({self._path(name)!r}, value) or "
                               f"TrainerConfig.from_cli(['{self._path(name)}=...'])")
        return unknown_key_error(self._path(name), self._path(), list(alias_map(type(self))),
                                 dotted_keys(type(self._root())))

    def _spec(self, name: Any) -> FieldSpec:
        """The spec of the field called ``name`` (or one of its aliases)."""
        canonical = alias_map(type(self)).get(name) if isinstance(name, str) else None
        if canonical is None:
            raise self._unknown(str(name))
        return field_specs(type(self))[canonical]

    def _check(self, spec: FieldSpec, value: Any) -> Any:
        """`value` validated for field `spec`; sections are built from dicts or adopted."""
        if spec.node_type is None:
            value = coerce(value, spec.type, self._path(spec.name), example=lambda: example_of(spec))
            if spec.choices is not None or spec.bounds is not None:
                _check_domain(spec, value, self._path(spec.name))
            return value
        # A dict: the field's default section (`section(OptimConfig(lr=1e-5))`) with the dict's keys.
        value, given = (spec.default.copy(), value) if isinstance(value, Mapping) else (value, {})
        if not isinstance(value, spec.node_type):
            raise mismatch(value, spec.node_type, self._path(spec.name), lambda: example_of(spec))
        if value._parent is not None and (value._parent is not self or value._key != spec.name):
            value = value.copy()
        object.__setattr__(value, "_parent", self)
        object.__setattr__(value, "_key", spec.name)
        value.update(given)
        return value

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
        owner, target = self._locate(key)
        value = getattr(owner, target.spec.name)
        for i, part in enumerate(target.tail):
            if not isinstance(value, dict) or part not in value:
                where = ".".join((target.path, *target.tail[:i]))
                raise ConfigError(f"{target.key} not found: {where} has no key '{part}'")
            value = value[part]
        return value

    def set(self, key: str, value: Any) -> None:
        """Validated assignment at a dotted key; below a free-form dict field, keys are added."""
        owner, target = self._locate(key)
        if not target.tail:
            owner._store(target.spec.name, owner._check(target.spec, value))
            return
        container = getattr(owner, target.spec.name)
        if container is None:
            container = {}
            owner._store(target.spec.name, container)
        omega.mapping_at(container, target.tail[:-1])[target.tail[-1]] = copy.deepcopy(value)

    def _locate(self, key: str) -> tuple[ConfigNode, omega.Target]:
        """The section holding dotted ``key`` (below this one) and where the key lands (`omega.locate`,
        the one walk of dotted keys through the schema, from the root so that errors name full keys)."""
        root = self._root()
        target = omega.locate(type(root), self._path(key))
        owner = root
        for part in target.path.split(".")[:-1]:
            owner = getattr(owner, part)
        return owner, target

    def update(self, data: Mapping) -> None:
        """Deep-merge nested dicts: given keys change, the rest keep their current values. Every key is
        looked up (aliases accepted; two spellings of one key are an error) before any value is set."""
        given: dict[str, str] = {}
        specs = []
        for name, value in data.items():
            spec = self._spec(name)
            if spec.name in given:
                raise ConfigError(f"{self._path(given[spec.name])} and {self._path(name)} name the same "
                                  f"key; give only one of them")
            given[spec.name] = name
            specs.append((spec, value))
        for spec, value in specs:
            current = getattr(self, spec.name)
            if isinstance(current, ConfigNode) and isinstance(value, Mapping):
                current.update(value)
            else:
                self._store(spec.name, self._check(spec, value))

    # ---------------------------------------------------------------- overrides
    def to_overrides(self) -> list[str]:
        """`a.b.c=value` strings for every value that differs from a fresh default instance."""
        defaults = _flatten(type(self)())  # the same keys: the same class
        return [f"{key}={format_flow(value)}" for key, value in _flatten(self).items()
                if type(value) is not type(defaults[key]) or value != defaults[key]]

    # ---------------------------------------------------------------- conversions
    def to_dict(self) -> dict[str, Any]:
        """Nested plain dicts under canonical names (no aliases); values are copies."""
        out: dict[str, Any] = {}
        sections = {"": out}  # the dict of each section met so far, by its key
        for entry in walk(self):
            parent, _, name = entry.key.rpartition(".")
            if entry.is_section:
                sections[parent][name] = sections[entry.key] = {}
            else:
                sections[parent][name] = copy.deepcopy(entry.value)
        return out

    def to_yaml(self) -> str:
        """Block YAML of `to_dict()`; `from_yaml` reads it back to an equal config."""
        return to_yaml(self.to_dict())

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
        target = omega.locate(cls, key)
        if target.tail:
            raise omega.not_a_section(target.path, target.tail[0])
        return target.spec.help

    @classmethod
    def format_help(cls) -> str:
        """A `--help`-style listing: every dotted key with its type, default and help text."""
        return render_help(cls)


def _flatten(node: ConfigNode) -> dict[str, Any]:
    """Leaf values by dotted key; a free-form dict field counts as one leaf."""
    return {entry.key: entry.value for entry in walk(node) if not entry.is_section}
