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
from pathlib import Path

from verl.distributed.process_group import broadcast_object, is_main_process, launched_distributed
from verl.distributed.rollout_stream import RolloutRequest, RolloutResult, WorkerSpec, open_stream, started
from verl.distributed.weight_sync import WeightSender
from verl.errors import ConfigError
from verl.protocol import Batch
from verl.rollout.seeding import with_prompt_seeds
from verl.trainer.ppo.async_config import head_prompts, rollout_processes, split_threads
from verl.trainer.ppo.rl_trainer import RLTrainer
from verl.trainer.ppo.sampling import MAX_DRAWS_PER_STEP, RolloutScorer
from verl.trainer.timing import timer


def next_request(step: int, published: int, whole: int, head: int, prompts: int, tail_waiting: bool) -> str | None:
    """What the controller may send for ``step`` while the rollout holds version ``published``: ``"tail"``
    (the rest of a step whose ``head`` prompts went out), ``"whole"``, ``"head"``, or None (wait). A step
    goes whole once it is within ``whole`` steps ahead; one step further, its head goes (the whole step,
    when the head is all of its ``prompts``)."""
    ahead = (step - 1) - published
    if tail_waiting:
        return "tail" if ahead <= whole else None
    if ahead <= whole or (head >= prompts and ahead == whole + 1):
        return "whole"
    if head and ahead == whole + 1:
        return "head"
    return None


def joined(step: int, parts: list[RolloutResult]) -> RolloutResult:
    """One step's answer from the answers to its requests (a head and a tail), rows in prompt order."""
    if len(parts) == 1:
        return parts[0]
    return RolloutResult(step, Batch.concat([p.batch for p in parts]), min(p.version for p in parts),
                         gen_seconds=sum(p.gen_seconds for p in parts), idle_seconds=sum(p.idle_seconds for p in parts),
                         load_seconds=sum(p.load_seconds for p in parts),
                         score_seconds=sum(p.score_seconds for p in parts))


