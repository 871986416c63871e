"""Asynchronous RL: the rollout generates the next steps' samples while the trainer updates.

``AsyncRLTrainer`` is the RL trainer whose step takes its batch from a rollout running apart
(:mod:`verl.distributed.rollout_stream`) instead of generating it; everything after the batch is
scored (log-probs, advantages, updates, checkpoints, validation) is the synchronous step's.

Versions. The trainer's weights after ``v`` updates are policy version ``v``; the batch of step
``s`` is trained at version ``s - 1``. Every ``trigger_parameter_sync_step`` steps the trainer
publishes its weights; the rollout holds the last published version ``P`` and stamps every row it
generates with it (``policy_version_first`` / ``_last``). A sample's staleness is the trainer's
version minus the sample's.

The bound. The controller submits the request for step ``s`` only once ``(s - 1) - P <=
max_staleness``: the rollout waits rather than generate a sample that would be too old when
trained. Requests go out in order the moment the bound allows, each with the weights published
last (sent once, with the first request after the publish), so which version generates which step
is fixed by the configuration alone: a run is reproducible, ``max_staleness=0`` is the synchronous
run exactly, and a checkpoint holds the batches generated ahead (with their versions), so a resumed
run continues as the uninterrupted one would. A fractional ``staleness_threshold`` adds part of a
step: the first :func:`head_prompts` prompts of the step after the whole ones go out one version
earlier than the rest of it (two requests, joined when the step is taken).

DAPO's dynamic sampling (``algorithm.filter_groups``): a step's first batch is the one generated ahead;
each further prompt batch is asked of the rollout when the step needs it (:meth:`AsyncRollouts.draw_more`),
seeded as the synchronous step seeds it and generated with the weights published last, so bound 0 is
still the synchronous run and a refill is never older than the step's own batch.

Partial rollouts (``partial_rollout=true``): the weights are sent the moment they are published and
the rollout takes them mid-generation (:mod:`verl.rollout.partial`); a row's first version still
obeys the bound, its last is newer. Where a swap falls depends on timing: such runs are not
reproducible.

Off-policy correction with stale samples (``max_staleness > 0``): the rollout reports its
log-probs; they are pi_old of the PPO ratio (verl's bypass mode), or with
``compute_prox_log_prob`` the trainer's recomputed log-probs are the proximal policy and the
rollout's weight each token (AReaL's decoupled objective; ``algorithm.rollout_correction``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from pathlib import Path

from verl.distributed.process_group import is_main_process, launched_distributed
from verl.distributed.rollout_stream import RolloutResult, WorkerSpec, open_stream, started
from verl.distributed.weight_sync import WeightSender
from verl.protocol import Batch
from verl.trainer.ppo.async_config import rollout_processes, split_threads
from verl.trainer.ppo.async_rollouts import AsyncRollouts
from verl.trainer.ppo.rl_trainer import RLTrainer
from verl.trainer.ppo.sampling import RolloutScorer
from verl.trainer.ppo.validation import validation_metrics, validation_requests
from verl.trainer.timing import timer
from verl.tracking.tracker import StepsInOrder


class AsyncRLTrainer(RLTrainer):
    """:class:`RLTrainer` whose batches come from a rollout that runs ahead (module docstring)."""

    label = "RL async"

    def __init__(self, config, *, stream, **kwargs):
        super().__init__(config, **kwargs)
        a = config.async_training
        folder = Path(self.out_dir) / "weight_sync" if a.weight_backend() == "file" else None
        self.distributed = launched_distributed()
        channel = getattr(stream, "channel", None)  # the broadcast backend's
        self.rollouts = AsyncRollouts(self, stream, WeightSender(a.weight_backend(), folder, channel))
        self.rollout_validates = not a.use_trainer_do_validate
        """verl's fully-async default: the rollout validates too (:meth:`log_validation`)."""
        if self.rollout_validates:
            self.tracker = StepsInOrder(self.tracker)

    def resume(self) -> None:
        super().resume()
        self.rollouts.fill()  # the rollout starts on the first steps while the trainer validates

    def next_step(self) -> dict:
        self.global_step += 1
        step = self.global_step
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {}
        traffic = self.traffic()
        with timer("step", timing):
            with timer("wait_rollout", timing):
                result, ahead, in_flight = self.rollouts.take(step)
            batch = self._scored(result, timing)
            if self.config.algorithm.filter_groups.enable:
                batch, result = self._keep_informative_groups(step, batch, result, metrics, timing)
            waited = timing["timing_s/wait_rollout"]
            metrics.update(self.rollouts.metrics(step, result, ahead, in_flight, waited))
            batch = self.learn(batch, metrics, timing)
            if "rollout_corr/kl" in metrics:
                metrics["async/mismatch_kl"] = metrics["rollout_corr/kl"]
            with timer("weight_sync", timing):
                self.rollouts.publish(step)
        if self.rollout_validates:  # validations answered meanwhile (outside the step's time)
            self._record_validations(wait=False)
        metrics["async/trainer_idle_frac"] = waited / max(timing["timing_s/step"], 1e-9)
        metrics = self.step_metrics(batch, metrics, timing, traffic)
        self.watch_step(metrics)
        return metrics

    def _scored(self, result: RolloutResult, timing: dict) -> Batch:
        """The reward stage of an answer: with ReMax, first each prompt's baseline, the score of its greedy
        response (``reward_baselines``, as the synchronous step sets it)."""
        batch = result.batch
        if result.baseline is not None:
            with timer("gen_baseline", timing):
                greedy = self._score(result.baseline)["token_level_scores"].sum(-1)
                batch["reward_baselines"] = greedy.repeat_interleave(len(batch) // len(greedy)).to(
                    batch["responses"].device)
        if "token_level_scores" in batch:  # the rollout scored it (async_training.reward_placement=rollout)
            return batch
        with timer("reward", timing):
            return batch.union(self.sampler.score(batch))

    def _score(self, batch: Batch) -> Batch:
        return batch if "token_level_scores" in batch else self.sampler.score(batch)

    def _keep_informative_groups(self, step: int, batch: Batch, result: RolloutResult, metrics: dict,
                                 timing: dict) -> tuple[Batch, RolloutResult]:
        """DAPO's dynamic sampling over the step's scored batch: further prompt batches come from the
        rollout (:meth:`AsyncRollouts.draw_more`). Returns the batch to train on and, for the metrics, the
        step's answer as if it had been that batch (its rows' versions, the rollout's time over all draws)."""
        answers = [result]

        def more(draw: int) -> Batch:
            with timer("wait_rollout", timing):
                answers.append(self.rollouts.draw_more(step, draw))
            return self._scored(answers[-1], timing)

        batch, sample_metrics = self.sampler.keep_informative_groups(batch, more)
        metrics.update(sample_metrics)
        if len(answers) == 1:
            return batch, dataclasses.replace(result, batch=batch)
        return batch, RolloutResult(step, batch, min(a.version for a in answers),
                                    gen_seconds=sum(a.gen_seconds for a in answers),
                                    idle_seconds=sum(a.idle_seconds for a in answers),
                                    load_seconds=sum(a.load_seconds for a in answers),
                                    score_seconds=sum(a.score_seconds for a in answers))

    def log_validation(self) -> None:
        """With the rollout validating: the validation's prompts go to the rollout with the trainer's weights now,
        and its metrics are recorded (for this step) once its answers are in, while the trainer goes on: at a later
        step, before a checkpoint, or at once after the last step."""
        if not self.rollout_validates:
            super().log_validation()
            return
        start = time.perf_counter()
        self.tracker.expect(self.global_step)
        self.rollouts.submit_validation(self.global_step, validation_requests(
            self.actor_rollout_ref, self.val_batches, self.config))
        self.stage_seconds["validate"] += time.perf_counter() - start
        if self.global_step >= self.total_steps:  # nothing left to overlap with
            self._record_validations(wait=True)

    def _record_validations(self, wait: bool) -> None:
        """Score and record the validations whose answers are in (``wait``: every one still open)."""
        for step, answers, gen_seconds in self.rollouts.finished_validations(wait):
            start = time.perf_counter()
            generations = self.generations_wanted()
            metrics = validation_metrics(self.actor_rollout_ref, self.reward, answers, generations)
            metrics["timing_s/validate_gen"] = gen_seconds  # the rollout's, beside the trainer's timing_s/validate
            self.stage_seconds["validate"] += time.perf_counter() - start
            self.record_validation(step, metrics, generations)
            self.tracker.arrived(step)

    def state_dict(self) -> dict:
        if self.rollout_validates:
            self._record_validations(wait=True)  # a checkpoint holds every validation before it
        state = super().state_dict()
        state["async"] = self.rollouts.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict({key: value for key, value in state.items() if key != "async"})
        # A synchronous run's checkpoint holds nothing generated ahead: the rollout starts from its weights.
        fresh = {"published": self.global_step, "next_request": self.global_step + 1, "done": {}}
        self.rollouts.load_state_dict(state.get("async", fresh))

    def close(self) -> None:
        try:
            if self.rollouts.stream is not None:
                self.rollouts.stream.close()
        finally:
            super().close()


