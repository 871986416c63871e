"""Rule rewards: decode each response, score it with a python function, place the score.

The score of a response goes on its last valid token (the last position where ``response_mask``
is 1); all other positions are 0. A response with no valid token has nowhere to put its score:
the scorer is still called (so the per-sample extras stay aligned), the score is dropped, and a
warning counts such responses.
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import Any, Callable

import numpy as np
import torch

from verl.protocol import Batch
from verl.rewards.errors import RewardError
from verl.rewards.scorers import get_scorer

logger = logging.getLogger(__name__)


def _name_of(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _as_score(value: Any, fn: Callable, sample: int) -> tuple[float, dict]:
    """``(score, extras)`` from what a scorer returned: a number, a bool, or a dict with "score"."""
    extras: dict = {}
    raw = value
    if isinstance(value, dict):
        if "score" not in value:
            raise RewardError(f"reward function {_name_of(fn)} returned a dict without a 'score' key for "
                              f"sample {sample}: {value!r:.300}")
        extras = {k: v for k, v in value.items() if k != "score"}
        value = value["score"]
    if isinstance(value, (bool, np.bool_)):
        return float(value), extras
    if isinstance(value, numbers.Real) and not math.isnan(float(value)):
        return float(value), extras
    raise RewardError(f"reward function {_name_of(fn)} returned {raw!r:.300} for sample {sample}; "
                      f"it must return a float (not NaN), an int, a bool, or a dict with a 'score'")


class RuleRewardManager:
    """Turns responses into ``token_level_scores`` with a rule function.

    Args:
        tokenizer: decodes the responses (special tokens skipped).
        compute_score: ``fn(data_source, solution_str, ground_truth, extra_info) -> float | dict``,
            called with keywords. None: the built-in scorer for each row's data source
            (``verl.rewards.scorers.SCORERS``).
        reward_fn_key: the column whose value is passed as ``data_source``.
    """

    def __init__(self, tokenizer, compute_score: Callable[..., Any] | None = None,
                 reward_fn_key: str = "data_source"):
        self.tokenizer = tokenizer
        self.compute_score = compute_score
        self.reward_fn_key = reward_fn_key

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, dict[str, list]]:
        """``(token_level_scores [B, T_resp] float32, extras)``; ``extras`` maps every non-score key
        any dict return held to a list of length B (None where a sample did not return that key)."""
        responses, mask = batch["responses"], batch["response_mask"].bool()
        size = len(batch)
        columns = {key: batch[key] if key in batch else [None] * size
                   for key in (self.reward_fn_key, "ground_truth", "extra_info")}
        texts = self.tokenizer.batch_decode([responses[i][mask[i]].tolist() for i in range(size)],
                                            skip_special_tokens=True)

        scores = torch.zeros(responses.shape, dtype=torch.float32)
        extras: dict[str, list] = {}
        num_empty = 0
        for i in range(size):
            data_source = columns[self.reward_fn_key][i]
            fn = self.compute_score or get_scorer(data_source)
            try:
                value = fn(data_source=data_source, solution_str=texts[i],
                           ground_truth=columns["ground_truth"][i], extra_info=columns["extra_info"][i])
            except Exception as e:
                raise RewardError(f"reward function {_name_of(fn)} raised {type(e).__name__}: {e} on sample {i} "
                                  f"(data_source={data_source!r}, solution_str={texts[i]!r:.200})") from e
            score, sample_extras = _as_score(value, fn, i)
            for key, v in sample_extras.items():
                extras.setdefault(key, [None] * size)[i] = v
            valid = mask[i].nonzero()
            if len(valid) == 0:
                num_empty += 1
                continue
            scores[i, valid[-1, 0]] = score
        if num_empty:
            logger.warning("%d of %d responses are empty; their scores were not placed", num_empty, size)
        return scores.to(responses.device), extras
