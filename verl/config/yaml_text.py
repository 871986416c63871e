"""The config's YAML text: reading files or YAML text, writing block YAML, one-line values.

OmegaConf's loader and writer, so that what is written reads back equal (``1e-4`` is a float,
strings that would read as something else are quoted); ``${...}`` stays text until the text path
(:mod:`verl.config.omega`) resolves it.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf._utils import get_omega_conf_dumper, get_yaml_loader
from omegaconf.errors import OmegaConfBaseException

from verl.errors import ConfigError


def read_yaml(source: str | os.PathLike) -> dict:
    """A mapping from a YAML file path or YAML text (OmegaConf's loader: ``1e-4`` is a float);
    ``${...}`` stays text, to resolve once everything is applied. An empty document is ``{}``."""
    text, where = source, "text"
    if isinstance(source, os.PathLike) or ("\n" not in source and os.path.isfile(source)):
        with open(source, encoding="utf-8") as f:
            text, where = f.read(), f"file {os.fspath(source)}"
    elif not any(c in source for c in "\n:{"):
        raise ConfigError(f"config file '{source}' not found; pass an existing .yaml path or YAML text")
    try:
        data = OmegaConf.create(text) if text.strip() else OmegaConf.create({})
    except (yaml.YAMLError, OmegaConfBaseException) as e:
        mark = getattr(e, "problem_mark", None)
        if mark is not None and "'\\t'" in str(e):  # the commonest slip: a tab where YAML wants spaces
            raise ConfigError(f"cannot parse YAML config {where}: line {mark.line + 1} has a tab where YAML takes "
                              f"spaces only; indent with spaces (2 per level in verl's configs)") from None
        raise ConfigError(f"cannot parse YAML config {where}: {str(e).strip()}") from None
    if not isinstance(data, DictConfig):
        raise ConfigError("a YAML config must be a mapping of keys at the top level, got a list")
    return OmegaConf.to_container(data, resolve=False)


def to_yaml(data: dict) -> str:
    """Block YAML of plain data (OmegaConf's writer: strings that would read back as something else
    are quoted); `read_yaml` reads it back equal. What ``OmegaConf.to_yaml`` writes, without building
    a DictConfig of the data first (half its time)."""
    return yaml.dump(data, Dumper=get_omega_conf_dumper(), default_flow_style=False, allow_unicode=True,
                     sort_keys=False)


def format_flow(value: Any) -> str:
    """One-line YAML for ``value`` (an override's value side, a default in the commented YAML) that
    OmegaConf's loader reads back as an equal value."""
    # A one-element flow list, brackets dropped: the scalar quoting without an end-of-document marker.
    text = yaml.dump([value], Dumper=_flow_dumper(), default_flow_style=True, width=float("inf"),
                     allow_unicode=True).strip()
    return text[1:-1]


@functools.cache
def _flow_dumper():
    """A dumper that quotes a string exactly when OmegaConf's loader would read it as something else
    (``'1e-4'``, ``'yes'``, ``'null'``), and leaves keys such as ``n`` plain, as Hydra's grammar needs."""
    return type("FlowDumper", (yaml.SafeDumper,), {"yaml_implicit_resolvers": get_yaml_loader().yaml_implicit_resolvers})
