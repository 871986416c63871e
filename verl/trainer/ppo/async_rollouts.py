"""The controller's side of an asynchronous rollout (:class:`AsyncRollouts`): what is sent to the rollout and
when (the staleness bound, a step's head and tail, DAPO's refills, ReMax's baselines), what came back, the
version published, the metrics of both, and what a checkpoint holds. ``verl.trainer.ppo.async_trainer``'s
trainer takes each step's batch from it; the versions and the bound are explained there.

With ``async_training.stream_samples`` (verl's fully-async trainer) the rollout answers each prompt on its
own as soon as its samples are done, and a step takes the first ``data.train_batch_size`` prompts that are
fresh enough (:func:`choose`), whichever step's request they came with; a prompt too old to train on is
dropped and sent again with the weights published last.
"""

from __future__ import annotations

import dataclasses

import torch

from verl.distributed.process_group import broadcast_object
from verl.distributed.rollout_stream import RolloutRequest, RolloutResult
from verl.distributed.weight_sync import WeightSender
from verl.errors import ConfigError
from verl.protocol import Batch
from verl.rollout.base import concat_rollouts
from verl.rollout.seeding import with_prompt_seeds
from verl.trainer.ppo.async_config import head_prompts
from verl.trainer.ppo.sampling import MAX_DRAWS_PER_STEP


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


VALIDATION = -1
"""The requests of the validation after step ``s`` (``async_training.use_trainer_do_validate=false``) go to the
rollout as step ``VALIDATION - s`` (negative: never a training step's)."""

KEY_STRIDE = 1 << 20
"""A prompt's ``sample_key`` (``stream_samples``): its step x KEY_STRIDE + its place among the step's prompts."""


