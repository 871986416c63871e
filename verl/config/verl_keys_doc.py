"""The tables of verl's keys that are refused or have no effect here, generated from the schema's
`verl_option` rules (`python -m verl.config verl-keys > docs/config_verl_keys.md`; a unit test checks
the committed file is current), so the documentation cannot drift from what the code does."""

from __future__ import annotations

from collections import defaultdict

from verl.config.coerce import is_dict_type
from verl.config.verl_rules import Rule, rules

_SHORT = {"actor_rollout_ref.": ""}  # actor, ref, rollout, model stand for actor_rollout_ref.*


def _short(key: str) -> str:
    """The key as the tables show it: `actor.x` for `actor_rollout_ref.actor.x`."""
    for long, short in _SHORT.items():
        if key.startswith(long):
            return short + key[len(long):]
    return key


def _compress(keys: list[str]) -> str:
    """`actor.x`, `ref.x` -> `{actor,ref}.x`: keys that differ only in their first part share one entry."""
    by_rest: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        head, _, rest = key.partition(".")
        by_rest[rest if rest else key].append(head if rest else "")
    parts = []
    for rest, heads in by_rest.items():
        if heads == [""]:
            parts.append(f"`{rest}`")
        elif len(heads) == 1:
            parts.append(f"`{heads[0]}.{rest}`")
        else:
            parts.append(f"`{{{','.join(heads)}}}.{rest}`")
    return ", ".join(parts)


def _reason(rule: Rule) -> str:
    text = rule.why if isinstance(rule.why, str) else "that backend is not supported"
    return text + (f"; {rule.instead}" if rule.instead else "")


def _warn_when(when: str) -> str:
    if not when:
        return "when a value asks for it"
    if when.startswith("to "):
        return f"when set {when}"
    return when if when.startswith(("with ", "when ")) else f"when {when}"


def _table(rows: dict[tuple[str, str], list[str]], header: str) -> list[str]:
    lines = [header, "|---|---|---|"]
    for (when, why), keys in sorted(rows.items(), key=lambda item: item[1][0]):
        lines.append(f"| {_compress(keys)} | {when} | {why} |")
    return lines


def render_verl_keys() -> str:
    from verl.config.schema import TrainerConfig

    refused: dict[tuple[str, str], list[str]] = defaultdict(list)
    inert: dict[tuple[str, str], list[str]] = defaultdict(list)
    for entry, rule in rules(TrainerConfig()):
        key = _short(entry.key + (".*" if is_dict_type(entry.spec.type) else ""))
        if rule.refuse_if is not None:
            refused[(rule.when or "other values", _reason(rule))].append(key)
        elif rule.inert or rule.warn_if is not None:
            when = _warn_when(rule.when) if rule.warn_if is not None else ""
            inert[(when, _reason(rule))].append(key)
    lines = ["# verl keys refused, or accepted without effect", "",
             "Generated from the schema (`python -m verl.config verl-keys > docs/config_verl_keys.md`; a unit test "
             "checks it is current). How verl's keys are read here: [config.md](config.md). `actor`, `ref`, "
             "`rollout` and `model` stand for `actor_rollout_ref.actor` etc.; `x.*` is a mapping that holds "
             "verl's keys and defaults.", "",
             "## Refused", "",
             "Setting one of these values raises `ConfigError` with one line naming the key, why, and what to "
             "use instead.", ""]
    lines += _table(refused, "| key | refused | why |")
    lines += ["", "## Accepted without effect", "",
              "The help text says so and why; where a value asks for something not done here, `validate()` logs "
              "one warning (logger `verl.config`) naming the key.", ""]
    lines += _table(inert, "| key | logs a warning | why it has no effect |")
    return "\n".join(lines) + "\n"
