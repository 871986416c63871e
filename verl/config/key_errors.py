"""The errors of unknown keys and values, with the did-you-mean hints each one carries."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from verl.errors import ConfigError, closest_name


# Training backends of verl that this project does not have (it trains with FSDP), by config name.
BACKENDS = {
    "megatron": "Megatron-LM",
    "mlite": "Megatron-Lite",
    "veomni": "VeOmni",
    "torchtitan": "TorchTitan",
    "fsdp_turbo": "FSDP-Turbo",
    "automodel": "NeMo AutoModel",
}
# Those whose name also heads a config section of their own (actor.megatron.*, *.veomni.*).
BACKEND_SECTIONS = ("megatron", "veomni")


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


def suggest(full_key: str, parent: str, siblings: Sequence[str], all_keys: Sequence[str]) -> list[str]:
    """Dotted keys the user probably meant by the unknown `full_key` (best first, at most 3).

    `parent` is the section where lookup failed, `siblings` its valid names and `all_keys` every
    dotted key of the whole tree. Tried in order: a close sibling name; keys of the tree that
    end with what was typed (`actor.optim.lr` -> `actor_rollout_ref.actor.optim.lr`); keys whose
    last part is close to the typed last part (`trainer.lr` -> `...optim.lr`).
    """
    tail = full_key[len(parent) + 1:] if parent else full_key
    segment, _, rest = tail.partition(".")
    # Further guesses stay inside the section where lookup failed: a key of another section that
    # merely shares a name (actor.megatron.tensor_model_parallel_size vs the rollout's) is another setting.
    in_section = [k for k in all_keys if not parent or k.startswith(parent + ".")]
    by_suffix = [k for k in in_section if k.endswith("." + tail)]
    if by_suffix and not parent:  # a whole key left at the top (hybrid_engine): not a sibling that looks alike
        return by_suffix[:3]
    close = difflib.get_close_matches(segment, siblings, n=3, cutoff=0.6)
    if close:
        out = []
        for name in close:
            guess = _join(_join(parent, name), rest) if rest else _join(parent, name)
            out.append(guess if guess in all_keys else _join(parent, name))
        return out
    if by_suffix:
        return by_suffix[:3]
    leaf = full_key.rsplit(".", 1)[-1]
    scored = []
    for order, key in enumerate(in_section):
        ratio = difflib.SequenceMatcher(None, leaf, key.rsplit(".", 1)[-1]).ratio()
        if ratio >= 0.75:
            scored.append((-ratio, order, key))
    return [key for _, _, key in sorted(scored)[:3]]


def backend_key_error(full_key: str) -> ConfigError:
    """The error for a key of another backend's section (``actor.megatron.*``, ``*.veomni.*``)."""
    backend = next(part for part in full_key.lower().split(".") if part in BACKEND_SECTIONS)
    return ConfigError(f"'{full_key}' is a setting of the {BACKENDS[backend]} backend, which is not "
                       f"supported here: this project trains with FSDP (the fsdp_config sections); drop it")


def unknown_key_error(full_key: str, parent: str, siblings: Sequence[str],
                      all_keys: Sequence[str], note: str = "") -> ConfigError:
    """The error for a key that names no setting, with the best did-you-mean hint we can give."""
    if any(part in BACKEND_SECTIONS for part in full_key.lower().split(".")):
        return backend_key_error(full_key)
    guesses = suggest(full_key, parent, siblings, all_keys)
    if guesses:
        hint = f"did you mean {guesses[0]}?"
        if len(guesses) > 1:
            hint += f" (or: {', '.join(guesses[1:])})"
        return ConfigError(f"unknown config key '{full_key}'; {hint}{note}")
    where = f" under {parent}" if parent else ""
    hint = f"valid keys{where}: {', '.join(siblings)}"
    # The same name in other sections is another setting, not a typo: named as such, after the list.
    leaf = full_key.rsplit(".", 1)[-1]
    namesakes = [k for k in all_keys if k.rsplit(".", 1)[-1] == leaf][:3]
    if namesakes:
        hint += f". Keys named '{leaf}' in other sections: {', '.join(namesakes)}"
    return ConfigError(f"unknown config key '{full_key}'; {hint}{note}")


def check_choice(key: str, value: str, choices: Sequence[str], what: str = "value",
                 elsewhere: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError unless `value` is one of `choices`; the message suggests the closest one.

    `elsewhere` maps names that exist in verl (or elsewhere) but not here to why: those are named
    as what they are, never "corrected" into a different choice that merely looks alike."""
    if value in choices:
        return
    known = elsewhere and (elsewhere.get(value) or elsewhere.get(str(value).lower().replace("-", "_")))
    if known:
        raise ConfigError(f"{key}={value!r}: {known}; choose one of {', '.join(choices)}")
    close = closest_name(value, choices, cutoff=0.5)
    hint = f"did you mean {key}={close}? " if close else ""
    raise ConfigError(f"unknown {what} {key}={value!r}; {hint}choose one of {', '.join(choices)}")
