"""Plain Python functions as tools: the schema comes from the signature and the docstring.

Two ways to mark them, and a file may use either:

* TRL's: every public function of the file (defined there, not imported; no leading underscore)
  that has type hints and a Google-style docstring (a summary, then an ``Args:`` block naming
  every parameter) is a tool;
* verl's: functions decorated with :func:`function_tool` (``from verl.tools.function_tool import
  function_tool``); when a file decorates any, only those are tools.

The schema is built by ``transformers.utils.get_json_schema``, the function Hugging Face chat
templates take for ``tools=``. A function may be ``async``; a plain one runs in a thread, so slow
calls of several trajectories overlap. It returns a string (the tool message), a
:class:`~verl.tools.schemas.ToolResponse`, or ``(response, reward, metrics)``; anything else is
shown to the model as JSON (or ``str()``).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from verl.errors import VerlError
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

_DECORATED: dict[str, list[FunctionTool]] = {}
"""Module name -> the tools :func:`function_tool` registered while that module ran."""


@dataclass
class FunctionTool:
    """A function and its schema; ``name`` is what the model calls."""

    name: str
    fn: Callable[..., Any]
    tool_schema: OpenAIFunctionToolSchema

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    async def call(self, parameters: dict[str, Any]) -> tuple[ToolResponse, float, dict]:
        return normalize_tool_result(await self.invoke(parameters))

    async def invoke(self, parameters: dict[str, Any]) -> Any:
        """What the function returns for ``parameters``; a plain function runs in a daemon thread of its own
        (:func:`verl.agent.events.run_in_thread`: one that never returns holds up no other call)."""
        from verl.agent.events import run_in_thread

        self._check_arguments(parameters)
        return await self.fn(**parameters) if self.is_async else await run_in_thread(self.fn, **parameters)

    def _check_arguments(self, parameters: dict[str, Any]) -> None:
        """A TypeError the model can learn from, in the schema's terms, for arguments the function cannot take
        (before: Python's own text, e.g. "echo.<locals>.fn() got an unexpected keyword argument 'txt'")."""
        try:
            inspect.signature(self.fn).bind(**parameters)
        except TypeError:
            pass
        else:
            return
        declared = self.tool_schema.function.parameters
        names = ", ".join(f"{n} (required)" if n in declared.required else n for n in declared.properties) or "none"
        unknown = [k for k in parameters if k not in declared.properties]
        missing = [n for n in declared.required if n not in parameters]
        problems = ([f"no argument {', '.join(map(repr, unknown))}"] if unknown else []) + \
                   ([f"{', '.join(map(repr, missing))} missing"] if missing else [])
        raise TypeError(f"{self.name} got {'; '.join(problems) or 'arguments it cannot take'}; its arguments: {names}")


def normalize_tool_result(result: Any) -> tuple[ToolResponse, float, dict]:
    """A tool's return value as ``(response, reward, metrics)``."""
    if isinstance(result, tuple) and len(result) == 3:
        response, reward, metrics = result
        return _response(response), float(reward or 0.0), dict(metrics or {})
    return _response(result), 0.0, {}


def _response(value: Any) -> ToolResponse:
    if isinstance(value, ToolResponse):
        return value
    if isinstance(value, str):
        return ToolResponse(text=value)
    try:
        return ToolResponse(text=json.dumps(value))
    except (TypeError, ValueError):
        return ToolResponse(text=str(value))


def schema_of(fn: Callable, name: str | None = None) -> OpenAIFunctionToolSchema:
    """The OpenAI tool schema of ``fn``, or a VerlError saying what the function lacks."""
    from transformers.utils import get_json_schema

    code = getattr(fn, "__code__", None)  # named by its file: the module of a tool file has a generated name
    label = f"{getattr(fn, '__qualname__', fn)} in {code.co_filename}" if code is not None else \
        f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
    variadic = [p.name for p in inspect.signature(fn).parameters.values()
                if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if variadic:
        raise VerlError(f"tool {label}: *args / **kwargs ({', '.join(variadic)}) cannot be described to the model; "
                        f"name every parameter")
    try:
        raw = get_json_schema(fn)
    except Exception as e:  # transformers' DocstringParsingException / TypeHintParsingException
        raise VerlError(f"tool {label}: {e}. A tool function needs a type hint on every parameter and a docstring "
                        f"with a summary and an 'Args:' block describing each parameter (Google style)") from None
    if name:
        raw["function"]["name"] = name
    return OpenAIFunctionToolSchema.model_validate(raw)


def function_tool(name: str | Callable | None = None, *, schema: OpenAIFunctionToolSchema | dict | None = None):
    """verl's decorator: ``@function_tool``, ``@function_tool("other_name")`` or
    ``@function_tool(schema={...})`` (a schema given outright). The function is returned unchanged."""

    def register(fn: Callable, tool_name: str | None) -> Callable:
        tool_name = tool_name or fn.__name__
        if isinstance(schema, dict):
            built = OpenAIFunctionToolSchema.model_validate(schema)
        else:
            built = schema if schema is not None else schema_of(fn, tool_name)
        if schema is not None:
            _check_schema_fits(fn, built)
        _DECORATED.setdefault(fn.__module__, []).append(FunctionTool(tool_name, fn, built))
        return fn

    if callable(name):
        return register(name, None)
    return lambda fn: register(fn, name)


def _check_schema_fits(fn: Callable, schema: OpenAIFunctionToolSchema) -> None:
    """A schema given to ``@function_tool(schema=...)`` must name the function's parameters: else every call
    written from it fails, and the model is taught that following the schema is wrong."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
        return
    names = {p.name for p in params if p.kind != inspect.Parameter.VAR_POSITIONAL}
    needed = {p.name for p in params if p.default is inspect.Parameter.empty
              and p.kind not in (inspect.Parameter.VAR_POSITIONAL,)}
    declared = set(schema.function.parameters.properties)
    unknown, missing = sorted(declared - names), sorted(needed - declared)
    if unknown or missing:
        raise VerlError(f"tool {schema.function.name}: its schema does not fit {fn.__qualname__}"
                        f"{inspect.signature(fn)}: " + "; ".join(
                            ([f"the schema's {', '.join(unknown)} is no parameter of the function"] if unknown else [])
                            + ([f"the function's {', '.join(missing)} is not in the schema"] if missing else []))
                        + "; make the schema's parameters.properties the function's parameters")
    from verl.tools.registry import check_required

    check_required(schema, f"tool {schema.function.name}")


def tools_from_functions(functions: list[Callable]) -> list[FunctionTool]:
    """Tools from functions given in Python (TRL's ``tools=[...]``)."""
    return [FunctionTool(fn.__name__, fn, schema_of(fn)) for fn in functions]


def load_function_tools(path: str | Path, key: str = "actor_rollout_ref.rollout.multi_turn.function_tool_path"
                        ) -> list[FunctionTool]:
    """The tools of a Python file (see the module docstring); ``key`` names the setting in errors."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise VerlError(f"{key}={path}: no such file; give a Python file of tool functions")
    module_name = f"verl_user_tools_{abs(hash(str(file)))}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # so that its functions' annotations and dataclasses resolve
    _DECORATED.pop(module_name, None)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise VerlError(f"{key}={path}: the file failed to run: {type(e).__name__}: {e}") from e
    decorated = _DECORATED.get(module_name)
    if decorated:
        return list(decorated)
    functions = [value for attr, value in vars(module).items()
                 if inspect.isfunction(value) and not attr.startswith("_") and value.__module__ == module_name]
    if not functions:
        raise VerlError(f"{key}={path}: the file defines no public function; every public function with type hints "
                        f"and a docstring becomes a tool")
    return [FunctionTool(fn.__name__, fn, schema_of(fn)) for fn in functions]
