"""More policy losses of verl, with the signature of :func:`verl.algorithms.losses.compute_policy_loss`.

Every function takes ``(old_log_prob, log_prob, advantages, response_mask)`` and the keywords the
actor passes to any entry of ``POLICY_LOSSES`` (``clip_ratio*``, ``loss_agg_mode``, the global
counts, ``rollout_is_weights``), and returns ``(loss, metrics)``. Keywords a loss does not use are
accepted and ignored, so that the entries stay interchangeable.

Papers: CISPO, MiniMax 2025 "MiniMax-M1"; GMPO, Zhao et al. 2025 "Geometric-Mean Policy
Optimization"; GPG, Chu et al. 2025 "GPG: A Simple and Strong Reinforcement Learning Baseline for
Model Reasoning"; SAPO, Gao et al. 2025 "Soft Adaptive Policy Optimization"; Clip-Cov and KL-Cov,
Cui et al. 2025 "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models";
DPPO, "Divergence Proximal Policy Optimization" (arXiv 2602.04879).

Decisions (beyond those of :mod:`verl.algorithms.losses`, whose log-ratio clamp is kept):
* Loss-specific settings (``tau_pos``/``tau_neg``, ``clip_cov_*``, ``kl_cov_ratio``,
  ``ppo_kl_coef``) are keywords whose defaults are verl's config defaults.
* ``sapo`` aggregates with ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says, and
  ``geo_mean`` takes the mean over sequences of a sequence-level loss, as verl does; both divide
  by ``global_seqs`` so micro-batches still sum to the mini-batch loss.
* ``clip_cov`` picks its tokens at random among the candidates (``torch.randperm`` on the global
  generator), as verl does; the covariances are those of this call's valid tokens.
"""

from __future__ import annotations

import torch

from verl.algorithms.clipping import _LOG_RATIO_CLAMP, _clip_bounds, _clipped_surrogate
from verl.algorithms.utils import _as_bool, _safe_div, agg_loss, masked_mean


def _zero_padding(valid, *tensors):
    """The tensors with 0 on masked positions: junk (NaN, inf) in padding then reaches neither the
    loss nor, through ``torch.where``'s backward, the gradient."""
    return [torch.where(valid, t, torch.zeros_like(t)) for t in tensors]


def _log_ratio(log_prob, old_log_prob):
    return torch.clamp(log_prob - old_log_prob, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)


def _finish(pg_losses, valid, rollout_is_weights, loss_agg_mode, counts):
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(pg_losses, valid, loss_agg_mode, **counts)


def _ppo_kl(old_log_prob, log_prob, valid):
    return masked_mean((old_log_prob - log_prob).detach(), valid)


def compute_policy_loss_cispo(old_log_prob, log_prob, advantages, response_mask, *, clip_ratio=0.2,
                              clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
                              loss_agg_mode="token-mean", global_tokens=None, global_seqs=None, norm_len=None,
                              rollout_is_weights=None):
    """CISPO (MiniMax-M1): clip the importance weight, not the update.

    L_t = -sg[clip(r_t, 1 - clip_ratio_low, 1 + clip_ratio_high)] * A_t * log pi(y_t): every token
    keeps a gradient (sg[clip r] * A * grad log pi), only its weight is bounded.
    """
    low, high = _clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    valid = _as_bool(response_mask)
    old_log_prob, log_prob, advantages = _zero_padding(valid, old_log_prob, log_prob, advantages)
    ratio = torch.exp(_log_ratio(log_prob, old_log_prob))
    weight = torch.clamp(ratio, 1.0 - low, 1.0 + high).detach()
    pg_losses = -weight * advantages * log_prob
    counts = dict(global_tokens=global_tokens, global_seqs=global_seqs, norm_len=norm_len)
    loss = _finish(pg_losses, valid, rollout_is_weights, loss_agg_mode, counts)
    metrics = {
        "actor/pg_clipfrac": masked_mean((ratio.detach() != weight).float(), valid),
        "actor/ppo_kl": _ppo_kl(old_log_prob, log_prob, valid),
        "actor/pg_clipfrac_lower": torch.zeros((), device=log_prob.device),
    }
    return loss, metrics


