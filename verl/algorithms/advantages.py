"""Advantage estimators: ``(advantages [B, T], returns [B, T])``, both 0 on masked positions.

Papers: GAE, Schulman et al. 2016 "High-Dimensional Continuous Control Using Generalized
Advantage Estimation"; GRPO, Shao et al. 2024 "DeepSeekMath"; Dr. GRPO, Liu et al. 2025
"Understanding R1-Zero-Like Training"; RLOO, Ahmadian et al. 2024 "Back to Basics: Revisiting
REINFORCE Style Optimization for Learning from Human Feedback in LLMs"; REINFORCE++, Hu 2025;
ReMax, Li et al. 2023; GPG, Chu et al. 2025 "GPG: A Simple and Strong Reinforcement Learning
Baseline for Model Reasoning"; GDPO, Liu et al. 2026 "GDPO: Group reward-Decoupled Normalization
Policy Optimization for Multi-reward RL Optimization" (arXiv 2601.05242).

Deviations and decisions:
* Recursions over time (GAE, returns-to-go) skip masked positions instead of resetting at
  them: a masked token neither adds reward nor cuts the bootstrap chain. For right-padded
  responses this equals "everything after the last valid token is terminal"; for masks with
  holes (e.g. tool output inside a multi-turn response) the valid tokens stay one chain.
* GRPO: a group of one has no baseline but itself, so its std is defined as 1 and its
  advantage is 0 (instead of 0/0). The std is the unbiased one, as in the paper's code.
* RLOO: a group of one gets advantage 0 (there are no "other" samples).
* REINFORCE++ and ReMax return the raw returns-to-go as ``returns``; the others return the
  advantages as ``returns`` (there is no critic to fit).
* GDPO follows verl's estimator, not this file's GRPO, on a group of one: per component the
  group mean is taken as 0 and the std as 1, so such a sample's component advantage is its raw
  component score / (1 + epsilon). It reads only the reward components, never the summed score.
* Optimal token baseline (verl's OTB) reads the old policy's log-probs and sum_v pi(v)^2 at each
  response token; a group of one keeps its return as the advantage, as in verl.
* Estimators run under ``no_grad``: advantages are constants to the policy loss.
* Group statistics (and the batch whitening) are computed in float64 and the advantages cast back
  to the rewards' dtype: a large but finite score such as 1e30 squares past float32's range
  (~3.4e38), which would make the std inf and every advantage of its group 0 or NaN.
"""

from __future__ import annotations

import difflib
import inspect

import numpy as np
import torch

from verl.algorithms.utils import _as_bool, masked_whiten


def _group_ids(group_index, device) -> tuple[torch.Tensor, int]:
    """Map arbitrary hashable prompt ids (strings, ints, tensor) to 0..G-1."""
    raw = group_index.tolist() if torch.is_tensor(group_index) else np.asarray(group_index, dtype=object).tolist()
    lookup: dict = {}
    ids = [lookup.setdefault(g, len(lookup)) for g in raw]
    return torch.tensor(ids, dtype=torch.long, device=device), len(lookup)


def _group_stats(scores: torch.Tensor, group_index):
    """Per-sample group size, group mean and unbiased group std (std 1 for groups of one), all float64."""
    ids, n_groups = _group_ids(group_index, scores.device)
    if ids.numel() != scores.numel():
        raise ValueError(f"group_index has {ids.numel()} entries but there are {scores.numel()} samples")
    scores = scores.double()
    total = scores.new_zeros(n_groups).index_add_(0, ids, scores)
    count = scores.new_zeros(n_groups).index_add_(0, ids, torch.ones_like(scores))
    mean = total / count
    sq_dev = torch.zeros_like(count).index_add_(0, ids, (scores - mean[ids]) ** 2)
    std = torch.where(count > 1, torch.sqrt(sq_dev / (count - 1).clamp(min=1)), torch.ones_like(count))
    return count[ids], total[ids], mean[ids], std[ids]