class AsyncRollouts:
    """The controller's side of the asynchronous rollout: what was submitted, what came back, the
    published version, and the metrics of both."""

    def __init__(self, trainer: "AsyncRLTrainer", stream, sender: WeightSender):
        """``stream``: the rollout, held by rank 0 of a torchrun job (None on the other ranks, which
        take part in gathering the weights and receive every batch from rank 0)."""
        a = trainer.config.async_training
        self.trainer = trainer
        self.stream = stream
        self.sender = sender
        self.bound = a.staleness_bound()
        self.whole, _ = a.staleness_split()
        self.head = head_prompts(trainer.config)
        """Prompts of the step after the whole ones that may go out one version earlier (0: none)."""
        self.sync_every = a.trigger_parameter_sync_step
        self.partial = a.partial_rollout
        self.published = 0
        """P: the last version published to the rollout."""
        self.sent: int | None = None
        """The version the rollout holds (None: a fresh rollout, which gets P with its first request)."""
        self.next_request = 1
        """The first step whose prompts (or whose tail, when its head went out) are not yet submitted."""
        self.tails: dict[int, object] = {}
        """A step whose head went out: the rest of its prompts, until the bound lets them out."""
        self.parts: dict[int, list[str]] = {}
        """What each submitted step's requests are, in order: ``samples`` (the whole step, or its head and its
        tail) and, for ReMax, each followed by ``greedy`` (its baseline: the same prompts, greedy, n=1)."""
        self.remax = trainer.config.algorithm.adv_estimator == "remax"
        self.done: dict[int, list[RolloutResult]] = {}
        """Answers taken from the stream, not yet trained on (a step's parts in order)."""
        self.sync_cost = (0.0, 0)
        self.params = None
        self.merge_lora = bool(trainer.config.actor_rollout_ref.model.lora.get("merge", False))
        """verl's ``model.lora.merge``: a LoRA policy's weights go merged (else as adapters)."""

    # ------------------------------------------------------------------ requests
    def fill(self) -> None:
        """Submit every request the bound allows now, in step order up to the run's last step: a step
        whole once ``(s - 1) - P`` is within the whole steps of the bound, and with a part step
        (``staleness_threshold``) its first ``head`` prompts one version earlier, the rest later."""
        t = self.trainer
        while self.next_request <= t.total_steps:
            step = self.next_request
            action = next_request(step, self.published, self.whole, self.head, t.config.data.train_batch_size,
                                  step in self.tails)
            if action is None:
                return
            if action == "tail":
                self._submit(step, self.tails.pop(step))
            elif action == "whole":
                self.parts[step] = self._kinds(1)
                self._submit(step, self._prompts(step))
            else:
                prompts = self._prompts(step)
                self.parts[step] = self._kinds(2)
                self.tails[step] = prompts.index(slice(self.head, None))
                self._submit(step, prompts.index(slice(0, self.head)))
                return  # its tail waits for the next version
            self.next_request += 1

    def _prompts(self, step: int):
        t = self.trainer
        return with_prompt_seeds(next(t.train_loader), t.config.trainer.seed, step * MAX_DRAWS_PER_STEP)

    def _kinds(self, requests: int) -> list[str]:
        return (["samples", "greedy"] if self.remax else ["samples"]) * requests

    def _submit(self, step: int, prompts) -> None:
        """The request for ``prompts`` of ``step`` (with the weights, when the rollout holds older ones) and,
        for ReMax, right after it the request of their greedy baseline, generated with the same weights."""
        weights = self._weights() if self.sent != self.published else None
        if self.params is None:
            self.params = self.trainer.actor_rollout_ref.call("sampling_params")
        if self.stream is not None:
            self.stream.submit(RolloutRequest(step, prompts, self.params, weights))
            if self.remax:
                greedy = dataclasses.replace(self.params, n=1, do_sample=False, logprobs=False)
                self.stream.submit(RolloutRequest(step, prompts, greedy))

    def _weights(self):
        """The published weights as a message for the rollout (None on the ranks without the stream). Of
        a LoRA policy, unless ``model.lora.merge``: its adapters, with the base weights when the rollout
        holds none yet (a fresh or resumed rollout)."""
        lora = "merged" if self.merge_lora else "adapters+base" if self.sent is None else "adapters"
        state = self.trainer.actor_rollout_ref.call("rollout_weights", lora)  # a collective under FSDP: every rank
        self.sent = self.published
        if self.stream is None:
            return None
        weights, cost = self.sender.pack(state, self.published)
        self.sync_cost = (self.sync_cost[0] + cost.seconds, self.sync_cost[1] + cost.nbytes)
        return weights

    def publish(self, version: int) -> None:
        """The trainer reached ``version``: publish it every ``trigger_parameter_sync_step`` steps (with
        partial rollouts sent at once: the rollout takes it mid-generation) and submit what the bound
        now allows."""
        if version % self.sync_every == 0:
            self.published = version
            if self.partial and self.sent is not None:
                weights = self._weights()
                if self.stream is not None:
                    self.stream.send_weights(weights)
        self.fill()

    def take(self, step: int) -> tuple[RolloutResult, int, int]:
        """The answer for ``step`` (waiting for it), how many later steps' answers were already done, and
        how many requests are still open (on every rank: rank 0's, broadcast)."""
        if self.stream is None:
            self.parts.pop(step, None)
            return broadcast_object(None)
        self._collect(block_for=None)
        while len(self.done.get(step, ())) < len(self.parts[step]):
            self._collect(block_for=step)
        kinds, answers = self.parts.pop(step), self.done.pop(step)
        result = joined(step, [a for a, kind in zip(answers, kinds) if kind == "samples"])
        greedy = [a.batch for a, kind in zip(answers, kinds) if kind == "greedy"]
        if greedy:
            result = dataclasses.replace(result, baseline=Batch.concat(greedy))
        taken = (result, len(self.done), len(self.stream.submitted))
        return broadcast_object(taken) if self.trainer.distributed else taken

    def draw_more(self, step: int, draw: int) -> RolloutResult:
        """DAPO's ``draw``-th further prompt batch of ``step`` (the loader's next, seeded as the synchronous
        step seeds it), generated by the rollout after what is already queued ahead, with the weights
        published last; waits for it (on every rank: rank 0's, broadcast)."""
        t = self.trainer
        prompts = with_prompt_seeds(next(t.train_loader), t.config.trainer.seed, step * MAX_DRAWS_PER_STEP + draw)
        self.parts[step] = self._kinds(1)
        self._submit(step, prompts)
        return self.take(step)[0]

    def _collect(self, block_for: int | None) -> None:
        while self.stream.submitted:
            if block_for is None and not self.stream.answer_ready():
                return
            result = self.stream.result()
            self.done.setdefault(result.step, []).append(result)
            if result.step == block_for:
                return

    def drain(self) -> None:
        """Wait for every open request (before a checkpoint: its batches go into it; rank 0 writes it)."""
        while self.stream is not None and self.stream.submitted:
            result = self.stream.result()
            self.done.setdefault(result.step, []).append(result)

    # ------------------------------------------------------------------ metrics
    def metrics(self, step: int, result: RolloutResult, ahead: int, in_flight: int, waited: float) -> dict[str, float]:
        trained_at = step - 1
        first = result.batch["policy_version_first"].float()
        last = result.batch["policy_version_last"].float()
        staleness = trained_at - first
        pack_seconds, pack_bytes = self.sync_cost
        self.sync_cost = (0.0, 0)
        busy = result.gen_seconds + result.load_seconds
        return {"async/staleness_mean": staleness.mean().item(), "async/staleness_max": staleness.max().item(),
                "async/staleness_last_mean": (trained_at - last).mean().item(),
                "async/partial_frac": (last > first).float().mean().item(),
                "async/trainer_version": trained_at, "async/rollout_version": first.min().item(),
                "async/queue_depth": ahead, "async/in_flight": in_flight,
                "async/trainer_wait_s": waited,
                "async/rollout_idle_frac": result.idle_frac if result.idle_frac is not None
                else result.idle_seconds / max(result.idle_seconds + busy, 1e-9),
                "async/rollout_gen_s": result.gen_seconds, "async/rollout_reward_s": result.score_seconds,
                "async/weight_sync_s": pack_seconds + result.load_seconds, "async/weight_sync_bytes": pack_bytes}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        self.drain()
        return {"published": self.published, "next_request": self.next_request,
                "done": {step: [(r.batch, r.version) for r in parts] for step, parts in self.done.items()},
                "tails": dict(self.tails), "parts": dict(self.parts)}

    def load_state_dict(self, state: dict) -> None:
        self.published, self.next_request = state["published"], state["next_request"]
        # A checkpoint of an earlier release holds one (batch, version) per step, each step whole.
        done = {step: value if isinstance(value, list) else [value] for step, value in state["done"].items()}
        self.done = {step: [RolloutResult(step, batch, version) for batch, version in parts]
                     for step, parts in done.items()}
        self.tails = dict(state.get("tails", {}))
        parts = state.get("parts", {step: len(parts) for step, parts in done.items()})
        # An earlier release counted a step's requests, all of them samples.
        self.parts = {step: ["samples"] * kinds if isinstance(kinds, int) else list(kinds)
                      for step, kinds in parts.items()}
        self.sent = None
        if self.tails and not self.head:
            step = min(self.tails)
            raise ConfigError(f"the checkpoint holds the first prompts of step {step} generated ahead and the rest not "
                              f"yet (a run with a fractional async_training.staleness_threshold); this run generates "
                              f"whole steps: resume with the staleness_threshold of the run that wrote it")
        for step, result in [(step, r) for step, parts in sorted(self.done.items()) for r in parts]:
            if (step - 1) - result.version > self.bound:
                raise ConfigError(f"the checkpoint holds the batch of step {step}, generated with policy version "
                                  f"{result.version}: trained at version {step - 1} it would be "
                                  f"{step - 1 - result.version} versions old, beyond async_training.max_staleness="
                                  f"{self.bound}; resume with max_staleness >= {step - 1 - result.version}, as the "
                                  f"run that wrote it")


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
        metrics["async/trainer_idle_frac"] = waited / max(timing["timing_s/step"], 1e-9)
        metrics = self.step_metrics(batch, metrics, timing, traffic)
        self.count_nonfinite_updates(metrics)
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

    def state_dict(self) -> dict:
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
                      scorer=scorer)
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
