"""Offline preference losses (DPO and its IPO / hinge variants, KTO) as pure tensor functions.

Inputs are *sequence* log-probabilities ``[B]``: the sum over the response tokens of
log pi(token | prefix), under the policy (with gradients) and under the frozen reference.
The implicit reward of a response is ``beta * (policy_logps - ref_logps)``.

Deviations from the papers, written once:

* IPO (Azar et al. 2023) is applied to summed sequence log-probs, exactly as the paper's
  h-function is written; TRL divides them by the response length first. Both are in use; the
  length-normalised form can be had by passing per-token means instead of sums.
* KTO's reference point (Ethayarajh et al. 2024, the paper's practical version) is estimated
  from the batch's mismatched prompt/response pairs by :func:`kto_reference_point`; this module
  takes the estimate as an input so that a batch split into micro-batches shares one value.
* Both losses take an optional denominator (``num_pairs`` / ``num_examples``): micro-batches of one
  step pass the step's count, so their losses add up to the loss of the whole step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DPO_LOSS_TYPES = ("sigmoid", "ipo", "hinge")


def _mean(losses: torch.Tensor, count) -> torch.Tensor:
    """Sum of ``losses`` / ``count`` (``count`` defaults to the number of losses)."""
    count = losses.numel() if count is None else count
    return losses.sum() / max(float(count), 1.0)


def dpo_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
             ref_chosen_logps: torch.Tensor, ref_rejected_logps: torch.Tensor, beta: float,
             loss_type: str = "sigmoid", *, num_pairs=None) -> tuple[torch.Tensor, dict]:
    """The DPO loss of B preference pairs and its TRL-named statistics.

    With the log-ratio difference ``h = (pi_c - ref_c) - (pi_r - ref_r)`` per pair:

    * ``sigmoid``: ``-log sigmoid(beta * h)``: Direct Preference Optimization, Rafailov et al. 2023,
      "Direct Preference Optimization: Your Language Model is Secretly a Reward Model".
    * ``ipo``: ``(h - 1 / (2 beta))^2``: Azar et al. 2023, "A General Theoretical Paradigm to
      Understand Learning from Human Preferences" (IPO); beta plays the role of the paper's tau.
    * ``hinge``: ``relu(1 - beta * h)``: SLiC-HF, Zhao et al. 2023, "SLiC-HF: Sequence Likelihood
      Calibration with Human Feedback"; 1 / beta is the margin.

    All inputs are ``[B]`` sequence log-probs. The loss is the sum over pairs / ``num_pairs``
    (default B). Metrics (detached means over the B pairs): ``rewards/chosen``,
    ``rewards/rejected`` (implicit rewards beta * log-ratio), ``rewards/margins`` (their
    difference), ``rewards/accuracies`` (fraction of pairs whose chosen reward is strictly
    higher; a tie counts as wrong), ``logps/chosen``, ``logps/rejected`` (policy log-probs).
    """
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; choose one of {', '.join(DPO_LOSS_TYPES)}")
    chosen_logratios = policy_chosen_logps - ref_chosen_logps
    rejected_logratios = policy_rejected_logps - ref_rejected_logps
    h = chosen_logratios - rejected_logratios
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * h)
    elif loss_type == "ipo":
        losses = (h - 1.0 / (2.0 * beta)) ** 2
    else:
        losses = torch.relu(1.0 - beta * h)
    loss = _mean(losses, num_pairs)
    chosen_rewards = beta * chosen_logratios.detach()
    rejected_rewards = beta * rejected_logratios.detach()
    metrics = {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean(),
        "logps/chosen": policy_chosen_logps.detach().mean(),
        "logps/rejected": policy_rejected_logps.detach().mean(),
    }
    return loss, metrics


def kto_reference_point(policy_kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor) -> torch.Tensor:
    """KTO's reference point z0: a batch estimate of KL(policy || reference), detached, at least 0.

    The inputs are ``[M]`` sequence log-probs of *mismatched* pairs (prompt i with the response
    of another row), so the estimate is of the policy's divergence on outputs it was not trained
    to prefer or avoid: ``max(0, mean(policy_kl_logps - ref_kl_logps))`` (Ethayarajh et al. 2024,
    "KTO: Model Alignment as Prospect Theoretic Optimization", section 4, practical version).
    No gradient flows through it.
    """
    return (policy_kl_logps.detach() - ref_kl_logps.detach()).mean().clamp(min=0)


def kto_loss(policy_logps: torch.Tensor, ref_logps: torch.Tensor, desirable: torch.Tensor,
             reference_point, beta: float, desirable_weight: float = 1.0, undesirable_weight: float = 1.0,
             *, num_examples=None) -> tuple[torch.Tensor, dict]:
    """The KTO loss of B unpaired examples (Ethayarajh et al. 2024, "KTO: Model Alignment as
    Prospect Theoretic Optimization", equation 8).

    With ``r = policy_logps - ref_logps`` and the reference point ``z0`` (see
    :func:`kto_reference_point`), each example's loss is

    * desirable (``desirable`` true): ``desirable_weight * (1 - sigmoid(beta * (r - z0)))``
    * undesirable:                    ``undesirable_weight * (1 - sigmoid(beta * (z0 - r)))``

    and the loss is their sum / ``num_examples`` (default B). Metrics (detached):
    ``rewards/chosen`` and ``rewards/rejected`` (mean implicit reward beta * r of the desirable and
    of the undesirable examples; 0 when there are none), ``rewards/margins`` (their difference),
    ``kl`` (z0), ``logps/chosen``, ``logps/rejected``, and the counts ``count/chosen``,
    ``count/rejected``.
    """
    desirable = desirable.bool()
    z0 = torch.as_tensor(reference_point, dtype=policy_logps.dtype, device=policy_logps.device).detach()
    logratios = policy_logps - ref_logps
    desirable_losses = desirable_weight * (1.0 - torch.sigmoid(beta * (logratios - z0)))
    undesirable_losses = undesirable_weight * (1.0 - torch.sigmoid(beta * (z0 - logratios)))
    losses = torch.where(desirable, desirable_losses, undesirable_losses)
    loss = _mean(losses, num_examples)

    rewards = beta * logratios.detach()
    logps = policy_logps.detach()
    n_chosen, n_rejected = int(desirable.sum()), int((~desirable).sum())

    def mean_where(values, mask, count):
        return values[mask].sum() / count if count else values.new_zeros(())

    chosen_reward = mean_where(rewards, desirable, n_chosen)
    rejected_reward = mean_where(rewards, ~desirable, n_rejected)
    metrics = {
        "rewards/chosen": chosen_reward,
        "rewards/rejected": rejected_reward,
        "rewards/margins": chosen_reward - rejected_reward,
        "kl": z0,
        "logps/chosen": mean_where(logps, desirable, n_chosen),
        "logps/rejected": mean_where(logps, ~desirable, n_rejected),
        "count/chosen": float(n_chosen),
        "count/rejected": float(n_rejected),
    }
    return loss, metrics
