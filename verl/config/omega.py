"""The text path of the config on OmegaConf: YAML files and Hydra overrides are applied to a typed
OmegaConf tree made from the dataclass schemas, and `${...}` interpolation is resolved by it.

    tree = typed_tree(TrainerConfig())           # struct DictConfig: IntegerNode, FloatNode, ...
    apply(tree, TrainerConfig, parse_override("actor_rollout_ref.actor.optim.lr=1e-6"))
    TrainerConfig.from_dict(resolved(tree))      # back to the dataclasses (choices, rules)

OmegaConf does the typing of text (``"1e-4"`` for a float, ``true`` for a bool), refuses values of
the wrong type and keys a section does not have (struct mode), and resolves interpolations after
every file and override has been applied. The schema walk here only turns verl's names and aliases
into canonical keys and OmegaConf's errors into ones that name the key and the fix (did-you-mean
within the section, the ``+`` form for free-form mappings).
"""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

from omegaconf import AnyNode, BooleanNode, DictConfig, FloatNode, IntegerNode, ListConfig, OmegaConf, StringNode
from omegaconf.errors import OmegaConfBaseException

from verl.config.coerce import is_dict_type, mismatch
from verl.config.fields import alias_map, dotted_keys, example_of, field_specs, nest, walk
from verl.config.key_errors import unknown_key_error
from verl.errors import ConfigError

NoneType = type(None)
_SCALARS = {int: IntegerNode, float: FloatNode, bool: BooleanNode, str: StringNode}


# ------------------------------------------------------------------ the typed tree
def _members(tp: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None is allowed)."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not NoneType]
        optional = len(args) < len(get_args(tp))
        return (args[0] if len(args) == 1 else Union[tuple(args)]), optional
    return tp, False


def _is_text(tp: Any) -> bool:
    """A field that takes the text as typed: str, or a choice of str values."""
    tp, _ = _members(tp)
    return tp is str or (get_origin(tp) is Literal and all(isinstance(c, str) for c in get_args(tp)))


def _typed(tp: Any, value: Any):
    """The OmegaConf node for a leaf of annotation ``tp`` holding ``value``."""
    inner, optional = _members(tp)
    if _is_text(inner):
        return StringNode(value, is_optional=optional)
    if inner in _SCALARS:
        return _SCALARS[inner](value, is_optional=optional)
    if is_dict_type(tp):
        if value is None:
            return AnyNode(None)
        args = get_args(inner)
        element = args[1] if len(args) == 2 and args[1] in _SCALARS else Any
        node = DictConfig(copy.deepcopy(value), element_type=element)
        OmegaConf.set_struct(node, False)  # free-form: keys are added with +key=value
        return node
    if (inner is list or get_origin(inner) is list) and value is not None:
        args = get_args(inner)
        return ListConfig(copy.deepcopy(value), element_type=args[0] if args and args[0] in _SCALARS else Any)
    if isinstance(value, (list, dict)):
        return copy.deepcopy(value)  # untyped: OmegaConf wraps it, and any value may replace it
    return AnyNode(value)  # unions of several types, Any: checked by the schema afterwards


def typed_tree(node) -> DictConfig:
    """A struct DictConfig with ``node``'s values, each leaf typed by its annotation."""
    tree = DictConfig(nest(walk(node), lambda entry: _typed(entry.spec.type, entry.value)))
    OmegaConf.set_struct(tree, True)
    return tree


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
        prefix = ".".join(canon)
        if canonical is None:
            full = ".".join([*canon, *parts[i:]])
            raise unknown_key_error(full, prefix, list(alias_map(node_cls)), dotted_keys(cls), note)
        spec = field_specs(node_cls)[canonical]
        canon.append(canonical)
        if i == len(parts) - 1:
            return Target(".".join(canon), spec, ())
        if spec.node_type is not None:
            node_cls = spec.node_type
        elif is_dict_type(spec.type):
            return Target(".".join(canon), spec, tuple(parts[i + 1:]))
        else:
            path = ".".join(canon)
            raise ConfigError(f"{path} is a value, not a section, so it has no key '{parts[i + 1]}'; set it "
                              f"with {path}=...")
    raise AssertionError("unreachable")


# ------------------------------------------------------------------ applying values
def _mismatch(target: Target, value: Any) -> ConfigError:
    if target.spec.node_type is not None and not target.tail:
        return mismatch(value, target.spec.node_type, target.key, "{key: value, ...}")
    return mismatch(value, target.spec.type if not target.tail else Any, target.key, example_of(target.spec))


