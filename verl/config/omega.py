"""The text path of the config: YAML files and Hydra overrides are applied to a tree of the values
(plain nested dicts), and `${...}` interpolation is resolved by OmegaConf.

    tree = TrainerConfig().to_dict()             # nested dicts of the values
    apply(tree, TrainerConfig, parse_override("actor_rollout_ref.actor.optim.lr=1e-6"))
    TrainerConfig.from_dict(resolved(tree, TrainerConfig))   # back to the dataclasses (choices, rules)

Who does what. The typing of text (``"1e-4"`` for a float, ``yes`` for a bool) is the config's own
(`verl.config.coerce.from_text`, the same annotations that check Python values): a value is typed
when it is set, so that a wrong one is an error at the override or YAML key that set it, and a
value that came from an interpolation is typed once resolved. The tree holds the values while every
file and override is applied (mappings merged into free-form dicts, lists replaced, as OmegaConf's
``update`` does); a ``${...}`` text is checked against OmegaConf's grammar when it is set, and only a
tree that holds one becomes an OmegaConf config, to resolve it (building one for every config was
most of the time of a config build). The schema walk here (`locate`) turns verl's names and aliases into
canonical keys and refuses keys a section does not have, with errors that name the key and the fix
(did-you-mean within the section, the ``+`` form for free-form mappings).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf
from omegaconf._utils import get_value_kind
from omegaconf.errors import OmegaConfBaseException

from verl.config.coerce import (TextError, each, element_type, from_text, is_dict_type, is_interpolation, mismatch,
                                scalar_type, text_value)
from verl.config.fields import alias_map, dotted_keys, example_of, field_specs, walk
from verl.config.key_errors import unknown_key_error
from verl.config.overrides import check_group_choice, is_group_choice
from verl.config.verl_yaml_keys import VERL_KEYS
from verl.errors import ConfigError


# ------------------------------------------------------------------ the tree of values
# The tree is a config's `to_dict()`: nested dicts of copies of its values, which `from_text` types
# as they are set. `_ABSENT` marks a key the tree does not hold (a value there may be None).
_ABSENT = object()


def _select(tree: dict, key: str, default: Any = None) -> Any:
    """The value at dotted ``key`` (the tree itself at ``""``), or ``default`` where the path stops."""
    value: Any = tree
    for part in key.split(".") if key else ():
        if not isinstance(value, dict) or part not in value:
            return default
        value = value[part]
    return value


def _holds(tree: dict, key: str) -> bool:
    """Whether the tree holds dotted ``key``."""
    return _select(tree, key, _ABSENT) is not _ABSENT


def mapping_at(tree: dict, parts: Iterable[str]) -> dict:
    """The mapping at the path ``parts`` below ``tree``; missing or non-mapping ones on the way become mappings."""
    for part in parts:
        if not isinstance(tree.get(part), dict):
            tree[part] = {}
        tree = tree[part]
    return tree


def _put(tree: dict, key: str, value: Any) -> None:
    """``key = value``: a mapping merges into the mapping there (new keys added, nested mappings merged),
    anything else replaces what is there; missing or non-mapping parents become mappings."""
    *parents, last = key.split(".")
    _merge(mapping_at(tree, parents), {last: value})


def _merge(into: dict, data: dict) -> None:
    """OmegaConf's merge of plain data: mappings merge, anything else replaces, and a list meeting a
    mapping (either way, at any depth) is a TypeError."""
    for name, value in data.items():
        current = into.get(name)
        if isinstance(value, dict) and isinstance(current, dict):
            _merge(current, value)
        elif {type(value), type(current)} == {dict, list}:
            raise TypeError(f"cannot merge a {type(value).__name__} into a {type(current).__name__}")
        else:
            into[name] = value


def _leaves(value: Any) -> Iterator[Any]:
    """The values in ``value``, through nested mappings and lists."""
    if isinstance(value, (dict, list)):
        for v in value.values() if isinstance(value, dict) else value:
            yield from _leaves(v)
    else:
        yield value


def _check_grammar(value: Any) -> None:
    """Every ``${...}`` text in ``value`` parses (OmegaConf's grammar; its error otherwise)."""
    for leaf in _leaves(value):
        if is_interpolation(leaf):
            get_value_kind(leaf, strict_interpolation_validation=True)


# ------------------------------------------------------------------ keys through the schema
@dataclass(frozen=True)
class Target:
    """Where a dotted key lands: ``path`` (canonical, up to the schema field), ``spec`` of that
    field, and ``tail``, the parts below it when the field is a free-form mapping."""

    path: str
    spec: Any
    tail: tuple[str, ...]

    @property
    def key(self) -> str:
        return ".".join((self.path, *self.tail))


def locate(cls, key: str, note: str = "") -> Target:
    """Walk ``key`` through the schema of ``cls``: aliases become canonical names; an unknown name is
    an error with a did-you-mean within its section."""
    parts = key.split(".")
    node_cls, canon = cls, []
    for i, part in enumerate(parts):
        canonical = alias_map(node_cls).get(part)
        if canonical is None:
            full = ".".join([*canon, *parts[i:]])
            raise unknown_key_error(full, ".".join(canon), list(alias_map(node_cls)), dotted_keys(cls), note)
        spec = field_specs(node_cls)[canonical]
        canon.append(canonical)
        # The key ends here, or goes on below a free-form mapping: the rest is its tail.
        if i == len(parts) - 1 or (spec.node_type is None and is_dict_type(spec.type)):
            return Target(".".join(canon), spec, tuple(parts[i + 1:]))
        if spec.node_type is None:
            raise not_a_section(".".join(canon), parts[i + 1])
        node_cls = spec.node_type


def not_a_section(path: str, name: str) -> ConfigError:
    """The error of a key below a value (``trainer.total_epochs.x``)."""
    return ConfigError(f"{path} is a value, not a section, so it has no key '{name}'; set it with {path}=...")


# ------------------------------------------------------------------ applying values
def _mismatch(target: Target, value: Any) -> ConfigError:
    """The wrong-type error of ``value`` at ``target`` (a section's annotation is its class)."""
    return mismatch(value, Any if target.tail else target.spec.type, target.key, example_of(target.spec))


def _annotation(target: Target) -> Any:
    """What a value set at ``target`` is typed for: the field's annotation; one key below a dict
    field, that of its values (``dict[str, int]``: int; a free-form ``dict``: any value); deeper, any."""
    if not target.tail:
        return target.spec.type
    return element_type(target.spec.type) if len(target.tail) == 1 else Any


def _str_as_typed(target: Target, value: Any, raw: str | None) -> Any:
    """A str field takes the text as typed (``tag=007`` is "007", ``name=true`` is "true")."""
    if target.tail or scalar_type(target.spec.type) is not str or value is None or isinstance(value, (str, dict, list)):
        return value
    if raw is not None:
        return raw.strip()
    return ("true" if value else "false") if isinstance(value, bool) else value


def _added_before(tree: dict, cls, target: Target) -> bool:
    """Whether ``target`` is an entry of a free-form mapping that an earlier key of this command line or
    file added (an entry of the mapping's defaults, verl's keys of its free-form sections, is not)."""
    return bool(target.tail) and _holds(tree, target.key) and not _holds(cls().to_dict(), target.key)


def _check_free_form(tree: dict, target: Target, add: bool) -> None:
    """Below a free-form mapping a plain ``key=value`` changes a key that is there; ``+`` adds one."""
    container = mapping_at(tree, target.path.split("."))  # a free-form mapping left at null becomes {}
    for i, part in enumerate(target.tail):
        key = ".".join((target.path, *target.tail[:i + 1]))
        if not isinstance(container, dict):
            raise ConfigError(f"{'.'.join((target.path, *target.tail[:i]))} holds {container!r}, not a mapping; "
                              f"it has no key '{part}'")
        if part not in container:
            if not add:
                raise ConfigError(f"{key} is not set yet; add a key below the free-form {target.path} with "
                                  f"+{target.key}=<value>")
            return
        container = container[part]


def set_value(tree: dict, cls, target: Target, value: Any, *, raw: str | None = None,
              add: bool = False) -> None:
    """``target = value``, typed as text for its annotation (`from_text`, `_annotation`); a mapping
    given for a section sets its keys one by one."""
    if target.spec.node_type is not None and not target.tail:
        if isinstance(value, str) and raw is not None and is_group_choice(value):
            check_group_choice(target.key, value)  # engine=fsdp, model=hf_model: Hydra's config-group choice
            return
        if not isinstance(value, dict):
            raise _mismatch(target, value)
        merge_mapping(tree, cls, value, f"{target.key}.")
        return
    if target.tail:
        _check_free_form(tree, target, add)
    example = "" if target.tail else (lambda: example_of(target.spec))
    value = from_text(_str_as_typed(target, value, raw), _annotation(target), target.key, example)
    try:
        _check_grammar(value)
        _put(tree, target.key, value)
    except (OmegaConfBaseException, TypeError) as e:  # TypeError: a list meeting a mapping (`_merge`)
        detail = str(e).strip().splitlines()[0]
        if "interpolation" in detail.lower():
            raise ConfigError(f"{target.key}={value}: {detail}") from None
        raise _mismatch(target, value) from None


def delete(tree: dict, cls, target: Target, key: str) -> None:
    """``~key``: a key below a free-form mapping is removed; a setting of the schema gets its default back."""
    if not target.tail:
        parent, _, name = target.path.rpartition(".")
        _select(tree, parent)[name] = _select(cls().to_dict(), target.path)
        return
    container = _select(tree, ".".join((target.path, *target.tail[:-1])))
    if not isinstance(container, dict) or target.tail[-1] not in container:
        raise ConfigError(f"~{key}: {target.path} has no key {'.'.join(target.tail)} to delete")
    del container[target.tail[-1]]


def apply(tree: dict, cls, override) -> None:
    """One parsed command-line override (see `verl.config.overrides`)."""
    add = override.op != "set"
    target = locate(cls, override.key, " ('+' adds keys only below free-form dict fields)" if add else "")
    if override.op == "add" and (override.key in VERL_KEYS or _added_before(tree, cls, target)):
        value = override.raw if override.raw is not None else ""
        raise ConfigError(f"+{override.key}={value}: {override.key} is already in the config, and '+' adds a key "
                          f"that is not there (Hydra refuses it, and so verl: 'Could not append to config. An item "
                          f"is already at {override.key}'); write {override.key}={value} to change it, or "
                          f"++{override.key}={value} to set it whether or not it is there")
    if override.op == "delete":
        delete(tree, cls, target, override.key)
    else:
        set_value(tree, cls, target, override.value, raw=override.raw, add=add)


def merge_mapping(tree: dict, cls, data: dict, prefix: str = "") -> None:
    """A YAML file's mapping, key by key (aliases accepted; two spellings of one key are an error)."""
    seen: dict[str, str] = {}
    for name, value in data.items():
        given = f"{prefix}{name}"
        target = locate(cls, given)
        if target.key in seen:
            raise ConfigError(f"{seen[target.key]} and {given} name the same key; give only one of them")
        seen[target.key] = given
        set_value(tree, cls, target, value, add=True)


def resolved(tree: dict, cls) -> dict:
    """Plain values with every ``${...}`` resolved (by OmegaConf) against the final tree; where an
    interpolation stood, the value it gave is typed as text for its field (``${oc.env:LR}`` is a float
    for a float field), since nothing typed it when it was set. Without any ``${...}``: the tree."""
    if not any(is_interpolation(leaf) for leaf in _leaves(tree)):
        return tree
    try:
        plain = OmegaConf.to_container(OmegaConf.create(tree), resolve=True)
    except OmegaConfBaseException as e:
        key = e.full_key or "?"
        raise _unresolved(key, _raw_text(tree, key), str(e).strip().splitlines()[0]) from None
    for entry in walk(cls):
        if not entry.is_section:
            parent, _, name = entry.key.rpartition(".")
            container = _select(plain, parent)
            container[name] = _typed_leaf(container[name], _select(tree, entry.key), entry.spec.type, tree, entry.key)
    return plain


def _unresolved(key: str, text: str, detail: str) -> ConfigError:
    """The error of an interpolation at ``key`` (stored as ``text``) that does not resolve to a value."""
    return ConfigError(f"{key}={text}: cannot resolve the interpolation ({detail}); refer to an existing "
                       f"key, e.g. ${{data.max_prompt_length}}, or an environment variable, ${{oc.env:NAME}}")


def _typed_leaf(value: Any, raw: Any, tp: Any, tree: dict, key: str) -> Any:
    """A field's resolved value: where its value, or an element of its list or dict, was an
    interpolation (``raw``), what it gave typed as text for the annotation there (`Any` below the
    first level: kept as given); the rest was typed when set. A value the type does not take is an
    error of the interpolation, as OmegaConf's typed nodes reported it."""
    if is_interpolation(raw):
        try:
            return text_value(value, tp)
        except TextError as e:
            raise _unresolved(key, _raw_text(tree, key), f"While dereferencing interpolation '{raw}': {e}") from None
    if isinstance(value, (list, dict)) and isinstance(raw, type(value)):
        return each(value, tp, key, lambda v, t, k, i: _typed_leaf(v, raw[i], t, tree, k))
    return value


def _raw_text(tree: dict, key: str) -> str:
    """The ``${...}`` text stored at ``key``, unresolved; "?" where the tree has no such key (an element
    of a list, ``key[0]``): the best we can do is the key alone."""
    text = _select(tree, key, _ABSENT)
    return "?" if text is _ABSENT else str(text)
