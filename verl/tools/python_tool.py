"""The built-in ``python`` tool: the model's code runs in the sandbox of the code rewards.

Declare it in a tool YAML (``actor_rollout_ref.rollout.multi_turn.tool_config_path``)::

    tools:
      - class_name: verl.tools.python_tool.PythonTool
        config: {timeout: 5, memory_limit_mb: 512, num_workers: 4}

The schema is built in (a tool named ``python`` with one ``code`` argument); give a ``tool_schema``
block to rename it or describe it otherwise. Each call is a fresh program in
:func:`verl.rewards.sandbox.run_python` (no network, no access to the trainer's files, CPU, memory
and wall-clock limits): the tool answers with what the program printed, and for a program that
failed also with the end of its error output, so the model can see and fix its mistake. Calls run
in threads, ``num_workers`` at a time across the batch.
"""

from __future__ import annotations

import asyncio
from typing import Any

from verl.errors import VerlError
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

PYTHON_SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run a Python program and return what it prints. Nothing is kept between calls: "
                       "print every result you need.",
        "parameters": {"type": "object", "required": ["code"],
                       "properties": {"code": {"type": "string", "description": "The program, e.g. print(123*45)."}}},
    },
}
# The end of a failed program's stderr that the model sees (the traceback's last lines).
ERROR_TAIL_CHARS = 800


class PythonTool(BaseTool):
    """``config``: ``timeout`` (wall-clock seconds per call, 5), ``memory_limit_mb`` (512),
    ``num_workers`` (calls at once, 4)."""

    timeout_key = "timeout"

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        super().__init__(config, tool_schema)
        self.timeout = _positive(config, self.timeout_key, 5.0, type(self).__name__)
        self.memory_mb = _positive(config, "memory_limit_mb", 512, type(self).__name__)
        self.workers = int(_positive(config, "num_workers", 4, type(self).__name__))
        self._slots: asyncio.Semaphore | None = None

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema.model_validate(PYTHON_SCHEMA)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        code = parameters.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResponse(text="Error: give the program as a non-empty string argument 'code'"), 0.0, {}
        if self._slots is None:  # made on the loop the calls run on
            self._slots = asyncio.Semaphore(self.workers)
        async with self._slots:
            result = await asyncio.to_thread(self.run, code)
        return ToolResponse(text=describe(result, self.timeout)), 0.0, {"status": result.status}

    def run(self, code: str):
        from verl.rewards.sandbox import SandboxLimits, run_python

        limits = SandboxLimits(wall_seconds=self.timeout, cpu_seconds=max(1, int(self.timeout + 0.999)),
                               memory_bytes=int(self.memory_mb * 2**20))
        return run_python(code, limits=limits)


def describe(result, timeout: float) -> str:
    """What the model reads back: the program's output, and why it stopped when it failed."""
    out = result.stdout.rstrip("\n")
    if result.status == "ok":
        return out if out else "(the program printed nothing: print the values you need)"
    reason = {"timeout": f"Error: the program ran past its {timeout:g} s limit",
              "memory": "Error: the program ran out of memory",
              "blocked": "Error: the sandbox refused an operation (files, network and processes are not allowed)",
              "killed": "Error: the program was killed"}.get(result.status)
    # The traceback without the sandbox's own frame (the program is "<solution>"), from the end only: 4 MiB
    # of short lines on stderr, split whole, made ~1.4 million strings (~90 MiB) in the trainer per call.
    stderr = "\n".join(line for line in result.stderr[-4 * ERROR_TAIL_CHARS:].splitlines()
                       if '"<verl-sandbox>"' not in line)
    tail = stderr[-ERROR_TAIL_CHARS:].strip()
    parts = [out.rstrip()] if out.strip() else []
    if tail:
        parts.append(tail)
    if reason:
        parts.append(reason)
    return "\n".join(parts) or f"Error: the program exited with status {result.returncode}"


def _positive(config: dict, key: str, default: float, owner: str) -> float:
    value = config.get(key, default)
    if value is None:
        return default
    try:
        value = float(value)
    except (TypeError, ValueError):
        value = -1.0
    if value <= 0:
        raise VerlError(f"{owner}: config.{key}={config.get(key)!r} must be a positive number (default {default})")
    return value
