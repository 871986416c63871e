"""Human-facing renderings of a config schema: commented YAML and a `--help` listing."""

from __future__ import annotations

import textwrap

from verl.config.coerce import type_name
from verl.config.fields import walk
from verl.config.yaml_text import format_flow

_WIDTH = 100


def _help_lines(spec) -> str:
    text = spec.help
    if spec.aliases:
        text += f" Also accepted as: {', '.join(spec.aliases)}."
    return text


def render_yaml(node, header: str = "") -> str:
    """YAML of `node`'s values with each key's help text as a comment above it.

    Loading the result with `type(node).from_yaml` gives back an equal config.
    """
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for entry in walk(node):
        indent = 2 * entry.key.count(".")  # two spaces a level
        pad = " " * indent
        if indent == 0 and lines:
            lines.append("")
        for line in textwrap.wrap(_help_lines(entry.spec), _WIDTH - indent - 2):
            lines.append(f"{pad}# {line}")
        name = entry.spec.name
        lines.append(f"{pad}{name}:" if entry.is_section else f"{pad}{name}: {format_flow(entry.value)}")
    return "\n".join(lines) + "\n"


def render_help(cls: type) -> str:
    """Every dotted key with its type, default and help: the text behind `verl --help`."""
    lines: list[str] = []
    for entry in walk(cls()):
        if entry.is_section:
            lines.append(f"{entry.key}:  {entry.spec.help}")
            continue
        lines.append(f"{entry.key}: {type_name(entry.spec.type)} = {format_flow(entry.value)}")
        lines.extend(textwrap.wrap(_help_lines(entry.spec), _WIDTH, initial_indent="    ", subsequent_indent="    "))
    return "\n".join(lines) + "\n"
