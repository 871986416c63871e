"""Command-line overrides in Hydra's grammar, parsed by Hydra's own override parser (verl's choice,
so the forms and their edge cases are the real ones):

    actor_rollout_ref.actor.optim.lr=1e-6        set a value (typed by Hydra's grammar, then
    trainer.logger=[console,wandb]               converted to the field's type)
    trainer.logger=['console','wandb']
    data.train_files=null
    trainer.experiment_name='my run'
    +actor_rollout_ref.model.override_config.attention_dropout=0.1
                                                 `+` adds a key below a free-form dict field
                                                 (also accepted for keys that already exist)
    ++actor_rollout_ref.model.override_config.x=1
                                                 `++` sets a key, adding it where it is missing
    ~actor_rollout_ref.model.override_config.x   `~` deletes a key below a dict field; for a
                                                 setting of the schema it restores the default
    actor@actor_rollout_ref.actor=dp_actor       a config-group choice: the FSDP ones are what
                                                 runs here anyway; Megatron's are refused
    --config-file my.yaml                        start from a YAML file (see `config_from_cli`)
    --config-path DIR --config-name NAME         verl's way to name one: DIR/NAME(.yaml)

A str field takes the text as typed, so `path=123` gives "123" and `name=true` gives "true". As
with Hydra, `key=a,b` is a sweep and refused (write a list `[a,b]` or quote it), and a value with
`=`, `~` or other special characters must be quoted: `key='a=b'`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl.config.key_errors import BACKEND_SECTIONS, BACKENDS, backend_key_error
from verl.errors import ConfigError

logger = logging.getLogger(__name__)

CONFIG_FILE_FLAG = "--config-file"
CONFIG_PATH_FLAG, CONFIG_NAME_FLAG = "--config-path", "--config-name"
EXAMPLE = "e.g. trainer.total_epochs=3 or actor_rollout_ref.actor.optim.lr=1e-6"
# verl's config-group choices that name the FSDP backend, which is the one this project runs.
FSDP_GROUP_CHOICES = {"dp_actor", "dp_critic", "dp_ref", "dp_reward_model", "dp", "fsdp", "fsdp2", "hf_model",
                      "rollout", "legacy_data", "legacy_reward_impl", "data", "reward_model"}


@dataclass(frozen=True)
class Override:
    """One parsed override: ``op`` is ``set``, ``add`` (``+``), ``force_add`` (``++``) or ``delete`` (``~``);
    ``raw`` the value's text as typed; ``package`` the ``@package`` of a config-group choice."""

    key: str
    value: Any
    raw: str | None
    op: str
    package: str | None = None


@functools.lru_cache(maxsize=1)
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


_OPS = {"CHANGE": "set", "ADD": "add", "FORCE_ADD": "force_add", "DEL": "delete"}


def parse_override(arg: str) -> Override:
    """One command-line override, parsed by Hydra's grammar, with errors that name the fix."""
    text = arg.strip()
    if text.startswith("-"):
        raise ConfigError(f"override '{arg}' starts with '-'; write key=value without dashes, {EXAMPLE}")
    if "=" not in text and not text.startswith("~"):
        raise ConfigError(f"override '{arg}' has no '='; write key=value, {EXAMPLE}")
    key_text = text.split("=", 1)[0].lstrip("+~")
    if ".." in key_text or key_text.startswith(".") or key_text.endswith("."):
        raise ConfigError(f"override '{arg}' has a malformed key '{key_text}'; keys are dot-separated names, {EXAMPLE}")
    from hydra.errors import HydraException

    try:
        parsed = _parser().parse_override(text)
        if parsed.is_sweep_override():
            raise ConfigError(f"override '{arg}' is a sweep (values separated by commas): write a list, "
                              f"{key_text}=[a,b], or quote text that holds commas, {key_text}='a,b'")
        value = None if parsed.is_delete() else parsed.value()
    except HydraException as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"override '{arg}' could not be parsed ({detail}); quote a value that holds =, ~, "
                          f"commas or brackets: {key_text}='...', {EXAMPLE}") from None
    raw = text.split("=", 1)[1] if "=" in text else None
    return Override(parsed.key_or_group, value, raw, _OPS[parsed.type.name], parsed.package)


def _backend_of(choice: str) -> str | None:
    # verl's choices of the other backends carry its config name: megatron_actor, mlite_actor, ...
    return next((name for word, name in BACKENDS.items() if word in choice.lower()), None)


def is_group_choice(value: str) -> bool:
    """Whether ``value``, given for a section, reads as one of verl's config-group choices."""
    return value in FSDP_GROUP_CHOICES or _backend_of(value) is not None


