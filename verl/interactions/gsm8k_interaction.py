"""verl's GSM8K interaction (``class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction``), as verl's
``gsm8k_interaction_config.yaml`` names it: a simulated user who grades each answer.

The row's ``extra_info.interaction_kwargs`` (``{query, ground_truth}``, as verl's
``gsm8k_multiturn_w_interaction.py`` preprocessing writes them) start each trajectory. After every
model turn the last assistant message is graded with the GSM8K scorer's strict method (the number
after ``####``): right ends the conversation with "Your response is correct!" and turn score 1.0;
otherwise the user asks for another try (turn score 0.0), until the turn limit.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.interactions.base import BaseInteraction
from verl.rewards.scorers.gsm8k import compute_score

CORRECT = "Your response is correct!"
TRY_AGAIN = "Your response is incorrect! You need to reflect on your answer and try again."


class Gsm8kInteraction(BaseInteraction):
    """Grades the model's latest answer against the trajectory's ground truth."""

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        self._state: dict[str, dict[str, Any]] = {}

    async def start_interaction(self, instance_id: str | None = None, ground_truth: Any = None, **kwargs) -> str:
        instance_id = instance_id or str(uuid4())
        self._state[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs) -> tuple[bool, str, float, dict[str, Any]]:
        last = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        self._state[instance_id]["response"] = last
        reward = await self.calculate_score(instance_id)
        return (True, CORRECT, reward, {}) if reward == 1.0 else (False, TRY_AGAIN, reward, {})

    async def calculate_score(self, instance_id: str | None = None, **kwargs) -> float:
        state = self._state[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return compute_score("openai/gsm8k", str(state["response"]), state["ground_truth"], method="strict",
                             format_score=0.0, score=1.0)

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs) -> None:
        self._state.pop(instance_id, None)
