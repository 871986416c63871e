"""The reward role: scores responses and places the score on each response's last token."""

from __future__ import annotations

from verl.protocol import Batch
from verl.rewards.manager import RuleRewardManager


class RewardWorker:
    def __init__(self, tokenizer, compute_score=None, reward_fn_key: str = "data_source"):
        self.manager = RuleRewardManager(tokenizer, compute_score=compute_score, reward_fn_key=reward_fn_key)

    def score(self, batch: Batch) -> Batch:
        """``token_level_scores`` ``[B, T_resp]``; extra keys a reward function returned become columns."""
        scores, extra = self.manager(batch)
        out = Batch({"token_level_scores": scores})
        for key, values in extra.items():
            out[f"reward_extra/{key}"] = values
        return out
