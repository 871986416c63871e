"""verl's config keys that this project accepts without doing what they ask, or refuses.

People arrive with verl launch scripts of 50-100 `key=value` overrides. Every verl key either
works here, or is accepted with no effect (its help text says why; a value that asks for something
not done here logs one warning when the config is validated), or is refused with one line that
names the key, why, and what to use instead. Nothing a user asked for is dropped silently.

Declaring such a key in a schema section:

    use_torch_compile: bool = verl_option(True, help="...", why="nothing is compiled here")
    lora_rank: int = verl_option(0, help="...", why="LoRA is not implemented yet",
                                 refuse_if=lambda v: v > 0, when="above 0", instead="train all weights")

Refusals happen when the value is set (command line, YAML, Python), so they hold in every trainer
whose schema shares the section. Warnings run in `TrainerConfig.validate()` (:func:`check`), after
:func:`verl.config.compat.resolve` has moved values given under verl's other spellings to the keys
this project reads. docs/config.md lists all of them.
"""

from __future__ import annotations

import dataclasses
import logging
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from verl.config.fields import Entry, walk
from verl.config.key_errors import BACKENDS
from verl.config.node import MISSING, ConfigNode, option
from verl.config.yaml_text import format_flow
from verl.errors import ConfigError

logger = logging.getLogger("verl.config")

FSDP_STRATEGIES = ("fsdp", "fsdp2")
FSDP_INSTEAD = "this project trains with FSDP: use strategy=fsdp or fsdp2 and the fsdp_config keys"


@dataclasses.dataclass(frozen=True)
class Rule:
    """How a verl key behaves here; see `verl_option`."""

    why: str | Callable[[Any], str]
    inert: bool = True
    warn_if: Callable[[Any], bool] | None = None
    refuse_if: Callable[[Any], bool] | None = None
    when: str = ""
    instead: str = ""
    normalize: Callable[[Any], Any] | None = None
    keys: tuple[str, ...] = ()  # for a free-form mapping: the entries the rule looks at

    def reason(self, value: Any) -> str:
        return self.why(value) if callable(self.why) else self.why

    def given(self, key: str, value: Any) -> str:
        """`key=value` as the user wrote it; for a mapping, only the entries the rule looks at."""
        if isinstance(value, dict) and self.keys:
            shown = [k for k in self.keys if value.get(k) not in (None, False, [], {}, "")] or list(self.keys[:1])
            return ", ".join(f"{key}.{k}={format_flow(value.get(k))}" for k in shown)
        return f"{key}={format_flow(value)}"

    def refusal(self, key: str, value: Any) -> ConfigError:
        fix = f"; {self.instead}" if self.instead else ""
        return ConfigError(f"{self.given(key, value)} is not supported here: {self.reason(value)}{fix}")

    def warning(self, key: str, value: Any) -> str:
        return f"{self.given(key, value)} has no effect here: {self.reason(value)}"


# The reason given for settings that only save memory.
MEMORY_ONLY = "a memory saving only; the numbers are the same"
# Ulysses splits each sequence over a group of ranks: the losses and gradients are those of whole
# sequences, which is what every rank computes here.
NO_SEQUENCE_PARALLEL = ("sequence parallelism is not implemented: every rank holds whole sequences (the same "
                        "losses and gradients, more activation memory per rank), so the data-parallel size is the "
                        "world size; use use_dynamic_bsz / ppo_max_token_len_per_gpu to bound the memory")

def verl_option(default: Any = MISSING, *, help: str, why: str | Callable[[Any], str], inert: bool = True,
                warn_if: Callable[[Any], bool] | None = None, refuse_if: Callable[[Any], bool] | None = None,
                when: str = "", instead: str = "", normalize: Callable[[Any], Any] | None = None,
                keys: Iterable[str] = (), aliases: Iterable[str] = (), bounds: str | None = None,
                choices: Iterable[str] | None = None) -> Any:
    """A leaf field for one of verl's keys that does not (fully) work here.

    `inert`: the key has no effect at all (the help text gets "No effect here: <why>.").
    `warn_if(value)`: the value asks for a behaviour not done here; `validate()` logs a warning.
    `refuse_if(value)`: the value would change results if ignored; setting it raises ConfigError
    (`when` describes those values in the help text, `instead` says what to use).
    `normalize(value)`: applied before the checks, e.g. verl's -1 for "not set" -> None.
    `keys`: for a free-form mapping, the entries the checks read (named in messages).
    `bounds` / `choices`: as for `option()`, checked after `normalize`.
    """
    rule = Rule(why, inert, warn_if, refuse_if, when, instead, normalize, tuple(keys))
    reason = why if isinstance(why, str) else ""
    notes = []
    if inert:
        notes.append(f"No effect here{': ' + reason if reason else ''}.")
    if refuse_if is not None:
        text = f"Refused {when}" if when else "Other values are refused"
        if not inert and reason:
            text += f": {reason}"
        notes.append(text + (f"; {instead}." if instead else "."))
    elif warn_if is not None:
        notes.append(f"Setting it {when} logs a warning." if when else "A value that asks for it logs a warning.")
    field = option(default, help=" ".join([help, *notes]), aliases=aliases, bounds=bounds, choices=choices)
    field.metadata = types.MappingProxyType({**field.metadata, "verl_rule": rule})
    return field


def strategy_option(help: str, default: str = "fsdp") -> Any:
    """verl's `strategy` key: fsdp and fsdp2 both run this project's FSDP engine; others are refused."""
    return verl_option(default, help=help, inert=False, refuse_if=lambda v: v not in FSDP_STRATEGIES,
                       why=lambda v: (f"the {BACKENDS[v]} backend is not supported" if v in BACKENDS
                                      else f"unknown training backend {v!r}"),
                       when="for anything but fsdp / fsdp2", instead=FSDP_INSTEAD)


class Section(ConfigNode):
    """Base of the trainer's sections: applies the `verl_option` rules as values are set. (Keys of
    other backends' sections, actor.megatron.* and the like, are refused by `unknown_key_error`.)"""

    def _check(self, spec, value):
        rule = spec.metadata.get("verl_rule")
        if rule is not None and rule.normalize is not None:
            value = rule.normalize(value)
        value = super()._check(spec, value)
        if rule is not None and rule.refuse_if is not None and rule.refuse_if(value):
            raise rule.refusal(self._path(spec.name), value)
        return value


# ------------------------------------------------------------------ checks at validate()
def rules(node: ConfigNode) -> Iterator[tuple[Entry, Rule]]:
    """The walk's entry and the rule of every field declared with `verl_option` below ``node``
    (`validate()` checks them, the table of verl's keys lists them)."""
    for entry in walk(node):
        rule = entry.spec.metadata.get("verl_rule")
        if rule is not None:
            yield entry, rule


def check(cfg: ConfigNode) -> None:
    """Refuse what a free-form value changed in place asks for, and log one warning per key whose
    value asks for something not done here. Called by `validate()`."""
    for entry, rule in rules(cfg):
        key = entry.owner._path(entry.spec.name)
        if rule.refuse_if is not None and rule.refuse_if(entry.value):
            raise rule.refusal(key, entry.value)
        if rule.warn_if is not None and rule.warn_if(entry.value):
            logger.warning(rule.warning(key, entry.value))
