"""verl's GSM8K tool (``class_name: verl.tools.gsm8k_tool.Gsm8kTool``), as verl's multi-turn GSM8K tool
config (``gsm8k_tool_config.yaml``, tool ``calc_gsm8k_reward``) names it.

The model submits an answer; the tool grades it against the row's ground truth
(``extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth``, as verl's
``gsm8k_multiturn_w_tool.py`` preprocessing writes it) and says the grade back. As in verl:

* the answer is graded as ``#### <answer>`` with the GSM8K scorer's flexible method (the last
  number counts): 1.0 right, 0.0 otherwise;
* each call's step reward is 0.0 when the grade went up, else -0.05 (a resubmission that does not
  improve is penalised);
* ``calc_reward`` is the grade of the last submission.

With ``multi_turn.add_agent_rewards=true`` (the default here) these rewards are added to the score;
``false`` leaves them to the reward function, as verl does (docs/agents.md).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.rewards.scorers.gsm8k import compute_score
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

NO_GAIN_PENALTY = -0.05


class Gsm8kTool(BaseTool):
    """Grades a submitted GSM8K answer against the trajectory's ground truth."""

    def __init__(self, config: dict, tool_schema):
        super().__init__(config, tool_schema)
        self._state: dict[str, dict[str, Any]] = {}

    async def create(self, instance_id: str | None = None, ground_truth: Any = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        if ground_truth is None:  # verl also takes it nested under create_kwargs
            ground_truth = (kwargs.get("create_kwargs") or {}).get("ground_truth")
        self._state[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        state = self._state[instance_id]
        answer = str(parameters.get("answer", ""))
        state["response"] = answer if answer.startswith("#### ") else f"#### {answer}"
        reward = await self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else NO_GAIN_PENALTY
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed answer={answer!r} reward={reward!r}"), step_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self._state[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return compute_score("openai/gsm8k", state["response"], state["ground_truth"], method="flexible",
                             format_score=0.0, score=1.0)

    async def release(self, instance_id: str, **kwargs) -> None:
        self._state.pop(instance_id, None)
