"""KL(pi || ref) estimators, KL-coefficient controllers, and the KL penalty folded into rewards.

Papers: J. Schulman, "Approximating KL Divergence" (blog note, 2020) for k1/k2/k3;
Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences", for the adaptive
controller.

Deviations:
* ``k3`` clamps the log-ratio to [-20, 20] before ``exp`` and the estimate to [-10, 10]. k3 is
  >= 0 mathematically, so only the upper bound ever acts: a token that ref finds e^20 times
  less likely than pi would otherwise give an inf (and a NaN gradient through the clamp).
* ``apply_kl_in_reward``'s metric averages over sequences that have at least one response
  token; an empty response has no KL to report and would drag the mean (and the adaptive
  controller fed from it) towards 0.
"""

from __future__ import annotations

import torch

from verl.algorithms.utils import _as_bool, masked_mean

KL_KINDS = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate ``[B, T]`` of KL(pi || ref) from tokens sampled from pi.

    Following Schulman's "Approximating KL Divergence", with r = ref / pi:
      * ``k1`` / ``kl``: -log r = logp - logref (unbiased, high variance, can be negative).
      * ``abs``: |logp - logref|.
      * ``k2`` / ``mse``: 0.5 * (log r)^2 (biased, low variance, >= 0).
      * ``k3`` / ``low_var_kl``: r - 1 - log r (unbiased, low variance, >= 0), clamped to
        [-10, 10] as a numerical guard.
    """
    diff = log_prob - ref_log_prob
    if kind in ("k1", "kl"):
        return diff
    if kind == "abs":
        return diff.abs()
    if kind in ("k2", "mse"):
        return 0.5 * diff.square()
    if kind in ("k3", "low_var_kl"):
        log_r = torch.clamp(-diff, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(log_r) - log_r - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; allowed: {', '.join(KL_KINDS)}")


class FixedKLController:
    """A constant KL coefficient; ``update`` is a no-op so callers need not branch."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """Ziegler et al. 2019: steer the coefficient so the measured KL tracks ``target_kl``.

    error = clip(current_kl / target_kl - 1, -0.2, 0.2); value *= 1 + error * n_steps / horizon.
    ``n_steps`` is the number of samples behind ``current_kl`` (the paper's batch size).
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float):
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"adaptive KL needs target_kl > 0 and horizon > 0, got {target_kl} and {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def make_kl_controller(kind: str, kl_coef: float, target_kl: float | None = None, horizon: float | None = None):
    """``"fixed"`` -> FixedKLController(kl_coef); ``"adaptive"`` -> AdaptiveKLController."""
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError("adaptive KL controller needs target_kl and horizon")
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller {kind!r}; allowed: fixed, adaptive")


@torch.no_grad()
def apply_kl_in_reward(
    token_level_scores: torch.Tensor,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kind: str,
):
    """rewards = scores - kl_coef * KL per token on valid tokens (the InstructGPT-style penalty).

    Returns ``(token_level_rewards, metrics)`` with ``actor/reward_kl_penalty`` (per-sequence
    mean KL, averaged over non-empty sequences) and ``actor/reward_kl_penalty_coeff``.
    """
    valid = _as_bool(response_mask)
    kl = torch.where(valid, kl_penalty(log_prob, ref_log_prob, kind), torch.zeros_like(log_prob))
    rewards = token_level_scores - kl_coef * kl
    seq_kl = masked_mean(kl, valid, dim=-1)
    current_kl = masked_mean(seq_kl, valid.any(dim=-1))
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": float(kl_coef)}
    return rewards, metrics
