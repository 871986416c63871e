"""verl's ``verl.tools.sandbox_fusion_tools.SandboxFusionTool``, run in the built-in sandbox.

verl's code-interpreter recipes (ReTool, the GSM8K tool example) declare this class in their tool
YAML with the address of a SandboxFusion service. Here the same YAML runs unchanged and the code
runs locally, in the sandbox of the code rewards (:mod:`verl.tools.python_tool`): the program's
output is what SandboxFusion returns for Python. Its config keys: ``default_timeout`` (seconds),
``memory_limit_mb``, ``num_workers``; ``default_language`` must be ``python``; ``sandbox_fusion_url``,
``rate_limit`` and ``enable_global_rate_limit`` are not used (no service is contacted).
"""

from __future__ import annotations

import logging
from typing import Any

from verl.errors import VerlError
from verl.tools.python_tool import PythonTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

logger = logging.getLogger(__name__)


class SandboxFusionTool(PythonTool):
    timeout_key = "default_timeout"

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        super().__init__(config, tool_schema)
        language = config.get("default_language") or "python"
        if language != "python":
            raise VerlError(f"SandboxFusionTool: config.default_language={language!r}: the built-in sandbox runs "
                            f"Python only; set default_language: python")
        if config.get("sandbox_fusion_url"):
            logger.warning("SandboxFusionTool %r: code runs in the built-in local sandbox; sandbox_fusion_url=%s is not "
                           "contacted", self.name, config["sandbox_fusion_url"])

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        language = parameters.get("language") or "python"
        if language != "python":
            return ToolResponse(text=f"Error: language {language!r} is not available; only python runs here"), 0.0, {}
        return await super().execute(instance_id, parameters, **kwargs)