def _text_value(target: Target, value: Any, raw: str | None) -> Any:
    """A str field takes the text as typed (``tag=007`` is "007", ``name=true`` is "true")."""
    if target.tail or not _is_text(target.spec.type) or value is None or isinstance(value, (str, dict, list)):
        return value
    if raw is not None:
        return raw.strip()
    return ("true" if value else "false") if isinstance(value, bool) else value


def _check_free_form(tree: DictConfig, target: Target, add: bool) -> None:
    """Below a free-form mapping a plain ``key=value`` changes a key that is there; ``+`` adds one."""
    container = OmegaConf.select(tree, target.path)
    if container is None:
        OmegaConf.update(tree, target.path, {}, merge=False)
        container = OmegaConf.select(tree, target.path)
    for i, part in enumerate(target.tail):
        key = ".".join((target.path, *target.tail[:i + 1]))
        if not isinstance(container, DictConfig):
            raise ConfigError(f"{'.'.join((target.path, *target.tail[:i]))} holds "
                              f"{OmegaConf.to_container(container) if OmegaConf.is_config(container) else container!r}"
                              f", not a mapping; it has no key '{part}'")
        if part not in container:
            if not add:
                raise ConfigError(f"{key} is not set yet; add a key below the free-form {target.path} with "
                                  f"+{target.key}=<value>")
            return
        container = container._get_node(part)
        container = container if OmegaConf.is_config(container) else container._value()


def set_value(tree: DictConfig, cls, target: Target, value: Any, *, raw: str | None = None,
              add: bool = False) -> None:
    """``target = value``, typed by OmegaConf; a mapping given for a section sets its keys one by one."""
    if target.spec.node_type is not None and not target.tail:
        if not isinstance(value, dict):
            raise _mismatch(target, value)
        merge_mapping(tree, cls, value, f"{target.key}.")
        return
    if target.tail:
        _check_free_form(tree, target, add)
    value = _text_value(target, value, raw)
    try:
        OmegaConf.update(tree, target.key, value, merge=True, force_add=bool(target.tail))
    except OmegaConfBaseException as e:
        detail = str(e).strip().splitlines()[0]
        if "interpolation" in detail.lower():
            raise ConfigError(f"{target.key}={value}: {detail}") from None
        raise _mismatch(target, value) from None


def delete(tree: DictConfig, defaults: DictConfig, target: Target, key: str) -> None:
    """``~key``: a key below a free-form mapping is removed; a setting of the schema gets its default back."""
    if not target.tail:
        OmegaConf.update(tree, target.path, copy.deepcopy(OmegaConf.select(defaults, target.path)), merge=False)
        return
    container = OmegaConf.select(tree, ".".join((target.path, *target.tail[:-1])), default=None)
    if not isinstance(container, DictConfig) or target.tail[-1] not in container:
        raise ConfigError(f"~{key}: {target.path} has no key {'.'.join(target.tail)} to delete")
    del container[target.tail[-1]]


def apply(tree: DictConfig, cls, override, defaults: DictConfig) -> None:
    """One parsed command-line override (see `verl.config.overrides`)."""
    add = override.op != "set"
    target = locate(cls, override.key, " ('+' adds keys only below free-form dict fields)" if add else "")
    if override.op == "delete":
        delete(tree, defaults, target, override.key)
    else:
        set_value(tree, cls, target, override.value, raw=override.raw, add=add)


def merge_mapping(tree: DictConfig, cls, data: dict, prefix: str = "") -> None:
    """A YAML file's mapping, key by key (aliases accepted; two spellings of one key are an error)."""
    seen: dict[str, str] = {}
    for name, value in data.items():
        given = f"{prefix}{name}"
        target = locate(cls, given)
        if target.key in seen:
            raise ConfigError(f"{seen[target.key]} and {given} name the same key; give only one of them")
        seen[target.key] = given
        set_value(tree, cls, target, value, add=True)


def resolved(tree: DictConfig) -> dict:
    """Plain values with every ``${...}`` resolved against the final tree, each typed by its node."""
    try:
        return OmegaConf.to_container(tree, resolve=True)
    except OmegaConfBaseException as e:
        key = e.full_key or "?"
        text = _raw_text(tree, key)
        detail = str(e).strip().splitlines()[0]
        raise ConfigError(f"{key}={text}: cannot resolve the interpolation ({detail}); refer to an existing "
                          f"key, e.g. ${{data.max_prompt_length}}, or an environment variable, "
                          f"${{oc.env:NAME}}") from None


def _raw_text(tree: DictConfig, key: str) -> str:
    """The ``${...}`` text stored at ``key``, unresolved."""
    parent, _, leaf = key.rpartition(".")
    try:
        return str((OmegaConf.select(tree, parent) if parent else tree)._get_node(leaf)._value())
    except Exception:  # the best we can do is the key alone
        return "?"
