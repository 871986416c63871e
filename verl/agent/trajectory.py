"""A multi-turn trajectory as the agent loop (:mod:`verl.agent.agent_loop`) builds it: the exact token ids
the model drew and the tool results or replies spliced in between (out of the loss), the images it
holds, its counts; and the loop's settings (``actor_rollout_ref.rollout.multi_turn.*``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AgentSettings:
    """``actor_rollout_ref.rollout.multi_turn.*``, as the loop reads them."""

    max_assistant_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    format: str = "hermes"
    tool_timeout_s: float = 30.0
    max_user_turns: int | None = None


@dataclass
class Trajectory:
    prompt_ids: list[int]
    seed: int
    row: int
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    assistant_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_reward: float = 0.0
    tool_rewards: list[float] = field(default_factory=list)  # each call's execute reward
    user_turns: int = 0
    turn_rewards: list[float] = field(default_factory=list)
    version_last: int = -1  # the policy version that drew its last token (partial rollouts)
    defaulted: int = 0  # values missing from the row or the environment that took a default (warned once)
    done: bool = False
    instances: dict[str, str] = field(default_factory=dict)
    env: object = None
    media: dict | None = None  # a vision-language row's images: the prompt's, then the tools', in order

    def extend(self, ids: list[int], trained: bool, logprobs: list[float] | None = None) -> None:
        self.tokens += ids
        self.mask += [1 if trained else 0] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def splice(self, ids: list[int], max_new_tokens: int, media: dict | None = None) -> None:
        """Append a tool result or a reply (not trained on), cut at the response budget; a trajectory
        whose budget ends inside it has nothing left to generate. With ``media`` (the images it holds)
        it goes in whole or not at all."""
        room = max_new_tokens - len(self.tokens)
        if media is not None:
            if len(ids) > room:
                self.done = True
                return
            self.media = media if self.media is None else {
                key: torch.cat([self.media[key], media[key]]) for key in ("pixel_values", "image_grid_thw")}
        self.extend(ids[:room], trained=False)
        if len(ids) >= room:
            self.done = True


def truncate_text(text: str, limit: int, side: str) -> str:
    """``text`` cut to ``limit`` characters on ``side`` (left, middle or right), marked where cut."""
    if len(text) <= limit:
        return text
    if side == "left":
        return "..." + text[-limit:]
    if side == "right":
        return text[:limit] + "..."
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[-(limit - half):]