def compute_policy_loss_geo_mean(old_log_prob, log_prob, advantages, response_mask, *, clip_ratio=0.2,
                                 clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
                                 loss_agg_mode="token-mean", global_tokens=None, global_seqs=None, norm_len=None,
                                 rollout_is_weights=None):
    """GMPO (Zhao et al. 2025): the geometric mean of the token ratios, clipped per token in log space.

    Per token the log-ratio d_t is clipped on the side the advantage's sign cares about: to at most
    ``clip_ratio_high`` when A > 0, to at least ``-clip_ratio_low`` when A < 0 (so the ratio range
    is [e^-low, e^high]). Per sequence R_i = exp(mean_t d_t), A_i = mean_t A_t and
    L_i = -A_i R_i; the loss is the mean over sequences (``loss_agg_mode`` is not used).
    ``rollout_is_weights`` enter as their per-sequence geometric mean.
    """
    low, high = _clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    valid = _as_bool(response_mask)
    old_log_prob, log_prob, advantages = _zero_padding(valid, old_log_prob, log_prob, advantages)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    sign = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -low, high)
    clipped_log_ratio = sign * torch.minimum(sign * log_ratio, sign * clamped)
    seq_ratio = torch.exp(masked_mean(clipped_log_ratio, valid, dim=-1))
    seq_adv = masked_mean(advantages, valid, dim=-1)
    pg_losses = -seq_adv * seq_ratio
    if rollout_is_weights is not None:
        pg_losses = pg_losses * torch.exp(masked_mean(torch.log(rollout_is_weights + 1e-10), valid, dim=-1))
    seqs = pg_losses.shape[0] if global_seqs is None else global_seqs
    loss = _safe_div(pg_losses.sum(), seqs)
    was_clipped = (log_ratio != clamped).detach()
    metrics = {
        "actor/pg_clipfrac": masked_mean((was_clipped & (advantages > 0)).float(), valid),
        "actor/ppo_kl": _ppo_kl(old_log_prob, log_prob, valid),
        "actor/pg_clipfrac_lower": masked_mean((was_clipped & (advantages < 0)).float(), valid),
    }
    return loss, metrics


def compute_policy_loss_gpg(old_log_prob, log_prob, advantages, response_mask, *, clip_ratio=0.2,
                            clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
                            loss_agg_mode="token-mean", global_tokens=None, global_seqs=None, norm_len=None,
                            rollout_is_weights=None):
    """GPG (Chu et al. 2025): plain policy gradient, L_t = -A_t log pi(y_t); no ratio, no clipping.

    Meant with the ``gpg`` advantage estimator. ``old_log_prob`` only feeds the ``ppo_kl`` metric.
    """
    valid = _as_bool(response_mask)
    old_log_prob, log_prob, advantages = _zero_padding(valid, old_log_prob, log_prob, advantages)
    counts = dict(global_tokens=global_tokens, global_seqs=global_seqs, norm_len=norm_len)
    loss = _finish(-advantages * log_prob, valid, rollout_is_weights, loss_agg_mode, counts)
    return loss, {"actor/ppo_kl": _ppo_kl(old_log_prob, log_prob, valid)}


