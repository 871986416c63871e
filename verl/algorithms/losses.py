"""Actor and critic losses: each returns ``(loss: scalar tensor, metrics: dict)``.

Papers: PPO, Schulman et al. 2017 "Proximal Policy Optimization Algorithms"; asymmetric
clipping ("clip-higher"), Yu et al. 2025 "DAPO"; dual-clip, Ye et al. 2020 "Mastering Complex
Control in MOBA Games with Deep Reinforcement Learning"; GSPO, Zheng et al. 2025 "Group
Sequence Policy Optimization".

Deviations and decisions:
* Log-ratios are clamped to [-20, 20] before ``exp``: a stale or broken log-prob must give a
  large-but-finite ratio, not inf/NaN. Inside the clamp nothing changes.
* GSPO accepts ``clip_ratio_c`` only to share PPO's signature (``POLICY_LOSSES`` entries are
  interchangeable); dual-clip is not part of GSPO and is not applied.
* Metrics are 0-d detached tensors (no device sync here) computed over this call's valid
  tokens; the loss itself uses the global denominators given (see ``agg_loss``).
* ``norm_len`` is forwarded to ``agg_loss`` for the ``seq-mean-token-sum-norm`` mode.
"""

from __future__ import annotations

import torch

from verl.algorithms.clipping import _LOG_RATIO_CLAMP, _clip_bounds, _clipped_surrogate
from verl.algorithms.kl import kl_penalty
from verl.algorithms.losses_extra import EXTRA_POLICY_LOSSES
from verl.algorithms.utils import _as_bool, agg_loss, masked_mean

def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    global_tokens=None,
    global_seqs=None,
    norm_len=None,
    rollout_is_weights: torch.Tensor | None = None,
):
    """PPO clipped surrogate with asymmetric (DAPO) and dual (Ye et al. 2020) clipping.

    ratio r = exp(logp - old_logp); per token
    L = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)), and for A < 0 the loss
    is further capped at -A * clip_ratio_c so one very off-policy token cannot dominate.
    ``rollout_is_weights`` ``[B, T]`` (detached, see :mod:`verl.algorithms.rollout_correction`)
    multiply each token's loss when given.
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (it caps -A*ratio from above), got {clip_ratio_c}")
    low, high = _clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    valid = _as_bool(response_mask)
    log_ratio = torch.clamp(log_prob - old_log_prob, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)

    clip_loss, clipped = _clipped_surrogate(ratio, advantages, low, high)
    dual_cap = -advantages * clip_ratio_c
    negative = advantages < 0
    dual_active = negative & (clip_loss > dual_cap)
    pg_losses = torch.where(negative, torch.minimum(clip_loss, dual_cap), clip_loss)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights

    loss = agg_loss(pg_losses, valid, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs,
                    norm_len=norm_len)
    metrics = {
        "actor/pg_clipfrac": masked_mean(clipped.float(), valid).detach(),
        "actor/ppo_kl": masked_mean((old_log_prob - log_prob).detach(), valid),
        "actor/pg_clipfrac_lower": masked_mean(dual_active.float(), valid).detach(),
    }
    return loss, metrics


def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "seq-mean-token-mean",
    global_tokens=None,
    global_seqs=None,
    norm_len=None,
    rollout_is_weights: torch.Tensor | None = None,
):
    """GSPO (Zheng et al. 2025): clip a sequence-level, length-normalised importance ratio.

    s_i = exp(mean over valid tokens of (logp - old_logp)); every token uses
    s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)], whose value is s_i and whose gradient is
    s_i * grad log pi(y_t). The paper's clip ranges are tiny (e.g. 3e-4 / 4e-4): pass them.
    ``rollout_is_weights`` multiply each token's loss when given, as in :func:`compute_policy_loss`.
    """
    low, high = _clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    valid = _as_bool(response_mask)
    seq_log_ratio = masked_mean(log_prob - old_log_prob, valid, dim=-1)
    token_log_ratio = seq_log_ratio.detach().unsqueeze(-1) + log_prob - log_prob.detach()
    ratio = torch.exp(torch.clamp(token_log_ratio, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))

    pg_losses, clipped = _clipped_surrogate(ratio, advantages, low, high)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    loss = agg_loss(pg_losses, valid, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs,
                    norm_len=norm_len)
    metrics = {
        "actor/pg_clipfrac": masked_mean(clipped.float(), valid).detach(),
        "actor/ppo_kl": masked_mean((old_log_prob - log_prob).detach(), valid),
        "actor/pg_clipfrac_lower": torch.zeros((), device=log_prob.device),
    }
    return loss, metrics


# The other losses live in losses_extra; both build on the clipped surrogate of verl.algorithms.clipping.
POLICY_LOSSES = {"vanilla": compute_policy_loss, "gspo": compute_policy_loss_gspo, **EXTRA_POLICY_LOSSES}
# Policy losses verl has and this project does not (yet): named as such when asked for, never
# "corrected" into a loss that only looks alike.
NOT_IMPLEMENTED_LOSSES = {name: f"{name} is a policy loss of verl that this project does not implement yet"
                          for name in ("dppo_kl", "dro", "bypass_mode") if name not in POLICY_LOSSES}


def compute_value_loss(
    vpreds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    global_tokens=None,
    global_seqs=None,
    norm_len=None,
):
    """Clipped value loss: 0.5 * max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2)."""
    valid = _as_bool(response_mask)
    # clamp returns vpreds itself inside the range, so an inactive clip is exact (not off by
    # rounding) and the clip fraction counts only predictions that really left the range.
    vclipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    unclipped_sq = (vpreds - returns) ** 2
    clipped_sq = (vclipped - returns) ** 2
    vf_losses = 0.5 * torch.maximum(unclipped_sq, clipped_sq)
    loss = agg_loss(vf_losses, valid, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs,
                    norm_len=norm_len)
    metrics = {"critic/vf_clipfrac": masked_mean((clipped_sq > unclipped_sq).float(), valid).detach()}
    return loss, metrics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last (vocabulary) dim: logsumexp(z) - sum(p * z)."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def compute_entropy_loss(
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    global_tokens=None,
    global_seqs=None,
    norm_len=None,
):
    """Aggregated entropy (callers subtract ``coef * loss`` to encourage exploration)."""
    loss = agg_loss(entropy, response_mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs,
                    norm_len=norm_len)
    return loss, {"actor/entropy": masked_mean(entropy.detach(), response_mask)}


def compute_kl_loss(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kind: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
    *,
    global_tokens=None,
    global_seqs=None,
    norm_len=None,
):
    """KL(pi || ref) as a loss term (``actor.use_kl_loss``), aggregated like the policy loss."""
    kl = kl_penalty(log_prob, ref_log_prob, kind)
    loss = agg_loss(kl, response_mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs,
                    norm_len=norm_len)
    return loss, {"actor/kl_loss": masked_mean(kl.detach(), response_mask)}
