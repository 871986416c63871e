"""The interaction class interface of verl: the simulated user of a multi-turn rollout.

A class declared in verl's interaction YAML (``actor_rollout_ref.rollout.multi_turn.
interaction_config_path``) subclasses :class:`BaseInteraction`, so an interaction written against
verl's documented interface imports and runs here unchanged. One instance serves every trajectory;
``instance_id`` tells them apart. How the rollout calls it: :mod:`verl.agent.interactions`.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4


class BaseInteraction:
    """``config``: the entry's ``config`` block, with its ``name`` added."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.name: str = config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs) -> str:
        """Start one trajectory's state; ``kwargs`` are the row's ``extra_info.interaction_kwargs``.
        Returns the instance id."""
        return instance_id or str(uuid4())

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs) -> tuple[bool, str, float, dict[str, Any]]:
        """Answer the conversation so far (``messages``, the model's last turn at the end):
        ``(should_terminate_sequence, reply, turn_score, extra)``."""
        return False, "Your current result seems acceptable.", 0.0, {}

    async def calculate_score(self, instance_id: str | None = None, **kwargs) -> float:
        """A score for the interaction so far (for the subclass's own use)."""
        return 0.0

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs) -> None:
        """Drop the trajectory's state."""