def compute_policy_loss_sapo(old_log_prob, log_prob, advantages, response_mask, *, clip_ratio=0.2,
                             clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
                             loss_agg_mode="seq-mean-token-mean", global_tokens=None, global_seqs=None,
                             norm_len=None, rollout_is_weights=None, tau_pos: float = 1.0, tau_neg: float = 1.05):
    """SAPO (Gao et al. 2025): a smooth sigmoid gate on the ratio instead of a hard clip.

    f(r) = sigmoid(tau (r - 1)) * 4 / tau, tau = ``tau_pos`` where A > 0 and ``tau_neg`` otherwise;
    L_t = -f(r_t) A_t. At r = 1 the gate's slope is 1 (the PPO gradient); far from 1 it fades.
    Aggregated with ``seq-mean-token-mean`` regardless of ``loss_agg_mode``, as in verl.
    """
    valid = _as_bool(response_mask)
    old_log_prob, log_prob, advantages = _zero_padding(valid, old_log_prob, log_prob, advantages)
    ratio = torch.exp(_log_ratio(log_prob, old_log_prob))
    tau = torch.where(advantages > 0, torch.as_tensor(tau_pos, dtype=ratio.dtype, device=ratio.device),
                      torch.as_tensor(tau_neg, dtype=ratio.dtype, device=ratio.device))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    counts = dict(global_tokens=global_tokens, global_seqs=global_seqs, norm_len=norm_len)
    loss = _finish(-gate * advantages, valid, rollout_is_weights, "seq-mean-token-mean", counts)
    zero = torch.zeros((), device=log_prob.device)
    metrics = {"actor/pg_clipfrac": zero, "actor/ppo_kl": _ppo_kl(old_log_prob, log_prob, valid),
               "actor/pg_clipfrac_lower": zero}
    return loss, metrics


def _token_covariance(advantages, log_prob, valid):
    """(A_t - mean A) * (log pi_t - mean log pi) over the valid tokens (detached)."""
    adv, logp = advantages.detach(), log_prob.detach()
    return (adv - masked_mean(adv, valid)) * (logp - masked_mean(logp, valid))


def compute_policy_loss_clip_cov(old_log_prob, log_prob, advantages, response_mask, *, clip_ratio=0.2,
                                 clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
                                 loss_agg_mode="token-mean", global_tokens=None, global_seqs=None, norm_len=None,
                                 rollout_is_weights=None, clip_cov_ratio: float = 0.0002, clip_cov_lb: float = 1.0,
                                 clip_cov_ub: float = 5.0):
    """Clip-Cov (Cui et al. 2025): PPO's clipped surrogate, with the gradient of a few
    high-covariance tokens cut.

    Candidates are valid tokens the PPO clip left alone whose covariance
    (A_t - mean A)(log pi_t - mean log pi) lies strictly inside (``clip_cov_lb``, ``clip_cov_ub``);
    max(1, int(``clip_cov_ratio`` * valid tokens)) of them, drawn at random, get loss 0. No dual-clip.
    """
    if clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    low, high = _clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    valid = _as_bool(response_mask)
    old_log_prob, log_prob, advantages = _zero_padding(valid, old_log_prob, log_prob, advantages)
    ratio = torch.exp(_log_ratio(log_prob, old_log_prob))
    clip_loss, clipped = _clipped_surrogate(ratio, advantages, low, high)
    cov = _token_covariance(advantages, log_prob, valid)
    candidates = valid & ~clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    n_cut = max(int(clip_cov_ratio * int(valid.sum().item())), 1)
    idx = torch.nonzero(candidates)
    if len(idx) > n_cut:
        idx = idx[torch.randperm(len(idx))[:n_cut].to(idx.device)]
    keep = torch.ones_like(clip_loss)
    keep[idx[:, 0], idx[:, 1]] = 0.0
    counts = dict(global_tokens=global_tokens, global_seqs=global_seqs, norm_len=norm_len)
    loss = _finish(clip_loss * keep, valid, rollout_is_weights, loss_agg_mode, counts)
    metrics = {"actor/pg_clipfrac": masked_mean((keep == 0).float(), valid),
               "actor/ppo_kl": _ppo_kl(old_log_prob, log_prob, valid)}
    return loss, metrics


