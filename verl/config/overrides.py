"""Command-line overrides in the verl / Hydra style.

    actor_rollout_ref.actor.optim.lr=1e-6        set a value (parsed as a YAML flow value,
    trainer.logger=[console,wandb]               then converted to the field's type)
    data.train_files=null
    trainer.experiment_name='my run'
    +actor_rollout_ref.model.override_config.attention_dropout=0.1
                                                 `+` adds a key below a free-form dict field
                                                 (also accepted for keys that already exist)
    --config-file my.yaml                        start from a YAML file (see `config_from_cli`)

Values are parsed with YAML flow syntax, with two fixes (see verl.config.yaml_io): `1e-4` is a
float and only true/false are booleans. A str field takes the text verbatim, so `path=123`
gives "123" and `name=true` gives "true".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import yaml

from verl.config.errors import ConfigError
from verl.config.yaml_io import load_yaml_text

_KEY = re.compile(r"^[A-Za-z_][\w-]*(?:\.[\w-]+)*$")
CONFIG_FILE_FLAG = "--config-file"


def split_override(arg: str) -> tuple[str, str, bool]:
    """`"+a.b=text"` -> `("a.b", "text", True)`: dotted key, unparsed value, whether `+` was given."""
    example = "e.g. trainer.total_epochs=3 or actor_rollout_ref.actor.optim.lr=1e-6"
    if "=" not in arg:
        raise ConfigError(f"override '{arg}' has no '='; write key=value, {example}")
    key, raw = arg.split("=", 1)
    key = key.strip()
    add = key.startswith("+")
    key = key.lstrip("+")
    if key.startswith("~"):
        raise ConfigError(f"override '{arg}': deleting keys (~key) is not supported; set the key to null instead")
    if key.startswith("-"):
        raise ConfigError(f"override '{arg}' starts with '-'; write key=value without dashes, {example}")
    if not _KEY.match(key):
        raise ConfigError(f"override '{arg}' has a malformed key '{key}'; keys are dot-separated names, {example}")
    return key, raw, add


def parse_value(raw: str) -> Any:
    """The value of an override's text: a YAML flow value, or the text itself if not valid YAML."""
    try:
        return load_yaml_text(raw)
    except yaml.YAMLError:
        return raw


def parse_overrides(args: Iterable[str]) -> list[tuple[str, Any]]:
    """`["a.b=1e-4", "+c.d=[x,y]"]` -> `[("a.b", 1e-4), ("c.d", ["x", "y"])]` (values not yet typed)."""
    pairs = []
    for arg in args:
        key, raw, _ = split_override(arg)
        pairs.append((key, parse_value(raw)))
    return pairs


def split_config_file(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """Pull `--config-file PATH` / `--config-file=PATH` out of `args`: `(path or None, the rest)`."""
    path, rest = None, []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == CONFIG_FILE_FLAG:
            if i + 1 >= len(args):
                raise ConfigError(f"{CONFIG_FILE_FLAG} needs a path, e.g. {CONFIG_FILE_FLAG} my_run.yaml")
            path, i = args[i + 1], i + 2
            continue
        if arg.startswith(CONFIG_FILE_FLAG + "="):
            path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return path, rest
