"""The first stages of the RL step: generate responses and score them, for one step's batch.

``StepSampler.generate_and_score`` runs, each stage timed:

* ``gen``: the rollout engine samples ``rollout.n`` responses per prompt;
* ``gen_baseline`` (ReMax only): one greedy response per prompt, scored; its score becomes the
  ``reward_baselines`` of that prompt's samples (Li et al. 2023);
* ``reward``: rule and/or model scores, plus DAPO's overlong penalty when
  ``reward_model.overlong_buffer.enable`` (training only; validation scores stay unshaped).

With ``algorithm.filter_groups.enable`` (DAPO dynamic sampling, Yu et al. 2025) prompt groups
whose responses all score the same are dropped and further prompt batches are drawn (and go
through the same stages) until the step has ``data.train_batch_size`` groups, or until
``max_num_gen_batches`` batches were drawn; then the step trains on the groups kept so far (or,
if not a single group was informative, on the last batch as it is) and the metrics say so.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from verl.algorithms import add_to_last_token, groups_with_variance, overlong_penalty
from verl.config.cross_checks import overlong_buffer_len
from verl.errors import VerlError
from verl.protocol import Batch
from verl.rollout import concat_rollouts
from verl.rollout.seeding import with_prompt_seeds
from verl.trainer.timing import timer


# Seeds of prompt draws: step s uses draws s * MAX_DRAWS_PER_STEP + k (k-th batch of dynamic sampling).
MAX_DRAWS_PER_STEP = 1 << 16


def reward_columns(config, score, batch: Batch) -> Batch:
    """The reward stage of a generated ``batch``: ``score(batch)`` (a reward worker's ``token_level_scores`` and
    reward extras), with DAPO's overlong penalty and the agent's turn rewards added where configured."""
    scored = score(batch)
    buffer = config.reward_model.overlong_buffer
    if buffer.enable:
        mask = batch["response_mask"]
        penalty = overlong_penalty(mask.sum(-1), config.data.max_response_length, overlong_buffer_len(config),
                                   buffer.penalty_factor)
        scored["token_level_scores"] = add_to_last_token(scored["token_level_scores"], mask, penalty)
        scored["reward_extra/overlong_penalty"] = penalty.tolist()
    if "agent_reward" in batch and config.actor_rollout_ref.rollout.multi_turn.add_agent_rewards:
        # Multi-turn: the rewards given along the trajectory (tools' execute and calc_reward, the
        # environment's steps) add to the reward function's score, at the last trained token.
        tool_reward = batch["agent_reward"].to(scored["token_level_scores"].device)
        scored["token_level_scores"] = add_to_last_token(scored["token_level_scores"], batch["response_mask"],
                                                         tool_reward)
    return scored


class RolloutScorer:
    """The reward stage run by an asynchronous run's rollout (``async_training.reward_placement=rollout``):
    the run's reward worker, built where the rollout runs, with ``tokenizer`` (the rollout's). Picklable
    with its config (``functools.partial(RolloutScorer, config)`` crosses to the rollout's process)."""

    def __init__(self, config, tokenizer):
        from verl.trainer.ppo.roles import reward_worker

        self.config = config
        self.worker = reward_worker(config, tokenizer=tokenizer)

    def __call__(self, batch: Batch) -> Batch:
        return reward_columns(self.config, self.worker.score, batch)


class StepSampler:
    def __init__(self, config, actor_rollout_ref, reward):
        self.config = config
        self.actor_rollout_ref = actor_rollout_ref
        self.reward = reward
        self.pad_token_id = actor_rollout_ref.call("pad_token_id")

    def generate_and_score(self, prompts: Batch, prompt_loader, timing: dict, *, step: int = 0
                           ) -> tuple[Batch, dict[str, float]]:
        """A scored rollout batch for ``prompts`` (drawing more from ``prompt_loader`` only for
        dynamic sampling), and the sampling metrics. ``step`` seeds the samples (with the run's
        seed and each prompt's place in the batch), so they do not depend on how many ranks draw them."""
        batch = self._rollout(prompts, timing, seed_draw=step * MAX_DRAWS_PER_STEP)
        if not self.config.algorithm.filter_groups.enable:
            return batch, {}
        return self.keep_informative_groups(
            batch, lambda draw: self._rollout(next(prompt_loader), timing, seed_draw=step * MAX_DRAWS_PER_STEP + draw))

    # ------------------------------------------------------------------ one prompt batch
    def _rollout(self, prompts: Batch, timing: dict, seed_draw: int) -> Batch:
        prompts = with_prompt_seeds(prompts, self.config.trainer.seed, seed_draw)
        with timer("gen", timing):
            batch = self.actor_rollout_ref.run("generate_sequences", prompts)
        if self.config.algorithm.adv_estimator == "remax":
            with timer("gen_baseline", timing):
                baselines = self._greedy_scores(prompts).repeat_interleave(len(batch) // len(prompts))
                batch["reward_baselines"] = baselines.to(batch["responses"].device)
        with timer("reward", timing):
            batch = batch.union(self.score(batch))
        return batch

    def _greedy_scores(self, prompts: Batch) -> torch.Tensor:
        """``[B_prompts]``: the score of each prompt's greedy response (ReMax's baseline)."""
        params = self.actor_rollout_ref.call("sampling_params")
        greedy = dataclasses.replace(params, n=1, do_sample=False, logprobs=False)
        out = self.actor_rollout_ref.run("generate_sequences", prompts, params=greedy)
        return self.score(out)["token_level_scores"].sum(-1)

    def score(self, batch: Batch) -> Batch:
        """The reward stage of a generated batch (:func:`reward_columns`), scored by the reward role."""
        return reward_columns(self.config, lambda b: self.reward.run("score", b), batch)

    # ------------------------------------------------------------------ DAPO dynamic sampling
    def _group_values(self, batch: Batch) -> torch.Tensor:
        """``[B]``: the quantity that must differ within a group (``filter_groups.metric``)."""
        metric = self.config.algorithm.filter_groups.metric
        if metric == "score":
            return batch["token_level_scores"].sum(-1).float()
        key = f"reward_extra/{metric}"
        if key not in batch:
            extras = [k.split("/", 1)[1] for k in batch.keys() if k.startswith("reward_extra/")]
            raise VerlError(f"algorithm.filter_groups.metric={metric!r}: the reward function returned no such "
                            f"key; use score or one of the keys it returns: {extras or 'none'}")
        try:
            return torch.tensor(np.asarray(batch[key], dtype=np.float64))
        except (TypeError, ValueError) as e:
            raise VerlError(f"algorithm.filter_groups.metric={metric!r}: the reward function's values for it "
                            f"are not all numbers ({e})") from e

    def keep_informative_groups(self, batch: Batch, more) -> tuple[Batch, dict[str, float]]:
        """DAPO's filter over a scored ``batch``: its groups whose responses differ, and more from
        ``more(draw)`` (the scored batch of the step's ``draw``-th prompt batch, 1, 2, ...) until the step
        has ``data.train_batch_size`` of them or ``max_num_gen_batches`` batches were drawn."""
        cfg = self.config.algorithm.filter_groups
        target = self.config.data.train_batch_size
        n = self.config.actor_rollout_ref.rollout.n
        kept: list[Batch] = []
        kept_groups = dropped_groups = 0
        draws = 1
        while True:
            keep = groups_with_variance(self._group_values(batch), batch["uid"])
            kept_groups += int(keep.sum()) // n
            dropped_groups += int((~keep).sum()) // n
            if keep.any():
                kept.append(batch.index(keep))
            if kept_groups >= target or draws >= cfg.max_num_gen_batches:
                break
            batch = more(draws)
            draws += 1
        # Samples of a group are adjacent and stay so: the first groups fill the step exactly.
        out = concat_rollouts(kept, self.pad_token_id).index(slice(0, target * n)) if kept else batch
        metrics = {"filter_groups/num_gen_batches": draws, "filter_groups/kept_groups": kept_groups,
                   "filter_groups/dropped_groups": dropped_groups, "filter_groups/trained_groups": len(out) // n,
                   "filter_groups/cap_hit": float(kept_groups < target)}
        return out, metrics