def choose(pool: list[RolloutResult], need: int, trained_at: int, bound: int
           ) -> tuple[list[RolloutResult] | None, list[RolloutResult], list[RolloutResult]]:
    """``stream_samples``: the prompts a step trained at version ``trained_at`` takes from ``pool`` (answers
    in the order they arrived): the first ``need`` whose samples are at most ``bound`` versions old, in
    their steps' prompt order (None: fewer are done yet); the ones older than that (dropped); and what
    stays in the pool."""
    fresh = [r for r in pool if trained_at - r.version <= bound]
    stale = [r for r in pool if trained_at - r.version > bound]
    if len(fresh) < need:
        return None, stale, fresh
    return sorted(fresh[:need], key=lambda r: r.key), stale, fresh[need:]


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

    def __init__(self, trainer, stream, sender: WeightSender):
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
        self.trained = 0
        """The version of the trainer's weights: its updates so far (at a step's start, the step before's)."""
        self.sent: int | None = None
        """The version the rollout holds (None: a fresh rollout, which gets the trainer's weights with its first
        request). Never older than P once it holds one; newer only after a resume between two syncs (below)."""
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
        self.streaming = a.stream_samples
        """verl's fully-async trainer: a step takes the first prompts whose samples are done (:func:`choose`)."""
        self.pool: list[RolloutResult] = []
        """``stream_samples``: prompts answered and not yet trained on, in the order they arrived."""
        self.prompts: dict[int, Batch] = {}
        """``stream_samples``: each prompt sent and not yet trained on, by ``sample_key`` (sent again if dropped)."""
        self.dropped = 0
        """``stream_samples``: prompts dropped as too old since the last step's metrics."""
        self.validations: dict[int, tuple[int, list[tuple[str, int]], int]] = {}
        """Validations on the rollout not yet taken, by request step (:data:`VALIDATION` - the trainer's step): the
        trainer's step, each request's kind and ``n``, and how many answers make it whole."""
        self.validating: dict[int, list[RolloutResult]] = {}
        """``stream_samples``: the prompts of open validations answered so far, by request step."""

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
        prompts = with_prompt_seeds(next(t.train_loader), t.config.trainer.seed, step * MAX_DRAWS_PER_STEP)
        if self.streaming:
            prompts["sample_key"] = step * KEY_STRIDE + torch.arange(len(prompts))
            self.prompts.update({int(key): prompts.index(i) for i, key in enumerate(prompts["sample_key"])})
        return prompts

    def _kinds(self, requests: int) -> list[str]:
        return (["samples", "greedy"] if self.remax else ["samples"]) * requests

    def _submit(self, step: int, prompts) -> None:
        """The request for ``prompts`` of ``step`` (with the weights, when the rollout holds older ones) and,
        for ReMax, right after it the request of their greedy baseline, generated with the same weights."""
        weights = self._weights() if self._rollout_behind() else None
        if self.params is None:
            self.params = self.trainer.actor_rollout_ref.call("sampling_params")
        if self.stream is not None:
            self.stream.submit(RolloutRequest(step, prompts, self.params, weights), each_prompt=self.streaming)
            if self.remax:
                greedy = dataclasses.replace(self.params, n=1, do_sample=False, logprobs=False)
                self.stream.submit(RolloutRequest(step, prompts, greedy))

    def _rollout_behind(self) -> bool:
        """Whether the rollout holds no weights yet, or older ones than those published last."""
        return self.sent is None or self.sent < self.published

    def _weights(self):
        """The trainer's weights as a message for the rollout (None on the ranks without the stream), stamped with
        their version: P at a sync step. Only a rollout started by a resume between two syncs gets
        (and stamps) weights newer than P: the trainer no longer holds P's. Of a LoRA policy, unless
        ``model.lora.merge``: its adapters, with the base weights when the rollout holds none yet (a fresh or
        resumed rollout)."""
        lora = "merged" if self.merge_lora else "adapters+base" if self.sent is None else "adapters"
        state = self.trainer.actor_rollout_ref.call("rollout_weights", lora)  # a collective under FSDP: every rank
        self.sent = self.trained
        if self.stream is None:
            return None
        weights, cost = self.sender.pack(state, self.sent)
        self.sync_cost = (self.sync_cost[0] + cost.seconds, self.sync_cost[1] + cost.nbytes)
        return weights

    def publish(self, version: int) -> None:
        """The trainer reached ``version``: publish it every ``trigger_parameter_sync_step`` steps (with
        partial rollouts sent at once: the rollout takes it mid-generation) and submit what the bound
        now allows."""
        self.trained = version
        if version % self.sync_every == 0:
            self.published = version
            # not while a validation is out: it is the trainer's weights at its step, every token of it (these
            # go with the next request instead, which the rollout holds until the validation's rows are done)
            if self.partial and self.sent is not None and not self.validations:
                weights = self._weights()
                if self.stream is not None:
                    self.stream.send_weights(weights)
        self.fill()

    def take(self, step: int) -> tuple[RolloutResult, int, int]:
        """The answer for ``step`` (waiting for it), how many later steps' answers were already done, and
        how many requests are still open (on every rank: rank 0's, broadcast)."""
        if self.stream is None:
            self.parts.pop(step, None)
            return self._follow_streamed() if self.streaming else broadcast_object(None)
        if self.streaming:
            self.parts.pop(step, None)
            taken = self._take_streamed(step)
            if self.trainer.distributed:
                broadcast_object(("taken", taken))
            return taken
        self._collect(block_for=None)
        while len(self.done.get(step, ())) < len(self.parts[step]):
            self._collect(block_for=step)
        kinds, answers = self.parts.pop(step), self.done.pop(step)
        result = joined(step, [a for a, kind in zip(answers, kinds) if kind == "samples"])
        greedy = [a.batch for a, kind in zip(answers, kinds) if kind == "greedy"]
        if greedy:
            result = dataclasses.replace(result, baseline=Batch.concat(greedy))
        taken = (result, sum(1 for key in self.done if key >= 0), self._training_requests_open())
        return broadcast_object(taken) if self.trainer.distributed else taken

    def _take_streamed(self, step: int) -> tuple[RolloutResult, int, int]:
        """``stream_samples``: the step's batch from the first ``data.train_batch_size`` prompts done (waiting for
        them); prompts too old to train on now are dropped and sent again, with the weights published last."""
        need, trained_at = self.trainer.config.data.train_batch_size, step - 1
        while True:
            self._collect_any(block=False)
            taken, stale, self.pool = choose(self.pool, need, trained_at, self.bound)
            if stale:
                self._send_again(step, [answer.key for answer in stale])
            if taken is not None:
                break
            if not self.stream.submitted:
                raise RuntimeError(f"step {step} needs {need} prompts and {len(self.pool)} are generated, none being "
                                   f"generated")
            self._collect_any(block=True)
        for answer in taken:
            del self.prompts[answer.key]
        batch = concat_rollouts([a.batch for a in taken], self.trainer.sampler.pad_token_id)
        result = RolloutResult(step, batch, min(a.version for a in taken),
                               gen_seconds=sum(a.gen_seconds for a in taken),
                               idle_seconds=sum(a.idle_seconds for a in taken),
                               load_seconds=sum(a.load_seconds for a in taken),
                               score_seconds=sum(a.score_seconds for a in taken))
        return result, len(self.pool), self._training_requests_open()

    def _training_requests_open(self) -> int:
        """Requests (or prompts, streamed) sent and not yet answered, a validation's left out."""
        return sum(1 for step in self.stream.submitted if step >= 0)

    def _send_again(self, step: int, keys: list[int]) -> None:
        """Prompts dropped as too old, sent again (one request per step they came from: their prompts share its
        padding) with the weights published last. Under torchrun every rank takes part in gathering those
        weights: rank 0 says so first (:meth:`_follow_streamed`)."""
        self.dropped += len(keys)
        if self.trainer.distributed:
            broadcast_object(("send again", None))
        for origin in sorted({key // KEY_STRIDE for key in keys}):
            rows = [self.prompts[key] for key in sorted(keys) if key // KEY_STRIDE == origin]
            self._submit(step, Batch.concat(rows))

    def _follow_streamed(self) -> tuple[RolloutResult, int, int]:
        """The other ranks of a torchrun job, while rank 0 takes a step's prompts: they gather the weights with it
        when it sends prompts again to a rollout that holds older ones, and then receive the step's batch."""
        while True:
            kind, value = broadcast_object(None)
            if kind == "taken":
                return value
            if self._rollout_behind():
                self._weights()  # the collective rank 0's _submit enters

    def _collect_any(self, block: bool) -> None:
        """Answers that arrived into the pool, a validation's aside (``block``: wait for one)."""
        while self.stream.submitted:
            if not block and not self.stream.any_ready():
                return
            answer = self.stream.any_result()
            if answer.step < 0:
                self.validating.setdefault(answer.step, []).append(answer)
            else:
                self.pool.append(answer)
            if block:
                return

    # ------------------------------------------------------------------ validation
    def submit_validation(self, step: int, requests: list) -> None:
        """Validation on the rollout (``async_training.use_trainer_do_validate=false``) of the trainer at
        ``step``: ``requests`` (:func:`~verl.trainer.ppo.validation.validation_requests`) go to the rollout with
        the trainer's current weights, after the requests already queued ahead; the answers are taken as they
        come (:meth:`finished_validations`). A validation falls on a sync step (the config checks
        ``trainer.test_freq``), after the last step, or at a resume (``val_before_train``) between two syncs: then
        the rollout takes the trainer's weights for it, and the requests still wait for the next sync, as they would
        have without the interruption."""
        weights = self._weights() if self.sent != self.trained else None  # a collective: every rank
        vid = VALIDATION - step
        self.validations[vid] = (step, [(kind, params.n) for kind, params, _ in requests],
                                 sum(len(prompts) for _, _, prompts in requests) if self.streaming else len(requests))
        if self.stream is not None:
            for number, (_, params, prompts) in enumerate(requests):
                if self.streaming:  # each prompt answered on its own: its key puts it back in order
                    prompts = prompts.index(slice(None))  # a copy: the validation batches serve every validation
                    prompts["sample_key"] = number * KEY_STRIDE + torch.arange(len(prompts))
                self.stream.submit(RolloutRequest(vid, prompts, params, weights if number == 0 else None),
                                   each_prompt=self.streaming)
        self.fill()  # the publish above may let more requests out

    def finished_validations(self, wait: bool) -> list[tuple[int, list, float]]:
        """``[(step, [(kind, n, batch), ...], gen_seconds)]``: the validations whose answers are all in
        (``wait``: every open one, waiting for them), in step order, each batch in its request's order, with
        the seconds the rollout spent generating them (summed over its processes); on every rank (rank 0's,
        broadcast)."""
        finished = []
        if self.stream is not None:
            self._collect_any(block=False) if self.streaming else self._collect(block_for=None)
            for vid in sorted(self.validations, reverse=True):  # the oldest step first
                step, kinds, expected = self.validations[vid]
                while len(self._answers_of(vid)) < expected and wait:
                    self._collect_any(block=True) if self.streaming else self._collect(block_for=vid)
                if len(self._answers_of(vid)) < expected:
                    break  # answers come in order: the later ones are not in either
                del self.validations[vid]
                gen_seconds = sum(answer.gen_seconds for answer in self._answers_of(vid))
                finished.append((step, [(kind, n, batch) for (kind, n), batch in zip(kinds, self._batches_of(vid))],
                                 gen_seconds))
        if self.trainer.distributed:
            finished = broadcast_object(finished if self.stream is not None else None)
            for step, _, _ in finished:
                self.validations.pop(VALIDATION - step, None)
        return finished

    def _answers_of(self, vid: int) -> list[RolloutResult]:
        return (self.validating if self.streaming else self.done).get(vid, [])

    def _batches_of(self, vid: int) -> list[Batch]:
        """The answered batches of validation ``vid``, one per request (taken out of what was collected)."""
        if not self.streaming:
            return [answer.batch for answer in self.done.pop(vid)]
        answers = sorted(self.validating.pop(vid), key=lambda answer: answer.key)
        batches = []
        for number in range(answers[-1].key // KEY_STRIDE + 1):
            batch = concat_rollouts([a.batch for a in answers if a.key // KEY_STRIDE == number],
                                    self.trainer.sampler.pad_token_id)
            batch.pop("sample_key")
            batches.append(batch)
        return batches

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
            if self.streaming:
                self._collect_any(block=True)
                continue
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
                "async/weight_sync_s": pack_seconds + result.load_seconds, "async/weight_sync_bytes": pack_bytes,
                **self._dropped()}

    def _dropped(self) -> dict[str, float]:
        if not self.streaming:
            return {}
        dropped, self.dropped = self.dropped, 0
        return {"async/dropped": dropped}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        self.drain()
        return {"published": self.published, "next_request": self.next_request,
                "done": {step: [(r.batch, r.version) for r in parts] for step, parts in self.done.items()},
                "tails": dict(self.tails), "parts": dict(self.parts),
                "pool": [(r.batch, r.version, r.key) for r in self.pool], "prompts": dict(self.prompts)}

    def load_state_dict(self, state: dict) -> None:
        self.published, self.next_request = state["published"], state["next_request"]
        self.trained = self.trainer.global_step  # the checkpoint's weights: P's, unless it was taken between syncs
        # A checkpoint of an earlier release holds one (batch, version) per step, each step whole.
        done = {step: value if isinstance(value, list) else [value] for step, value in state["done"].items()}
        self.done = {step: [RolloutResult(step, batch, version) for batch, version in parts]
                     for step, parts in done.items()}
        self.tails = dict(state.get("tails", {}))
        self.pool = [RolloutResult(0, batch, version, key=key) for batch, version, key in state.get("pool", [])]
        self.prompts = dict(state.get("prompts", {}))
        if (self.pool or self.prompts) and not self.streaming:
            raise ConfigError("the checkpoint holds prompts generated ahead one by one (a run with "
                              "async_training.stream_samples=true): resume with stream_samples=true")
        if self.streaming and any(parts for parts in self.done.values()):
            raise ConfigError("the checkpoint holds whole steps generated ahead (a run with "
                              "async_training.stream_samples=false): resume with stream_samples=false")
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