def check_group_choice(label: str, choice: str) -> None:
    """A config-group choice (``group@package=choice``, or ``engine=fsdp`` where the group is a section
    of the schema): the FSDP choices are taken and change nothing, other backends are refused."""
    backend = _backend_of(choice)
    if backend is not None:
        raise ConfigError(f"{label}={choice}: the {backend} backend is not supported here; "
                          f"this project trains with FSDP (torchrun or one process): drop this override")
    if choice not in FSDP_GROUP_CHOICES:
        raise ConfigError(f"{label}={choice}: unknown config-group choice; the FSDP "
                          f"choices ({', '.join(sorted(FSDP_GROUP_CHOICES))}) are accepted and change nothing here")
    logger.info("%s=%s: FSDP is the backend here already; nothing to change", label, choice)


def backend_first(overrides: Sequence[Override]) -> None:
    """Refuse a launch of another backend on its backend, whatever key comes first: a Megatron script
    also sets keys unknown here, and "unknown key optim.min_lr" would hide the real reason."""
    for override in overrides:
        if override.package is not None:  # group@package=choice: verl's config groups pick a backend
            check_group_choice(f"{override.key}@{override.package}", str(override.value))
        elif any(part in BACKEND_SECTIONS for part in override.key.lower().split(".")):
            raise backend_key_error(override.key)


def is_hydra_setting(override: Override) -> bool:
    """``hydra.run.dir=...``, ``hydra.searchpath=[...]``: settings of Hydra itself, which does not run here."""
    return override.key == "hydra" or override.key.startswith("hydra.")


def parse_overrides(args: Iterable[str]) -> list[tuple[str, Any]]:
    """`["a.b=1e-4", "+c.d=[x,y]"]` -> `[("a.b", 1e-4), ("c.d", ["x", "y"])]` (values not yet typed)."""
    return [(o.key, o.value) for o in map(parse_override, args)]


def _flag_value(args: Sequence[str], i: int, flag: str) -> tuple[str | None, int]:
    """The value of ``flag`` at ``args[i]`` (``flag VALUE`` or ``flag=VALUE``) and the next index."""
    arg = args[i]
    if arg == flag:
        if i + 1 >= len(args):
            raise ConfigError(f"{flag} needs a {'path' if flag == CONFIG_FILE_FLAG else 'value'}, e.g. {flag} my_run.yaml")
        return args[i + 1], i + 2
    if arg.startswith(flag + "="):
        return arg.split("=", 1)[1], i + 1
    return None, i


def split_config_file(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """Pull the config file out of `args`: `--config-file PATH`, or verl's `--config-path DIR
    --config-name NAME` (either form with `=`). Returns `(path or None, the rest)`.

    ``--config-name ppo_trainer`` without a path names verl's default config, which is this project's
    default too; a Megatron config name is refused."""
    given: dict[str, str | None] = dict.fromkeys((CONFIG_FILE_FLAG, CONFIG_PATH_FLAG, CONFIG_NAME_FLAG))
    rest = []
    i = 0
    while i < len(args):
        for flag in given:
            value, j = _flag_value(args, i, flag)
            if value is not None:
                given[flag], i = value, j
                break
        else:
            rest.append(args[i])
            i += 1
    path, config_dir, config_name = given.values()
    if config_name is not None:
        stem = Path(config_name).stem if config_name.endswith((".yaml", ".yml")) else config_name
        if "megatron" in stem.lower():
            raise ConfigError(f"{CONFIG_NAME_FLAG} {config_name}: the Megatron backend is not supported here; this "
                              f"project trains with FSDP: drop {CONFIG_NAME_FLAG} (the default is verl's ppo_trainer)")
        candidate = Path(config_dir or ".") / f"{stem}.yaml"
        composed = candidate.exists() and any(line.startswith("defaults:") for line in
                                              candidate.read_text().splitlines())
        if composed and stem != "ppo_trainer":
            raise ConfigError(f"{candidate} is a Hydra composition (a top-level defaults: list), which is not "
                              f"supported; give a flat YAML file (`verl config` writes one) with {CONFIG_FILE_FLAG}")
        if candidate.exists() and not composed:
            path = str(candidate)
        elif stem != "ppo_trainer":  # verl's own ppo_trainer is this project's default
            raise ConfigError(f"{CONFIG_NAME_FLAG} {config_name}: no file {candidate}; give the folder that holds it "
                              f"with {CONFIG_PATH_FLAG} DIR, or use {CONFIG_FILE_FLAG} PATH")
    elif config_dir is not None:
        raise ConfigError(f"{CONFIG_PATH_FLAG} {config_dir} needs {CONFIG_NAME_FLAG} NAME (the YAML file in it)")
    return path, rest
