"""YAML reading and writing with the two fixes every ML config needs.

PyYAML follows YAML 1.1, where `1e-4` is a string (a float needs a dot: `1.0e-4`) and `yes`,
`no`, `on`, `off` are booleans. Configs write learning rates as `1e-4` and nobody means `on` as
True, so the loader here reads exponent floats as floats and only true/false as booleans. The
dumper quotes every string that either reading would turn into something else, so what we write
reads back the same here and in plain YAML 1.1 tools.
"""

from __future__ import annotations

import os
import re
from typing import Any

import yaml

from verl.config.errors import ConfigError

_BOOL_TAG = "tag:yaml.org,2002:bool"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_EXP_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_TRUE_FALSE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")


class _Loader(yaml.SafeLoader):
    pass


class _Dumper(yaml.SafeDumper):
    pass


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in entries if tag != _BOOL_TAG]
    for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL_TAG, _TRUE_FALSE, list("tTfF"))
_Loader.add_implicit_resolver(_FLOAT_TAG, _EXP_FLOAT, list("-+0123456789"))
_Dumper.add_implicit_resolver(_FLOAT_TAG, _EXP_FLOAT, list("-+0123456789"))


def load_yaml_text(text: str) -> Any:
    """Parse YAML text (a document or a single flow value such as `[a, b]` or `1e-4`)."""
    return yaml.load(text, Loader=_Loader)


def dump_yaml(data: Any) -> str:
    """Block-style YAML of plain data, keys in insertion order."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True)


def format_flow(value: Any) -> str:
    """One-line YAML for `value` that `load_yaml_text` reads back as an equal value.

    Used for `key=value` overrides and the value side of the commented default YAML.
    """
    # Dumping a one-element flow list and dropping the brackets gives correct quoting for
    # scalars without PyYAML's "..." end-of-document marker.
    text = yaml.dump([value], Dumper=_Dumper, default_flow_style=True, width=float("inf"),
                     allow_unicode=True).strip()
    return text[1:-1]


def read_yaml_source(source: str | os.PathLike) -> dict:
    """Load a mapping from a YAML file path or from YAML text; an empty document is `{}`."""
    text, where = source, "text"
    if isinstance(source, os.PathLike) or ("\n" not in source and os.path.isfile(source)):
        with open(source, encoding="utf-8") as f:
            text, where = f.read(), f"file {os.fspath(source)}"
    elif not any(c in source for c in "\n:{"):
        raise ConfigError(f"config file '{source}' not found; pass an existing .yaml path or YAML text")
    try:
        data = load_yaml_text(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"cannot parse YAML config {where}: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"a YAML config must be a mapping of keys at the top level, got {type(data).__name__}")
    return data