def _sequence_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    valid = _as_bool(response_mask)
    return torch.where(valid, token_level_rewards, torch.zeros_like(token_level_rewards)).sum(dim=-1)


def _broadcast(per_seq: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    valid = _as_bool(response_mask)
    return torch.where(valid, per_seq.unsqueeze(-1), torch.zeros_like(per_seq).unsqueeze(-1))


def _returns_to_go(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    valid = _as_bool(response_mask)
    rewards = torch.where(valid, token_level_rewards, torch.zeros_like(token_level_rewards))
    running = rewards.new_zeros(rewards.shape[0])
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        # On a masked position keep the running return unchanged (skip, not reset).
        running = torch.where(valid[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return torch.where(valid, returns, torch.zeros_like(returns))


@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
    *,
    whiten: bool = True,
):
    """GAE(gamma, lambda): A_t = sum_l (gamma*lam)^l delta_{t+l}, delta_t = r_t + gamma V_{t+1} - V_t.

    ``returns`` = A + V (before whitening) is the critic's target; the advantages are then
    whitened over the batch's valid tokens when ``whiten``.
    """
    valid = _as_bool(response_mask)
    zero = token_level_rewards.new_zeros(token_level_rewards.shape[0])
    next_value, next_adv = zero, zero
    adv = torch.zeros_like(token_level_rewards)
    for t in reversed(range(token_level_rewards.shape[1])):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam * next_adv
        next_adv = torch.where(valid[:, t], candidate, next_adv)
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        adv[:, t] = next_adv
    adv = torch.where(valid, adv, torch.zeros_like(adv))
    returns = torch.where(valid, adv + values, torch.zeros_like(adv))
    if whiten:
        adv = masked_whiten(adv, valid)
    return adv, returns


@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index,
    *,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
):
    """GRPO (Shao et al. 2024): A = (score - group mean) / (group std + epsilon) on every token.

    With ``norm_adv_by_std_in_grpo=False`` it is Dr. GRPO (Liu et al. 2025): A = score - mean.
    The score of a sample is the sum of its token rewards.
    """
    scores = _sequence_scores(token_level_rewards, response_mask)
    _, _, mean, std = _group_stats(scores, group_index)
    adv = scores - mean
    if norm_adv_by_std_in_grpo:
        adv = adv / (std + epsilon)
    adv = _broadcast(adv.to(scores.dtype), response_mask)
    return adv, adv


@torch.no_grad()
def compute_rloo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, group_index):
    """RLOO (Ahmadian et al. 2024): A = score - mean score of the other samples of the group."""
    scores = _sequence_scores(token_level_rewards, response_mask)
    count, total, _, _ = _group_stats(scores, group_index)
    leave_one_out = (total - scores) / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, scores - leave_one_out, torch.zeros_like(leave_one_out))
    adv = _broadcast(adv.to(scores.dtype), response_mask)
    return adv, adv


@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
):
    """REINFORCE++ (Hu 2025): discounted return-to-go per token, whitened over the batch."""
    returns = _returns_to_go(token_level_rewards, response_mask, gamma)
    return masked_whiten(returns, response_mask), returns


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, group_index, epsilon: float = 1e-6
):
    """REINFORCE++-baseline (Hu 2025): score - group mean on every token, whitened over the batch.

    ``epsilon`` is the variance floor of the whitening: (x - mean) / sqrt(var + epsilon).
    """
    scores = _sequence_scores(token_level_rewards, response_mask)
    _, _, mean, _ = _group_stats(scores, group_index)
    adv = masked_whiten(_broadcast(scores - mean, response_mask), response_mask, eps=epsilon).to(scores.dtype)
    return adv, adv


@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor, response_mask: torch.Tensor
):
    """ReMax (Li et al. 2023): undiscounted return-to-go minus the greedy response's score."""
    returns = _returns_to_go(token_level_rewards, response_mask, 1.0)
    adv = returns - _broadcast(reward_baselines.to(returns.dtype), response_mask)
    return adv, returns


