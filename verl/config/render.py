"""Human-facing renderings of a config schema: commented YAML and a `--help` listing."""

from __future__ import annotations

import textwrap

from verl.config.coerce import type_name
from verl.config.fields import field_specs, raw_value
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
    _render_node(node, 0, lines)
    return "\n".join(lines) + "\n"


def _render_node(node, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    for name, spec in field_specs(type(node)).items():
        if indent == 0 and lines:
            lines.append("")
        for line in textwrap.wrap(_help_lines(spec), _WIDTH - indent - 2):
            lines.append(f"{pad}# {line}")
        value = raw_value(node, name)
        if spec.node_type is not None:
            lines.append(f"{pad}{name}:")
            _render_node(value, indent + 2, lines)
        else:
            lines.append(f"{pad}{name}: {format_flow(value)}")


def render_help(cls: type) -> str:
    """Every dotted key with its type, default and help: the text behind `verl --help`."""
    lines: list[str] = []
    _help_node(cls(), "", lines)
    return "\n".join(lines) + "\n"


def _help_node(node, prefix: str, lines: list[str]) -> None:
    for name, spec in field_specs(type(node)).items():
        value = raw_value(node, name)
        key = prefix + name
        if spec.node_type is not None:
            lines.append(f"{key}:  {spec.help}")
            _help_node(value, key + ".", lines)
            continue
        lines.append(f"{key}: {type_name(spec.type)} = {format_flow(value)}")
        lines.extend(textwrap.wrap(_help_lines(spec), _WIDTH, initial_indent="    ", subsequent_indent="    "))