def open_rollout_stream(config):
    """The started rollout of an asynchronous run (its model loaded), where ``async_training`` says;
    under torchrun rank 0 holds it (None on the other ranks)."""
    a = config.async_training
    if not is_main_process():
        return None
    scorer = functools.partial(RolloutScorer, config) if a.reward_placement == "rollout" else None
    spec = WorkerSpec(config.actor_rollout_ref, device=config.trainer.device,
                      max_response_length=config.data.max_response_length, seed=config.trainer.seed,
                      threads=split_threads(config), partial=a.partial_rollout, continuous=a.continuous_batching,
                      groups=a.stream_samples, scorer=scorer)
    if a.rollout_placement == "ranks":  # each rank resolves the device for itself: cuda:LOCAL_RANK on GPUs
        return started(_rank_streams(config, spec))
    return open_stream(a.rollout_placement, spec, timeout_s=config.trainer.dist_timeout_s,
                       broadcast=a.weight_backend() == "broadcast", processes=rollout_processes(config))


def _rank_streams(config, spec):
    """The rollout's own ranks (``rollout_placement=ranks``): Ray actors of a pool of their own under
    ``trainer.backend=ray``, else the torchrun job's last ranks; not yet started."""
    from verl.distributed.rollout_ranks import open_rank_streams, open_ray_rollout

    a = config.async_training
    count, timeout_s, broadcast = rollout_processes(config), config.trainer.dist_timeout_s, \
        a.weight_backend() == "broadcast"
    if config.trainer.backend != "ray":
        return open_rank_streams(spec, count, timeout_s, broadcast)
    from verl.models.loading import resolve_device

    ranks = config.trainer.nnodes * config.trainer.n_gpus_per_node + count
    return open_ray_rollout(spec, count, timeout_s, broadcast, use_gpu=resolve_device(config.trainer.device).type
                            == "cuda", threads=max(1, (os.cpu_count() or 1) // ranks))