def compute_policy_loss_kl_cov(old_log_prob, log_prob, advantages, response_mask, *, clip_ratio=0.2,
                               clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
                               loss_agg_mode="token-mean", global_tokens=None, global_seqs=None, norm_len=None,
                               rollout_is_weights=None, kl_cov_ratio: float = 0.0002, ppo_kl_coef: float = 0.1):
    """KL-Cov (Cui et al. 2025): unclipped -A r, plus a |log r| penalty on the highest-covariance tokens.

    The max(1, int(``kl_cov_ratio`` * valid tokens)) valid tokens of largest covariance
    (A_t - mean A)(log pi_t - mean log pi) get L_t = -A_t r_t + ``ppo_kl_coef`` * |log r_t|; the others
    L_t = -A_t r_t. ``clip_ratio*`` are not used. The ``ppo_kl`` metric is the mean |log r|, as in verl.
    """
    if kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    valid = _as_bool(response_mask)
    old_log_prob, log_prob, advantages = _zero_padding(valid, old_log_prob, log_prob, advantages)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    pg_losses = -advantages * torch.exp(log_ratio)
    flat_valid = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    penalised = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
    if flat_valid.numel() > 0:
        cov = _token_covariance(advantages, log_prob, valid).reshape(-1)[flat_valid]
        k = max(1, int(flat_valid.numel() * kl_cov_ratio))
        top = flat_valid[torch.topk(cov, k, largest=True).indices]
        penalised[top] = True
    penalised = penalised.reshape(valid.shape)
    pg_losses = torch.where(penalised, pg_losses + ppo_kl_coef * log_ratio.abs(), pg_losses)
    counts = dict(global_tokens=global_tokens, global_seqs=global_seqs, norm_len=norm_len)
    loss = _finish(pg_losses, valid, rollout_is_weights, loss_agg_mode, counts)
    return loss, {"actor/ppo_kl": masked_mean(log_ratio.abs().detach(), valid)}


def compute_policy_loss_dppo_tv(old_log_prob, log_prob, advantages, response_mask, *, clip_ratio=0.2,
                                clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
                                loss_agg_mode="token-mean", global_tokens=None, global_seqs=None, norm_len=None,
                                rollout_is_weights=None):
    """DPPO-Binary-TV: mask tokens whose probability moved too far (in total variation), not by ratio.

    ``clip_ratio_low``/``clip_ratio_high`` are bounds on p - p_old (probabilities, not ratios): a
    token with A > 0 counts while p - p_old <= high, otherwise while p - p_old >= -low.
    L_t = -A_t sg[min(r_t, ``clip_ratio_c``)] log pi(y_t) on counted tokens, 0 on the others
    (``clip_ratio_c`` truncates the importance weight here; it is not a dual-clip).
    """
    low, high = _clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    valid = _as_bool(response_mask)
    old_log_prob, log_prob, advantages = _zero_padding(valid, old_log_prob, log_prob, advantages)
    ratio = torch.exp(_log_ratio(log_prob, old_log_prob))
    weight = torch.clamp(ratio, max=clip_ratio_c).detach()
    moved = (torch.exp(log_prob) - torch.exp(old_log_prob)).detach()
    inside = torch.where(advantages > 0, moved <= high, moved >= -low)
    pg_losses = torch.where(inside, -advantages * weight * log_prob, torch.zeros_like(log_prob))
    counts = dict(global_tokens=global_tokens, global_seqs=global_seqs, norm_len=norm_len)
    loss = _finish(pg_losses, valid, rollout_is_weights, loss_agg_mode, counts)
    metrics = {
        "actor/pg_clipfrac": masked_mean((~inside).float(), valid),
        "actor/ppo_kl": _ppo_kl(old_log_prob, log_prob, valid),
        "actor/pg_clipfrac_lower": masked_mean(((ratio.detach() > clip_ratio_c) & inside).float(), valid),
    }
    return loss, metrics


EXTRA_POLICY_LOSSES = {
    "cispo": compute_policy_loss_cispo,
    "geo_mean": compute_policy_loss_geo_mean,
    "gpg": compute_policy_loss_gpg,
    "sapo": compute_policy_loss_sapo,
    "clip_cov": compute_policy_loss_clip_cov,
    "kl_cov": compute_policy_loss_kl_cov,
    "dppo_tv": compute_policy_loss_dppo_tv,
}
