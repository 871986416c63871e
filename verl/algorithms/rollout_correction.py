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

Bypass mode (verl's ``bypass_mode=true``, see :func:`bypass_policy_loss`) drops pi_old altogether:
the trainer skips the old-log-prob pass and the rollout engine's log-probs play pi_old.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from verl.algorithms.losses import compute_policy_loss
from verl.algorithms.losses_extra import compute_policy_loss_gpg
from verl.algorithms.utils import _as_bool, masked_mean, masked_sum

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


# --------------------------------------------------------------------------- verl's full set of options
# verl's ``algorithm.rollout_correction``: importance weights at token or sequence level (optionally
# normalised to mean 1 over the batch), and rejection sampling that drops tokens or whole sequences
# whose divergence from the rollout policy passes a bound. All of it is computed once per update
# batch from the old log-probs, before the PPO epochs, as verl does.
#
# Deviation from verl: the rejection mask replaces ``response_mask`` for the actor's update only
# (policy loss, entropy, KL loss and their token counts); verl also hands it to the advantage
# estimator and the critic. For outcome-reward estimators (GRPO, RLOO, ...) the loss is the same.

IS_LEVELS = ("token", "sequence")
# Rejection statistics per token: k1 = log(pi_rollout / pi_old), k2 = (log ratio)^2 / 2,
# k3 = ratio - 1 - log ratio (Schulman's estimators of KL), with ratio = pi_old / pi_rollout.
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


def _number(text, what: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: {text!r} is not a number") from None
    if value <= 0:
        raise ValueError(f"{what}: bounds must be > 0, got {text!r}")
    return value


def parse_rs(rollout_rs: str, rollout_rs_threshold) -> list[tuple[str, float | None, float]]:
    """``(option, lower, upper)`` per distinct option of verl's comma-separated ``rollout_rs``.

    ``rollout_rs_threshold`` is one bound for all options or one per option, comma-separated. A
    k1 option bounds the probability ratio pi_rollout / pi_old: ``"lower_upper"``, or one number U
    meaning ``1/U_U``; the others take one upper bound on their statistic.
    """
    options = list(dict.fromkeys(opt.strip() for opt in str(rollout_rs).split(",") if opt.strip()))
    if not options:
        raise ValueError("rollout_rs names no option")
    unknown = [opt for opt in options if opt not in RS_OPTIONS]
    if unknown:
        raise ValueError(f"rollout_rs: unknown option(s) {unknown}; choose from {', '.join(RS_OPTIONS)}")
    if rollout_rs_threshold is None:
        raise ValueError(f"rollout_rs={rollout_rs} needs rollout_rs_threshold")
    specs = [part.strip() for part in str(rollout_rs_threshold).split(",") if part.strip()]
    if len(specs) == 1:
        specs = specs * len(options)
    if len(specs) != len(options):
        raise ValueError(f"rollout_rs_threshold={rollout_rs_threshold!r}: give one bound for all of "
                         f"{options} or one per option ({len(options)}), not {len(specs)}")
    parsed = []
    for option, spec in zip(options, specs):
        what = f"rollout_rs_threshold for {option}"
        if option.endswith("k1"):
            low_text, _, high_text = spec.rpartition("_")
            upper = _number(high_text, what)
            lower = _number(low_text, what) if low_text else 1.0 / upper
            if lower > upper:
                raise ValueError(f"{what}: lower bound {lower} is above upper bound {upper}")
        elif "_" in spec:
            raise ValueError(f"{what}: {spec!r} has two bounds; {option} takes one upper bound")
        else:
            lower, upper = None, _number(spec, what)
        parsed.append((option, lower, upper))
    return parsed


def _global_mean(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """total / count summed over the data-parallel ranks (each rank holds its share of the batch)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        both = torch.stack([total, count.to(total.dtype)])
        torch.distributed.all_reduce(both)
        total, count = both[0], both[1]
    return total / count.clamp_min(1)


@torch.no_grad()
def rollout_is_weights(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                       level: str = "token", threshold: float = 2.0, batch_normalize: bool = False):
    """Truncated importance weights ``[B, T]`` (detached, 0 on padding) and ``rollout_corr/*`` metrics.

    token: min(exp(old - rollout), threshold) per token. sequence: min(exp(sum over the response of
    (old - rollout)), threshold), the same for every token of the row. The log-ratio (the sum, for
    sequence) is clamped to [-20, 20] before ``exp``. ``batch_normalize`` then divides by the
    weights' mean over the batch: over valid tokens (token) or over sequences (sequence), on all
    data-parallel ranks.
    """
    if level not in IS_LEVELS:
        raise ValueError(f"rollout_is={level!r}: choose token or sequence")
    if threshold <= 0:
        raise ValueError(f"the importance-ratio cap must be > 0, got {threshold}")
    valid = _as_bool(response_mask)
    rows = valid.any(dim=-1)
    if level == "token":  # the per-micro-batch TIS weights, over the whole batch
        weights, tis = truncated_is_weights(old_log_prob, rollout_log_prob, response_mask, threshold)
        above = tis["actor/rollout_is_clipfrac"]
    else:
        seq_log_ratio = masked_sum(old_log_prob - rollout_log_prob, valid, dim=-1)
        raw = torch.exp(torch.clamp(seq_log_ratio, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))[:, None].expand_as(valid)
        above = (seq_log_ratio > math.log(threshold)).float().mean()
        weights = torch.where(valid, torch.clamp(raw, max=threshold), torch.zeros_like(raw))
    metrics = {"rollout_corr/rollout_is_mean": masked_mean(weights, valid),
               "rollout_corr/rollout_is_ratio_fraction_high": above,
               "rollout_corr/rollout_is_max": weights.masked_fill(~valid, float("-inf")).max(),
               "rollout_corr/rollout_is_min": weights.masked_fill(~valid, float("inf")).min()}
    if batch_normalize:
        if level == "token":
            mean = _global_mean(masked_sum(weights, valid), valid.sum())
        else:
            per_seq = masked_mean(weights, valid, dim=-1)
            mean = _global_mean(per_seq[rows].sum(), rows.sum())
        if mean > 1e-8:
            weights = weights / mean
        metrics["rollout_corr/rollout_is_batch_norm_factor"] = mean if mean > 1e-8 else torch.ones_like(mean)
    return weights, metrics


def _seq_max(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    best = values.masked_fill(~valid, float("-inf")).max(dim=-1).values
    return torch.where(valid.any(dim=-1), best, torch.zeros_like(best))


@torch.no_grad()
def rollout_rejection_mask(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                           rollout_rs: str, rollout_rs_threshold):
    """``response_mask`` with the rejected tokens set to 0, and ``rollout_corr/rollout_rs_*`` metrics.

    Every option of ``rollout_rs`` must pass for a token to stay (see :func:`parse_rs`). token_*
    options judge each token alone; seq_sum_*, seq_mean_*, seq_max_* judge the sum, mean or max of
    the token statistic over the response and keep or drop the whole row. A k1 statistic must lie
    in [log lower, log upper]; k2 and k3 must be <= upper.
    """
    valid = _as_bool(response_mask)
    log_ratio = torch.clamp(old_log_prob - rollout_log_prob, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    per_token = {"k1": -log_ratio, "k2": 0.5 * log_ratio ** 2, "k3": torch.exp(log_ratio) - 1.0 - log_ratio}
    keep = torch.ones_like(valid)
    rows = valid.any(dim=-1)
    metrics = {}
    for option, lower, upper in parse_rs(rollout_rs, rollout_rs_threshold):
        scope, estimator = option.rsplit("_", 1)
        stat = per_token[estimator]
        if scope == "seq_sum":
            stat = masked_sum(stat, valid, dim=-1)[:, None].expand_as(stat)
        elif scope == "seq_mean":
            stat = masked_mean(stat, valid, dim=-1)[:, None].expand_as(stat)
        elif scope == "seq_max":
            stat = _seq_max(stat, valid)[:, None].expand_as(stat)
        if lower is None:
            passed = stat <= upper
        else:
            passed = (stat >= math.log(lower)) & (stat <= math.log(upper))
        keep &= passed
        dropped = ~passed & valid
        metrics[f"rollout_corr/rollout_rs_{option}_mean"] = masked_mean(stat, valid)
        metrics[f"rollout_corr/rollout_rs_{option}_masked_fraction"] = masked_mean(dropped.float(), valid)
        metrics[f"rollout_corr/rollout_rs_{option}_seq_masked_fraction"] = masked_mean(
            dropped.any(dim=-1).float(), rows)
    dropped = ~keep & valid
    metrics["rollout_corr/rollout_rs_masked_fraction"] = masked_mean(dropped.float(), valid)
    metrics["rollout_corr/rollout_rs_seq_masked_fraction"] = dropped.any(dim=-1).float().mean()
    new_mask = torch.where(keep, response_mask, torch.zeros_like(response_mask))
    return new_mask, metrics


@torch.no_grad()
def offpolicy_metrics(log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor):
    """verl's off-policy diagnostics between a policy's log-probs (``log_prob``) and the engine's,
    as 0-d tensors: ``rollout_corr/kl`` (k1 of KL(pi_rollout || pi), token mean), ``k3_kl``,
    ``training_ppl`` / ``rollout_ppl`` (mean over responses of exp(-mean token log-prob)),
    ``log_ppl_diff`` (mean over responses of the rollout's mean log-prob minus the policy's),
    ``chi2_token`` (E[rho^2] - 1 over tokens) and ``chi2_seq`` (E[(prod rho)^2] - 1 over
    responses), with rho = pi / pi_rollout and log-ratios clamped to [-20, 20] for ``exp``."""
    valid = _as_bool(response_mask)
    rows = valid.any(dim=-1)
    log_ratio = log_prob - rollout_log_prob
    mean_lp = masked_mean(log_prob, valid, dim=-1)
    mean_rollout_lp = masked_mean(rollout_log_prob, valid, dim=-1)
    safe = torch.clamp(log_ratio, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    seq_safe = torch.clamp(masked_sum(log_ratio, valid, dim=-1), -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return {"rollout_corr/kl": masked_mean(-log_ratio, valid),
            "rollout_corr/k3_kl": masked_mean(torch.exp(safe) - safe - 1.0, valid),
            "rollout_corr/training_ppl": masked_mean(torch.exp(-mean_lp), rows),
            "rollout_corr/rollout_ppl": masked_mean(torch.exp(-mean_rollout_lp), rows),
            "rollout_corr/log_ppl_diff": masked_mean(mean_rollout_lp - mean_lp, rows),
            "rollout_corr/chi2_token": masked_mean(torch.exp(2.0 * safe), valid) - 1.0,
            "rollout_corr/chi2_seq": masked_mean(torch.exp(2.0 * seq_safe), rows) - 1.0}


LOSS_TYPES = ("ppo_clip", "reinforce")


def bypass_policy_loss(log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, advantages: torch.Tensor,
                       response_mask: torch.Tensor, *, loss_type: str = "ppo_clip", rollout_is: str | None = None,
                       rollout_is_threshold: float = 2.0, rollout_is_batch_normalize: bool = False,
                       rollout_rs: str | None = None, rollout_rs_threshold=None, **loss_kwargs):
    """verl's bypass-mode policy loss: two policies, pi_theta and pi_rollout (no recomputed pi_old).

    On each micro-batch, with no gradient, the importance weights w and the rejection mask are
    computed from ``log_prob`` (pi_theta as it is now, detached) against ``rollout_log_prob``, exactly
    as :func:`rollout_is_weights` / :func:`rollout_rejection_mask` do with pi_old (same levels, cap,
    batch normalisation, options); the rejected tokens leave the policy loss. Then

    * ``ppo_clip``: PPO's clipped loss (:func:`~verl.algorithms.losses.compute_policy_loss`) with
      ratio pi_theta / pi_rollout. The weights are *not* applied (the ratio already is the
      importance ratio; applying w too would count it twice): they are computed for the metrics.
    * ``reinforce``: L_t = -A_t * w_t * log pi_theta(y_t) (policy gradient, no ratio, no clip;
      :func:`~verl.algorithms.losses_extra.compute_policy_loss_gpg`), w = 1 without ``rollout_is``.

    ``loss_kwargs`` are the policy loss's keywords (``clip_ratio*``, ``loss_agg_mode``,
    ``global_tokens``, ``global_seqs``, ``norm_len``): the token counts are the mini-batch's before
    rejection, so a rejected token still counts in token-mean's denominator (as in verl, whose
    rejection happens inside the loss). Returns ``(loss, metrics)``: the loss's own
    (``actor/ppo_kl`` = mean of log pi_rollout - log pi_theta, ...) and ``rollout_corr/*`` (IS, RS
    and :func:`offpolicy_metrics`), 0-d tensors.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r}: choose ppo_clip or reinforce")
    current = log_prob.detach()
    weights, metrics = None, {}
    if rollout_is is not None:
        weights, metrics = rollout_is_weights(current, rollout_log_prob, response_mask, rollout_is,
                                              rollout_is_threshold, rollout_is_batch_normalize)
    mask = response_mask
    if rollout_rs is not None:
        mask, rs_metrics = rollout_rejection_mask(current, rollout_log_prob, response_mask, rollout_rs,
                                                  rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics.update(offpolicy_metrics(current, rollout_log_prob, response_mask))
    if loss_type == "reinforce":
        loss, loss_metrics = compute_policy_loss_gpg(rollout_log_prob, log_prob, advantages, mask,
                                                     rollout_is_weights=weights, **loss_kwargs)
    else:
        loss, loss_metrics = compute_policy_loss(rollout_log_prob, log_prob, advantages, mask,
                                                 rollout_is_weights=None, **loss_kwargs)
    return loss, {**loss_metrics, **metrics}


@dataclass(frozen=True)
class RolloutCorrection:
    """What verl's ``algorithm.rollout_correction`` asks of the actor's update (see the functions above).

    ``bypass_mode``: the update's pi_old is the rollout's log-probs and the policy loss is
    :func:`bypass_policy_loss` of ``loss_type`` (the trainer skips the old-log-prob pass)."""

    rollout_is: str | None = None
    rollout_is_threshold: float = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: str | float | None = None
    bypass_mode: bool = False
    loss_type: str = "ppo_clip"

    def __post_init__(self):
        if self.rollout_is is not None and self.rollout_is not in IS_LEVELS:
            raise ValueError(f"rollout_is={self.rollout_is!r}: choose token, sequence or null")
        if self.rollout_rs is not None:
            parse_rs(self.rollout_rs, self.rollout_rs_threshold)
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type={self.loss_type!r}: choose ppo_clip or reinforce")

    def bypass_loss(self, log_prob, rollout_log_prob, advantages, response_mask, **loss_kwargs):
        """:func:`bypass_policy_loss` with these settings."""
        return bypass_policy_loss(log_prob, rollout_log_prob, advantages, response_mask, loss_type=self.loss_type,
                                  rollout_is=self.rollout_is, rollout_is_threshold=self.rollout_is_threshold,
                                  rollout_is_batch_normalize=self.rollout_is_batch_normalize,
                                  rollout_rs=self.rollout_rs, rollout_rs_threshold=self.rollout_rs_threshold,
                                  **loss_kwargs)

    @property
    def active(self) -> bool:
        return self.rollout_is is not None or self.rollout_rs is not None

    def apply(self, old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor):
        """``(is_weights or None, response_mask after rejection, metrics)`` for one update batch.

        The weights are computed on the full mask (verl's order); rejected tokens leave the loss
        through the returned mask.
        """
        weights, metrics = None, {}
        if self.rollout_is is not None:
            weights, metrics = rollout_is_weights(old_log_prob, rollout_log_prob, response_mask, self.rollout_is,
                                                  self.rollout_is_threshold, self.rollout_is_batch_normalize)
        if self.rollout_rs is not None:
            response_mask, rs_metrics = rollout_rejection_mask(old_log_prob, rollout_log_prob, response_mask,
                                                               self.rollout_rs, self.rollout_rs_threshold)
            metrics.update(rs_metrics)
        return weights, response_mask, {key: float(value) for key, value in metrics.items()}

    @property
    def batch_level(self) -> bool:
        """Whether the update must see the whole batch first (anything beyond plain token-level TIS,
        which the loss applies per micro-batch by itself). Never in bypass mode: there everything is
        computed per micro-batch from the current policy (:func:`bypass_policy_loss`)."""
        if self.bypass_mode:
            return False
        return self.rollout_is == "sequence" or self.rollout_is_batch_normalize or self.rollout_rs is not None


def rollout_correction_of(actor_config, section=None) -> RolloutCorrection:
    """The correction asked for by an actor section (token-level TIS from its own keys,
    ``rollout_is_correction`` and ``rollout_is_threshold``, where ``validate()`` moves verl's
    ``rollout_is=token`` outside bypass mode) and by ``section``, the config's
    ``algorithm.rollout_correction`` (sequence level, batch normalisation, rejection sampling,
    bypass mode and its loss type); without ``section``, token-level TIS only."""
    token = actor_config.rollout_is_correction
    if section is None:
        return RolloutCorrection("token" if token else None, actor_config.rollout_is_threshold)
    level = "token" if token else section.rollout_is
    threshold = actor_config.rollout_is_threshold if token else float(section.rollout_is_threshold)
    return RolloutCorrection(level, threshold, section.rollout_is_batch_normalize, section.rollout_rs,
                             section.rollout_rs_threshold, bool(section.bypass_mode), section.loss_type)
