"""DAPO's data-side techniques as pure tensor functions: dynamic sampling, overlong reward
shaping, and overlong (truncated-response) filtering.

Paper: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"
(section 3.2 dynamic sampling, 3.4 overlong reward shaping). Clip-higher, the fourth DAPO
technique, is ``clip_ratio_high`` of the policy loss (:mod:`verl.algorithms.losses`); the
token-level loss is the ``token-mean`` aggregation (:func:`verl.algorithms.utils.agg_loss`).

Deviations and decisions:
* Dynamic sampling compares a group's values for exact equality: groups whose samples all
  score the same carry no GRPO signal (every advantage is 0), however many samples they have.
  A group of one sample is always "all equal" and is dropped.
* The soft overlong penalty is applied to responses that end inside the last ``buffer_len``
  tokens before ``max_response_length``; a response cannot be longer than that maximum here
  (the engine stops there), so the paper's "-1 beyond L_max" case is the penalty at exactly
  L_max: ``-penalty_factor``.
* A truncated response is one whose last position (``max_response_length``, the width of the
  response columns) holds a real token that is not EOS.
"""

from __future__ import annotations

import numpy as np
import torch

from verl.algorithms.utils import _as_bool


def _group_ids(group_index) -> np.ndarray:
    raw = group_index.tolist() if torch.is_tensor(group_index) else list(group_index)
    lookup: dict = {}
    return np.array([lookup.setdefault(g, len(lookup)) for g in raw], dtype=np.int64)


def groups_with_variance(values: torch.Tensor, group_index) -> torch.Tensor:
    """``[B]`` bool: True for samples whose group (same ``group_index``) holds at least two
    different values. DAPO's dynamic sampling keeps exactly these samples.

    ``values`` is ``[B]``, one number per sample (e.g. its summed score); ``group_index`` is a
    sequence or tensor of ``B`` hashable prompt ids.
    """
    ids = torch.from_numpy(_group_ids(group_index)).to(values.device)
    if ids.numel() != values.numel():
        raise ValueError(f"group_index has {ids.numel()} entries but there are {values.numel()} values")
    n_groups = int(ids.max()) + 1 if ids.numel() else 0
    low = values.new_full((n_groups,), float("inf")).scatter_reduce(0, ids, values, "amin")
    high = values.new_full((n_groups,), float("-inf")).scatter_reduce(0, ids, values, "amax")
    return (high > low)[ids]


def overlong_penalty(response_lengths: torch.Tensor, max_response_length: int, buffer_len: int,
                     penalty_factor: float) -> torch.Tensor:
    """DAPO's soft overlong punishment ``[B]`` (<= 0) for responses of the given lengths.

    With L_max = ``max_response_length`` and L_cache = ``buffer_len``:
    0 for |y| <= L_max - L_cache, else ((L_max - L_cache) - |y|) / L_cache * ``penalty_factor``,
    which falls linearly to ``-penalty_factor`` at |y| = L_max.
    """
    if not 0 < buffer_len <= max_response_length:
        raise ValueError(f"buffer_len must be in [1, max_response_length={max_response_length}], got {buffer_len}")
    exceed = response_lengths.float() - (max_response_length - buffer_len)
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


def add_to_last_token(token_level_scores: torch.Tensor, response_mask: torch.Tensor,
                      per_sequence: torch.Tensor) -> torch.Tensor:
    """``token_level_scores`` with ``per_sequence[i]`` added on row i's last valid token (rows
    without a valid token are left as they are)."""
    valid = _as_bool(response_mask)
    lengths = valid.sum(-1)
    last = (lengths - 1).clamp(min=0)
    out = token_level_scores.clone()
    rows = torch.arange(out.shape[0], device=out.device)
    addend = per_sequence.to(out.dtype)
    out[rows, last] += torch.where(lengths > 0, addend, torch.zeros_like(addend))
    return out


def truncated_responses(responses: torch.Tensor, response_mask: torch.Tensor, eos_token_ids) -> torch.Tensor:
    """``[B]`` bool: responses cut off at the length limit, i.e. whose last column (the
    ``max_response_length``-th token) is a real token and not EOS.

    DAPO's overlong filtering masks such samples out of the loss: their reward says nothing
    about an answer the model never finished.
    """
    last_valid = _as_bool(response_mask)[:, -1]
    ends_with_eos = torch.isin(responses[:, -1], torch.as_tensor(list(eos_token_ids), device=responses.device))
    return last_valid & ~ends_with_eos
