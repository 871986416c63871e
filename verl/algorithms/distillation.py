"""The loss term of on-policy distillation, which pulls the student toward its teachers' log-probs.

The teachers and their papers are in :mod:`verl.workers.teacher`; docs/distillation.md. Pure
tensors in, ``(loss, metrics)`` out; ``settings`` is the ``distillation.distillation_loss``
section as a plain dict.
"""

from __future__ import annotations

import torch

from verl.algorithms.kl import kl_penalty
from verl.algorithms.losses import POLICY_LOSSES
from verl.algorithms.utils import agg_loss

# verl's dual-clip constant, which its distillation loss does not let one set.
CLIP_RATIO_C = 3.0


def distillation_loss(task_loss: torch.Tensor, metrics: dict, *, settings: dict, log_prob: torch.Tensor,
                      old_log_prob: torch.Tensor, teacher_log_prob: torch.Tensor, mask: torch.Tensor,
                      loss_agg_mode: str, counts: dict, rollout_is_weights: torch.Tensor | None = None):
    """The actor's loss with distillation: ``(loss, metrics)``.

    ``settings`` holds the ``distillation.distillation_loss`` keys (a plain dict). Per token,
    d = kl_penalty(log_prob, teacher_log_prob, loss_mode), clamped to [-loss_max_clamp,
    loss_max_clamp] when that is set. ``use_policy_gradient``: the distillation loss is the clipped
    policy loss with advantages -d (detached) and the section's clip ratios; else d aggregated with
    ``loss_agg_mode``, gradients flowing through ``log_prob``. ``use_task_rewards``: the result is
    ``task_loss + distillation_loss_coef * distillation``; else the distillation loss alone.
    ``counts`` are the mini-batch's global counts (see ``Actor.ppo_loss``).
    """
    per_token = kl_penalty(log_prob, teacher_log_prob, settings["loss_mode"])
    out = dict(metrics)
    # k1 can be negative: its magnitude says more about how far apart the two are.
    out["actor/distillation/abs_loss"] = agg_loss(per_token.detach().abs(), mask, "token-mean", **counts)
    clamp = settings["loss_max_clamp"]
    if clamp is not None:
        per_token = per_token.clamp(min=-clamp, max=clamp)
    if settings["use_policy_gradient"]:
        distill, pg_metrics = POLICY_LOSSES[settings["policy_loss_mode"]](
            old_log_prob, log_prob, -per_token.detach(), mask, clip_ratio=settings["clip_ratio"],
            clip_ratio_low=settings["clip_ratio_low"], clip_ratio_high=settings["clip_ratio_high"],
            clip_ratio_c=CLIP_RATIO_C, loss_agg_mode=loss_agg_mode, rollout_is_weights=rollout_is_weights, **counts)
        out.update({f"actor/distillation/{key.split('/', 1)[1]}": value for key, value in pg_metrics.items()})
    else:
        distill = agg_loss(per_token, mask, loss_agg_mode, **counts)
    out["actor/distillation/loss"] = distill.detach()
    if settings["use_task_rewards"]:
        return task_loss + settings["distillation_loss_coef"] * distill, out
    return distill, out
