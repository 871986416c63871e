"""The reward role: rule scores (and optionally a learned reward model's), placed on each
response's last token."""

from __future__ import annotations

import torch

from verl.protocol import Batch
from verl.rewards.manager import RuleRewardManager


class RewardWorker:
    """Scores a rollout batch.

    Args:
        manager: the rule reward manager, or None when only a reward model scores.
        reward_model: an object with ``score(batch) -> [B]`` (``verl.workers.reward_model``), or None.
        reward_model_weight: the reward model's score is multiplied by this before it is added.
    """

    def __init__(self, manager: RuleRewardManager | None, reward_model=None, reward_model_weight: float = 1.0):
        if manager is None and reward_model is None:
            raise ValueError("RewardWorker needs a rule reward manager, a reward model, or both")
        self.manager = manager
        self.reward_model = reward_model
        self.reward_model_weight = reward_model_weight

    def score(self, batch: Batch) -> Batch:
        """``token_level_scores`` ``[B, T_resp]``; extra keys a reward function returned become
        ``reward_extra/<key>`` columns, and a reward model's raw score ``reward_extra/rm_score``."""
        mask = batch["response_mask"]
        columns: dict[str, list] = {}
        if self.manager is not None:
            scores, columns = self.manager(batch)
        else:
            scores = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        if self.reward_model is not None:
            rm = self.reward_model.score(batch).to(scores.device, scores.dtype)
            last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & mask.bool()
            scores = scores + self.reward_model_weight * rm[:, None] * last
            columns["rm_score"] = rm.tolist()
        out = Batch({"token_level_scores": scores})
        for key, values in columns.items():
            out[f"reward_extra/{key}"] = values
        return out
