"""Controller-side math of the RL step: KL in the reward, advantages, and batch metrics.

Reads the config and calls the pure functions in :mod:`verl.algorithms`.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch

from verl.algorithms import apply_kl_in_reward, compute_advantage
from verl.errors import VerlError
from verl.protocol import Batch


def apply_kl_and_advantage(batch: Batch, algo_cfg, kl_ctrl=None) -> tuple[Batch, dict]:
    """Adds ``token_level_rewards``, ``advantages`` and ``returns`` to ``batch``."""
    metrics: dict = {}
    mask = batch["response_mask"]
    scores = batch["token_level_scores"]
    if algo_cfg.use_kl_in_reward:
        rewards, metrics = apply_kl_in_reward(scores, batch["old_log_probs"], batch["ref_log_prob"], mask,
                                              kl_ctrl.value, algo_cfg.kl_penalty)
        kl_ctrl.update(float(metrics["actor/reward_kl_penalty"]), n_steps=len(batch))
    else:
        rewards = scores
    components = None
    if algo_cfg.adv_estimator == "gdpo":
        components, gdpo_metrics = gdpo_reward_components(batch, algo_cfg.gdpo_reward_keys)
        metrics.update(gdpo_metrics)
    advantages, returns = compute_advantage(
        algo_cfg.adv_estimator, token_level_rewards=rewards, response_mask=mask,
        values=batch["values"] if "values" in batch else None,
        group_index=batch["uid"] if "uid" in batch else None,
        reward_baselines=batch["reward_baselines"] if "reward_baselines" in batch else None,
        reward_components=components, reward_weights=algo_cfg.gdpo_reward_weights,
        old_log_probs=batch["old_log_probs"] if "old_log_probs" in batch else None,
        sum_pi_squared=batch["sum_pi_squared"] if "sum_pi_squared" in batch else None,
        rollout_is_weights=batch["rollout_is_weights"] if "rollout_is_weights" in batch else None,
        gamma=algo_cfg.gamma, lam=algo_cfg.lam, norm_adv_by_std_in_grpo=algo_cfg.norm_adv_by_std_in_grpo)
    out = batch.union(Batch({"token_level_rewards": rewards, "advantages": advantages, "returns": returns}))
    return out, {k: float(v) for k, v in metrics.items()}


def gdpo_reward_components(batch: Batch, keys) -> tuple[torch.Tensor, dict[str, float]]:
    """``[B, K]`` float32: each sample's value of each of ``keys`` (``algorithm.gdpo_reward_keys``),
    read from the ``reward_extra/<key>`` columns a reward function's dict fills; and their
    ``gdpo/<key>/{mean,std,max,min}`` metrics."""
    if not keys:
        raise VerlError("algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the keys of the reward "
                        "components your reward function returns in its dict, e.g. [accuracy_reward,format_reward]")
    returned = [k.split("/", 1)[1] for k in batch.keys() if k.startswith("reward_extra/")]
    columns, metrics = [], {}
    for key in keys:
        if f"reward_extra/{key}" not in batch:
            raise VerlError(f"algorithm.gdpo_reward_keys names {key!r}, which the reward function did not return: "
                            f"return a dict holding it beside \"score\" (e.g. {{'score': ..., {key!r}: ...}}), or "
                            f"name keys it returns: {', '.join(returned) or 'none (it returns plain numbers)'}")
        values = list(batch[f"reward_extra/{key}"])
        missing = [i for i, v in enumerate(values) if v is None]
        if missing:
            raise VerlError(f"algorithm.gdpo_reward_keys names {key!r}, which the reward function returned for some "
                            f"samples only ({len(missing)} of {len(values)} lack it, the first is sample "
                            f"{missing[0]}): return {key!r} for every sample")
        try:
            column = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise VerlError(f"algorithm.gdpo_reward_keys names {key!r}, whose values the reward function returned "
                            f"are not all numbers ({e})") from e
        columns.append(column)
        metrics.update({f"gdpo/{key}/mean": column.mean(), f"gdpo/{key}/std": column.std(),
                        f"gdpo/{key}/max": column.max(), f"gdpo/{key}/min": column.min()})
    stacked = torch.tensor(np.stack(columns, axis=1), dtype=torch.float32, device=batch["response_mask"].device)
    return stacked, metrics


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(),
            f"{prefix}/min": values.min().item()}


def extra_number(value) -> float | None:
    """A reward function's extra value as a float when it is a number (a bool, an int or float, numpy's
    scalars, a one-value tensor or array), else None (text, lists, None: not averaged)."""
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else None
    elif isinstance(value, np.ndarray):
        value = value.item() if value.size == 1 else None
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    return float(value) if isinstance(value, numbers.Real) else None


def compute_data_metrics(batch: Batch, max_response_length: int) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values and lengths of one step's batch."""
    mask = batch["response_mask"].bool()
    seq_valid = mask.any(dim=1)
    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", batch["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", batch["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", batch["advantages"][mask]))
    metrics.update(_stats("critic/returns", batch["returns"][mask]))
    if "values" in batch:
        metrics.update(_stats("critic/values", batch["values"][mask]))
    resp_len = mask.sum(-1).float()
    metrics.update(_stats("response_length", resp_len))
    metrics["response_length/clip_ratio"] = (resp_len >= max_response_length).float().mean().item()
    prompt_len = batch["attention_mask"][:, :batch["prompts"].shape[1]].sum(-1).float()
    metrics.update(_stats("prompt_length", prompt_len))
    if "entropys" in batch:
        metrics["actor/entropy"] = (batch["entropys"][mask].mean().item() if mask.any() else 0.0)
    if "rollout_log_probs" in batch and "old_log_probs" in batch:
        # How far the engine's sampling distribution is from the actor's (see rollout_is_correction).
        diff = (batch["old_log_probs"] - batch["rollout_log_probs"]).abs()[mask]
        metrics["actor/rollout_log_prob_diff"] = diff.mean().item() if diff.numel() else 0.0
    if "ref_log_prob" in batch and "old_log_probs" in batch:
        kl = (batch["old_log_probs"] - batch["ref_log_prob"])[mask]
        metrics["actor/ref_kl"] = kl.mean().item() if kl.numel() else 0.0
    metrics["response_length/empty_ratio"] = 1.0 - seq_valid.float().mean().item()
    if "agent_turns" in batch:  # multi-turn rollouts (verl.agent.agent_loop)
        metrics.update(_stats("agent/num_turns", batch["agent_turns"].float()))
        metrics["agent/tool_calls/mean"] = batch["agent_tool_calls"].float().mean().item()
        metrics["agent/tool_errors"] = batch["agent_tool_errors"].float().sum().item()
        if "agent_defaulted" in batch:  # values missing from rows or environments that took a default
            metrics["agent/defaulted_values"] = batch["agent_defaulted"].float().sum().item()
        # Rewards along the trajectories (tools' and the environment's), apart from the reward function's.
        metrics["reward/agent/mean"] = batch["agent_reward"].float().mean().item()
    if "agent_turn_rewards" in batch:
        per_turn: dict[int, list[float]] = {}
        for rewards in batch["agent_turn_rewards"]:
            for k, value in enumerate(rewards, start=1):
                per_turn.setdefault(k, []).append(float(value))
        for k, values in sorted(per_turn.items()):
            metrics[f"reward/turn_{k}/mean"] = sum(values) / len(values)
    for key in batch.keys():
        # Extra keys a reward function returned (see RewardWorker): logged as means when numeric;
        # each function's own score (several functions) as reward/<name>/mean.
        if key == "reward_extra/reward_error":
            metrics["reward/num_errors"] = float(sum(batch[key]))
        elif key.startswith("reward_extra/reward_fn/"):
            values = [float(v) for v in batch[key]]
            metrics[f"reward/{key.split('/', 2)[2]}/mean"] = sum(values) / max(len(values), 1)
        elif key.startswith("reward_extra/"):
            numbers = [v for v in map(extra_number, batch[key]) if v is not None]
            if numbers:
                metrics[f"{key}/mean"] = sum(numbers) / len(numbers)
    return metrics