@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, group_index, *, f_norm: float = 1.0
):
    """GPG (Chu et al. 2025): A_i = alpha * (R_i - group mean) / f_norm on every token.

    As in verl: alpha = B / (number of samples of the batch whose score is non-zero, at least 1),
    and a group of one has mean 0 (its advantage is alpha * R_i). The paper's alpha is
    B / (B - M), M the samples of groups whose rewards are all equal; for 0/1 rewards the two differ.
    """
    scores = _sequence_scores(token_level_rewards, response_mask)
    count, _, mean, _ = _group_stats(scores, group_index)
    mean = torch.where(count > 1, mean, torch.zeros_like(mean))
    alpha = scores.shape[0] / max(int(torch.count_nonzero(scores).item()), 1)
    adv = _broadcast((alpha * (scores - mean) / f_norm).to(scores.dtype), response_mask)
    return adv, adv


@torch.no_grad()
def compute_gdpo_outcome_advantage(
    reward_components: torch.Tensor,
    response_mask: torch.Tensor,
    group_index,
    *,
    reward_weights=None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
):
    """GDPO (Liu et al. 2026): normalise each reward component within its group, then combine.

    ``reward_components`` is ``[B, K]``, K scores per sample (e.g. accuracy and format). Per
    component k: A_k = (r_k - mean_g r_k) / (std_g r_k + epsilon), std unbiased, as GRPO does for
    one score (no division with ``norm_adv_by_std_in_grpo=False``). Then A = sum_k w_k A_k
    (w = ``reward_weights``, all 1 by default) is whitened over the batch's valid tokens. Summing
    the components first (GRPO) would let a component with a wide spread drown the others.
    """
    components = reward_components if reward_components.is_floating_point() else reward_components.float()
    if components.dim() != 2:
        raise ValueError(f"reward_components must be [B, K], got shape {tuple(components.shape)}")
    n_components = components.shape[1]
    weights = [1.0] * n_components if reward_weights is None else [float(w) for w in reward_weights]
    if len(weights) != n_components:
        raise ValueError(f"{len(weights)} reward_weights for {n_components} reward components")
    combined = components.new_zeros(components.shape[0], dtype=torch.float64)
    for k in range(n_components):
        scores = components[:, k]
        count, _, mean, std = _group_stats(scores, group_index)
        adv = scores - torch.where(count > 1, mean, torch.zeros_like(mean))
        if norm_adv_by_std_in_grpo:
            adv = adv / (std + epsilon)
        combined = combined + weights[k] * adv
    adv = masked_whiten(_broadcast(combined, response_mask), response_mask).to(components.dtype)
    return adv, adv


@torch.no_grad()
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    *,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
):
    """Optimal token baseline (verl's OTB): a baseline per time step and group, weighted by how much
    each trajectory's score-function variance has built up so far.

    With G_t the return-to-go and w_t = 1 - 2 pi_t + sum_v pi(v)^2 (the squared norm of the
    log-softmax gradient at the sampled token, pi_t its probability under the old policy), the
    cumulative W_t = sum_{j<=t} w_j weighs each sample of a prompt's group:
    B_t = sum_i G_it W_it / sum_i W_it, and A_t = G_t - B_t. With rollout importance weights rho,
    w_t is scaled by rho_t^2. A group of one has no baseline (A = G). ``handle_zero_tail``: past the
    end of the group's second-longest response, the one longest response has no one to compare
    with, and its baseline there is 0.
    """
    valid = _as_bool(response_mask)
    mask = valid.to(token_level_rewards.dtype)
    returns = _returns_to_go(token_level_rewards, response_mask, 1.0)
    w = 1.0 - 2.0 * old_log_probs.exp() + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights ** 2
    cumulative = (w * mask).cumsum(dim=-1)
    ids, n_groups = _group_ids(group_index, returns.device)
    shape = (n_groups, returns.shape[1])
    numerator = returns.new_zeros(shape).index_add_(0, ids, returns * cumulative * mask)
    denominator = returns.new_zeros(shape).index_add_(0, ids, cumulative * mask) + epsilon
    count = torch.bincount(ids, minlength=n_groups)
    baselines = torch.where((count > 1)[ids, None], (numerator / denominator)[ids], torch.zeros_like(returns))
    if handle_zero_tail:
        lengths = valid.sum(dim=-1)
        for g in range(n_groups):
            members = (ids == g).nonzero(as_tuple=True)[0]
            if members.numel() < 2:
                continue
            ordered = torch.sort(lengths[members]).values
            longest, second = int(ordered[-1]), int(ordered[-2])
            if longest > second:
                only = members[lengths[members] == longest]
                baselines[only[0], second:] = 0.0
    return (returns - baselines) * mask, returns


