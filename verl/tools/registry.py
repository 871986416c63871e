"""Loading the tools of a run: verl's tool YAML (classes) and Python files of functions.

verl's tool YAML (``actor_rollout_ref.rollout.multi_turn.tool_config_path``)::

    tools:
      - class_name: my_package.my_tools.WeatherTool   # a BaseTool subclass, importable
        config: {type: native, api_key_env: WEATHER_KEY}
        tool_schema:                                   # optional if the class defines one
          type: function
          function: {name: get_weather, description: ..., parameters: {...}}

Every tool is checked when the run starts (the class imports, the schema validates, the names are
unique), so a typo costs seconds.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import yaml

from verl.errors import VerlError
from verl.tools.base_tool import BaseTool
from verl.tools.function_tool import FunctionTool, load_function_tools
from verl.tools.schemas import OpenAIFunctionToolSchema

TOOL_CONFIG_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"


def import_class(dotted: str, where: str):
    module_name, _, class_name = dotted.rpartition(".")
    if not module_name:
        raise VerlError(f"{where}: class_name={dotted!r} must be a dotted path, e.g. my_package.tools.MyTool")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        if module_name.startswith(("verl.tools.", "verl.interactions.")):  # one of verl's own that is not here
            raise VerlError(f"{where}: class_name={dotted}: verl's {module_name} is not part of this project (verl's "
                            f"GSM8K ones are: verl.tools.gsm8k_tool.Gsm8kTool, verl.interactions.gsm8k_interaction."
                            f"Gsm8kInteraction); write it as a verl.tools.base_tool.BaseTool (or verl.interactions."
                            f"base.BaseInteraction) subclass in a module of your own and name that (docs/agents.md)"
                            ) from None
        raise VerlError(f"{where}: class_name={dotted}: cannot import {module_name} ({e}); make the module importable "
                        f"(install it, or add its folder to PYTHONPATH)") from None
    if not hasattr(module, class_name):
        raise VerlError(f"{where}: class_name={dotted}: {module_name} has no {class_name}")
    return getattr(module, class_name)


def yaml_entries(path: str | Path, config_key: str, top: str, fields: str) -> list:
    """The ``top:`` list of the YAML file ``path`` (given as ``config_key``), not empty."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise VerlError(f"{config_key}={path}: no such file")
    try:
        spec = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as e:
        raise VerlError(f"{config_key}={path}: not valid YAML: {e}") from None
    entries = spec.get(top) if isinstance(spec, dict) else None
    if not isinstance(entries, list) or not entries:
        raise VerlError(f"{config_key}={path}: expected a top-level '{top}:' list of entries with {fields}")
    return entries


def load_tool_config(path: str | Path) -> list[BaseTool]:
    """The tools of verl's tool YAML."""
    entries = yaml_entries(path, TOOL_CONFIG_KEY, "tools", "class_name, config and tool_schema")
    tools = []
    for i, entry in enumerate(entries):
        where = f"{TOOL_CONFIG_KEY}={path}, tools[{i}]"
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise VerlError(f"{where}: each entry needs a class_name (a mapping such as class_name: pkg.module.MyTool), "
                            f"got {entry!r:.120}")
        if not isinstance(entry.get("config") or {}, dict):
            raise VerlError(f"{where}: config must be a mapping (config: {{type: native, ...}}), got "
                            f"{entry['config']!r:.120}")
        config = dict(entry.get("config") or {})
        kind = config.get("type", "native")
        if kind != "native":
            raise VerlError(f"{where}: config.type={kind!r}: only native tools (Python classes) are supported here; MCP "
                            f"tools are not")
        cls = import_class(str(entry["class_name"]), where)
        if not (isinstance(cls, type) and issubclass(cls, BaseTool)) and not all(
                hasattr(cls, m) for m in ("create", "execute", "release")):
            raise VerlError(f"{where}: {entry['class_name']} is not a tool class (a BaseTool subclass with create, "
                            f"execute, calc_reward and release)")
        schema = None
        if entry.get("tool_schema") is not None:
            try:
                schema = OpenAIFunctionToolSchema.model_validate(entry["tool_schema"])
            except Exception as e:  # pydantic's ValidationError
                raise VerlError(f"{where}: tool_schema is not an OpenAI function schema: {e}") from None
        if schema is not None:
            check_required(schema, where)
        try:
            tool = cls(config=config, tool_schema=schema)
        except Exception as e:  # a tool's own constructor: a missing config key, no schema, another signature
            raise VerlError(f"{where}: {entry['class_name']}(config=..., tool_schema=...) raised "
                            f"{type(e).__name__}: {str(e)[:300]}") from e
        tools.append(tool)
    return tools


def check_required(schema: OpenAIFunctionToolSchema, where: str) -> None:
    """A schema's ``required`` names only its ``properties`` (else no call the model writes from it can fit)."""
    parameters = schema.function.parameters
    unknown = [name for name in parameters.required if name not in parameters.properties]
    if unknown:
        raise VerlError(f"{where}: tool_schema of {schema.function.name} requires {', '.join(unknown)}, which its "
                        f"parameters.properties do not declare ({', '.join(parameters.properties) or 'none'}); "
                        f"declare them or drop them from required")


def load_tools(tool_config_path: str | None = None, function_tool_path: str | None = None,
               functions: list | None = None) -> dict[str, BaseTool | FunctionTool]:
    """Every tool of a run by name: YAML classes, a file of functions, and functions given in Python."""
    from verl.tools.function_tool import tools_from_functions

    found: list = []
    if tool_config_path:
        found += load_tool_config(tool_config_path)
    if function_tool_path:
        found += load_function_tools(function_tool_path)
    if functions:
        found += tools_from_functions(list(functions))
    tools: dict = {}
    for tool in found:
        if tool.name in tools:
            raise VerlError(f"two tools are named {tool.name!r} (from {TOOL_CONFIG_KEY}, function_tool_path or the "
                            f"functions given); tool names must be unique")
        tools[tool.name] = tool
    return tools
