"""``${...}`` interpolation in YAML config files and command-line values, resolved by OmegaConf.

As in verl (Hydra + OmegaConf), a value may refer to another key, ``${data.max_prompt_length}``, or
use a resolver such as ``${oc.env:HOME}``. References are resolved once every file and override
has been applied, against the final values, so a command-line override of the referenced key
counts. The resolved value is then checked like any other (type, choices).
"""

from __future__ import annotations

from typing import Any

from verl.config.errors import ConfigError

Pending = list[tuple[str, str]]  # (dotted key, "${...}" text), in the order given


def is_interpolation(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def split_interpolations(data: dict, prefix: str = "") -> tuple[dict, Pending]:
    """``data`` without its ``${...}`` leaves, and those leaves as ``(dotted key, text)``."""
    plain, pending = {}, []
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            inner, found = split_interpolations(value, path + ".")
            plain[key] = inner
            pending += found
        elif is_interpolation(value):
            pending.append((path, value))
        else:
            plain[key] = value
    return plain, pending


def resolve(cfg, pending: Pending) -> None:
    """Set every pending key of ``cfg`` to its interpolation's value against ``cfg``'s current values."""
    if not pending:
        return
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    tree = OmegaConf.create(cfg.to_dict())
    for key, text in pending:
        OmegaConf.update(tree, key, text, force_add=True)
    for key, text in pending:
        try:
            value = OmegaConf.select(tree, key, throw_on_missing=True)
            value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except OmegaConfBaseException as e:
            detail = str(e).strip().splitlines()[0]
            raise ConfigError(f"{key}={text}: cannot resolve the interpolation ({detail}); refer to an existing "
                              f"key, e.g. ${{data.max_prompt_length}}, or an environment variable, "
                              f"${{oc.env:NAME}}") from None
        # Typed as a command-line value would be: a str field takes a number's text.
        raw = None if isinstance(value, (dict, list)) or value is None else str(value)
        cfg._set(key, value, text=True, raw=raw, add=True)