ADV_ESTIMATORS = {
    "gae": compute_gae_advantage_return,
    "grpo": compute_grpo_outcome_advantage,
    "rloo": compute_rloo_outcome_advantage,
    "reinforce_plus_plus": compute_reinforce_plus_plus_outcome_advantage,
    "reinforce_plus_plus_baseline": compute_reinforce_plus_plus_baseline_outcome_advantage,
    "remax": compute_remax_outcome_advantage,
    "gpg": compute_gpg_outcome_advantage,
    "gdpo": compute_gdpo_outcome_advantage,
    "optimal_token_baseline": compute_optimal_token_baseline_advantage,
}
# Estimators verl has and this project does not (yet): named as such when asked for.
NOT_IMPLEMENTED_ESTIMATORS = {name: f"{name} is an advantage estimator of verl that this project does not implement yet"
                              for name in ("tir_optimal_token_baseline",)}

# What an estimator that declares the input without a default is asking for, in words.
_INPUT_HINTS = {
    "values": "values from a critic",
    "group_index": "group_index (the prompt id of each sample)",
    "reward_baselines": "reward_baselines (the greedy response's score for each sample)",
    "reward_components": "reward_components (the [B, K] scores of the reward components it normalises apart)",
    "old_log_probs": "old_log_probs (the old policy's log-probs, computed before the advantages)",
    "sum_pi_squared": "sum_pi_squared (sum over the vocabulary of pi^2 at each response token, from the actor's "
                      "log-prob pass)",
}


def estimator_inputs(name: str) -> frozenset[str]:
    """The inputs estimator ``name`` reads, from its signature (empty for an unknown name): e.g. an
    estimator reading ``old_log_probs`` needs the old-log-prob pass before the advantages."""
    fn = ADV_ESTIMATORS.get(name)
    return frozenset(inspect.signature(fn).parameters) if fn is not None else frozenset()


def compute_advantage(
    name: str,
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    values: torch.Tensor | None = None,
    group_index=None,
    reward_baselines: torch.Tensor | None = None,
    reward_components: torch.Tensor | None = None,
    reward_weights=None,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
):
    """Run ``ADV_ESTIMATORS[name]`` with the inputs its signature names; the rest are ignored."""
    if name not in ADV_ESTIMATORS:
        close = difflib.get_close_matches(name, list(ADV_ESTIMATORS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown advantage estimator {name!r}; allowed: {', '.join(ADV_ESTIMATORS)}.{hint}")
    available = dict(
        token_level_rewards=token_level_rewards, response_mask=response_mask, values=values,
        group_index=group_index, reward_baselines=reward_baselines, reward_components=reward_components,
        reward_weights=reward_weights, old_log_probs=old_log_probs, sum_pi_squared=sum_pi_squared,
        rollout_is_weights=rollout_is_weights, gamma=gamma, lam=lam,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, epsilon=epsilon,
    )
    kwargs = {}
    for param in inspect.signature(ADV_ESTIMATORS[name]).parameters.values():
        if param.name not in available:
            continue
        if available[param.name] is None:
            if param.default is inspect.Parameter.empty:
                raise ValueError(f"{name} needs {_INPUT_HINTS.get(param.name, param.name)}")
            continue
        kwargs[param.name] = available[param.name]
    return ADV_ESTIMATORS[name](**kwargs)
