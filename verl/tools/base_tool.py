"""The tool class interface of verl: a tool with per-trajectory state.

A tool declared in a tool YAML (``actor_rollout_ref.rollout.multi_turn.tool_config_path``) is a
subclass of :class:`BaseTool`. For every trajectory that may call it, the rollout calls
``create`` once, ``execute`` for each call the model makes, ``calc_reward`` at the end (an extra
reward for the trajectory) and ``release``. All four are coroutines; a tool that blocks (a
subprocess, a web request) should run that part in a thread (``asyncio.to_thread``) so that the
other trajectories' calls go on meanwhile.

The names and signatures are verl's (``verl.tools.base_tool.BaseTool``), so a tool class written
against verl's documented interface runs here unchanged.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


class BaseTool:
    """``config``: the tool's ``config`` block of the YAML; ``tool_schema``: its ``tool_schema`` block
    (None = the subclass's :meth:`get_openai_tool_schema`)."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        self.config = config
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__}: no tool_schema given in the tool config, and the class does "
                             f"not define get_openai_tool_schema()")
        self.name = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema | None:
        return getattr(self, "tool_schema", None)

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        """Start the tool's state for one trajectory; ``kwargs`` are the row's ``tools_kwargs[name]
        ["create_kwargs"]``. Returns the instance id and a response (usually empty)."""
        return instance_id or str(uuid4()), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        """Run one call: ``(response, a reward for this step, metrics)``."""
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        """The tool's reward for the whole trajectory (added to the reward function's score)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        """Drop the trajectory's state."""
