"""Off-policy correction between the rollout engine and the trained policy.

The engine that samples (vLLM, or HF ``generate`` with top-k/top-p) and the actor's forward pass
are two implementations of "the policy": kernels, precision and sampling filters differ, so
the tokens are drawn from pi_rollout while PPO's ratio assumes pi_old. Weighting each token's
policy loss by the truncated importance ratio min(pi_old / pi_rollout, C) corrects for the
mismatch while bounding the variance.

Papers: truncated importance sampling as in IMPALA's V-trace, Espeholt et al. 2018; applied to
the rollout/trainer mismatch in LLM RL by Yao et al. 2025, "Your Efficient RL Framework Secretly
Brings You Off-Policy RL Training" (TIS).

Decisions:
* The weights are detached: they re-weight the gradient of each token, they have none.
* The log-ratio is clamped to [-20, 20] before ``exp`` (as the policy loss does), so a token the
  engine found almost impossible gives the cap C, not inf.
"""

from __future__ import annotations

import torch

from verl.algorithms.utils import _as_bool, masked_mean

_LOG_RATIO_CLAMP = 20.0


@torch.no_grad()
def truncated_is_weights(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                         threshold: float = 2.0):
    """Per-token weights ``[B, T]`` = min(exp(old_log_prob - rollout_log_prob), threshold).

    Returns ``(weights, metrics)``: ``actor/rollout_is_weight`` (mean weight over valid tokens)
    and ``actor/rollout_is_clipfrac`` (fraction of valid tokens at the cap). Weights are 0 on
    masked positions.
    """
    if threshold <= 0:
        raise ValueError(f"the importance-ratio cap must be > 0, got {threshold}")
    valid = _as_bool(response_mask)
    log_ratio = torch.clamp(old_log_prob - rollout_log_prob, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    weights = torch.where(valid, torch.clamp(ratio, max=threshold), torch.zeros_like(ratio))
    metrics = {"actor/rollout_is_weight": masked_mean(weights, valid),
               "actor/rollout_is_clipfrac": masked_mean((ratio > threshold).float(), valid)}
    return weights, metrics
