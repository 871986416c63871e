"""The rollout's side of an asynchronous run: the messages that cross between the trainer and a rollout
process or thread, and the server loop that answers them (:func:`serve`).

A :class:`RolloutRequest` names the step it is for, the prompts (with their sampling seeds), the
sampling parameters and, when the rollout must change weights first, a
:class:`~verl.distributed.weight_sync.WeightMessage`. The server takes requests in order, loads the
weights a request carries, generates, and answers with a :class:`RolloutResult` that says which
policy version generated the batch and how the server spent its time. The trainer's end is
:mod:`verl.distributed.rollout_stream`.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass

import torch

from verl.distributed.weight_sync import BroadcastChannel, WeightMessage, unpack
from verl.protocol import Batch

POLL_S = 0.5


@dataclass
class RolloutRequest:
    step: int
    prompts: Batch
    params: object  # verl.rollout.SamplingParams
    weights: WeightMessage | None = None


@dataclass
class WeightUpdate:
    """Weights sent on their own, the moment the trainer publishes them (partial rollouts): the
    rollout takes them between two decode steps of whatever it is generating."""

    weights: WeightMessage


@dataclass
class RolloutResult:
    step: int
    batch: Batch | None
    version: int
    """The oldest policy version that generated a row (-1: the model folder's, before any sync)."""
    gen_seconds: float = 0.0
    idle_seconds: float = 0.0
    """How long the server waited for this request after answering the previous one."""
    load_seconds: float = 0.0
    """Loading the weights the request carried."""
    error: str | None = None
    idle_frac: float | None = None
    """A pool's: the mean over its processes of the share of their time spent waiting (None: one
    process's, ``idle / (idle + gen + load)``)."""
    baseline: Batch | None = None
    """ReMax: the greedy responses to the same prompts (the trainer joins them on, from a request of their own)."""
    score_seconds: float = 0.0
    """Scoring the batch's rewards, where the rollout scores them (:attr:`WorkerSpec.scorer`)."""
    key: int = -1
    """A prompt's answer (:attr:`WorkerSpec.groups`): its ``sample_key``, the order of the prompts of a step."""


@dataclass
class WorkerSpec:
    """What builds the server's :class:`~verl.workers.rollout_worker.RolloutWorker` (picklable: it
    crosses to a spawned process)."""

    config: object  # the actor_rollout_ref section
    device: str | None
    max_response_length: int
    seed: int
    threads: int | None = None
    partial: bool = False
    """Partial rollouts: weights that arrive mid-generation are taken at once (:class:`_Inbox`)."""
    broadcast: tuple | None = None
    """The trainer's :class:`~verl.distributed.weight_sync.BroadcastChannel` address (broadcast backend)."""
    broadcast_rank: int = 1
    """This process's rank in that channel (1 .. the pool's size)."""
    continuous: bool = True
    """Rows of successive requests share the engine's decode batch where it takes them
    (:mod:`verl.distributed.rollout_rows`, ``async_training.continuous_batching``)."""
    groups: bool = False
    """Each prompt's samples are answered on their own, as soon as they are all generated (their ``sample_key``
    in :attr:`RolloutResult.key`; ``async_training.stream_samples``); else a request at a time, whole."""
    scorer: object | None = None
    """Where the rollout scores the rewards of what it generates: ``scorer(tokenizer)`` is the reward stage,
    ``score(batch) -> columns`` (picklable; built in the server's process). None: the trainer scores."""

    def build(self):
        from verl.workers.rollout_worker import RolloutWorker

        return RolloutWorker(self.config, device=self.device, max_response_length=self.max_response_length,
                             seed=self.seed)


class _Inbox:
    """The request queue as a partial rollout reads it (a :class:`verl.rollout.partial.WeightSwap`):
    between decode steps it takes what has arrived without waiting; weights wait to be applied (the
    newest wins), requests wait their turn, in order."""

    def __init__(self, requests, worker, channel: BroadcastChannel | None):
        self.requests, self.worker, self.channel = requests, worker, channel
        self.backlog: deque = deque()
        self.weights: WeightMessage | None = None
        self.load_seconds = 0.0

    @property
    def version(self) -> int:
        return -1 if self.worker.version is None else self.worker.version

    def next(self):
        """The next request (or None: stop), waiting for it; weights before it wait to be applied."""
        while True:
            item = self.backlog.popleft() if self.backlog else self.requests.get()
            if not isinstance(item, WeightUpdate):
                return item
            self.stash(item.weights)

    def stash(self, message: WeightMessage) -> None:
        """``message`` is the newest weights; an older one waiting is dropped (a broadcast one received
        first: every broadcast is received, in order)."""
        if self.weights is not None and self.weights.backend == "broadcast":
            unpack(self.weights, self.channel)
        self.weights = message

    def pending(self) -> bool:
        while True:
            try:
                item = self.requests.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, WeightUpdate):
                self.stash(item.weights)
            else:
                self.backlog.append(item)
        return self.weights is not None

    def apply(self) -> None:
        start = time.perf_counter()
        message, self.weights = self.weights, None
        self.worker.load_weights(unpack(message, self.channel), message.version)
        self.load_seconds += time.perf_counter() - start


def serve(spec: WorkerSpec, requests, results) -> None:
    """The server loop: build the worker, say ``ready``, then answer requests until ``None`` arrives."""
    try:
        channel = BroadcastChannel.join(spec.broadcast, spec.broadcast_rank) if spec.broadcast else None
        worker = spec.build()
        score = spec.scorer(worker.tokenizer) if spec.scorer is not None else None
    except BaseException:  # noqa: BLE001 - reported to the trainer, which raises it with context
        results.put(RolloutResult(0, None, -1, error=traceback.format_exc()))
        return
    if spec.continuous and worker.takes_rows():
        from verl.distributed.rollout_rows import RowServer

        results.put("ready")
        RowServer(worker, _Inbox(requests, worker, channel), results, score, spec.partial, channel,
                  groups=spec.groups).run()
        return
    # Weights also come on their own: with partial rollouts, and to a pool's process that had no prompts of the
    # request that brought them (taken before its next request).
    inbox = _Inbox(requests, worker, channel)
    results.put("ready")
    last = time.perf_counter()
    while True:
        request = inbox.next()
        if request is None:
            return
        start = time.perf_counter()
        idle = start - last
        try:
            inbox.load_seconds = 0.0
            if inbox.weights is not None and not spec.partial:  # (partial: taken as the request starts)
                inbox.apply()
            if request.weights is not None:
                inbox.stash(request.weights)
                inbox.apply()
            batch = worker.generate_sequences(request.prompts, request.params, swap=inbox if spec.partial else None)
            load = inbox.load_seconds
            scoring = 0.0
            if score is not None:
                scored = time.perf_counter()
                batch = batch.union(score(batch))
                scoring = time.perf_counter() - scored
        except BaseException:  # noqa: BLE001
            results.put(RolloutResult(request.step, None, -1, error=traceback.format_exc()))
            return
        step, n = request.step, request.params.n
        del request  # the weights it carried: mapped memory released before the next wait
        last = time.perf_counter()
        timing = dict(gen_seconds=last - start - load - scoring, idle_seconds=idle, load_seconds=load,
                      score_seconds=scoring)
        for part in prompt_groups(batch, n) if spec.groups else [batch]:
            results.put(answer(step, part, worker, **timing))
            timing = {}  # a request's time goes with its first prompt's answer


def prompt_groups(batch: Batch, n: int) -> list[Batch]:
    """A rollout batch (prompts x n, a prompt's samples adjacent) as one batch per prompt."""
    return [batch.index(slice(at, at + n)) for at in range(0, len(batch), n)]


def answer(step: int, batch: Batch, worker, **timing) -> RolloutResult:
    """The answer of ``batch``: its oldest version (the worker's, for no rows) and, for one prompt's samples
    (:attr:`WorkerSpec.groups`), its ``sample_key``."""
    version = int(batch["policy_version_first"].min()) if len(batch) else -1 if worker.version is None \
        else worker.version
    key = int(batch["sample_key"][0]) if len(batch) and "sample_key" in batch else -1
    return RolloutResult(step, batch, version, key=key, **timing)


def _exit_with_parent(parent_pid: int) -> None:
    """In the rollout process: end it when the trainer's process is gone (a killed trainer leaves no
    orphan generating for nobody). The trainer is the parent, or, where multiprocessing starts its
    processes through a wrapper (``multiprocessing.set_executable``), the one that holds the other end
    of multiprocessing's parent pipe: its end closes when the trainer dies, whoever the parent is."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    direct = os.getppid() == parent_pid
    while True:
        time.sleep(POLL_S)
        if (direct and os.getppid() != parent_pid) or (parent is not None and not parent.is_alive()):
            os._exit(3)


def ignore_stop_signals(*signals) -> None:
    """In a rollout process or rank: the trainer owns Ctrl-C (and torchrun's SIGTERM). A terminal's Ctrl-C
    reaches the whole process group; the trainer then stops after its step and still needs the rollout's
    answers to the requests open (they go into the checkpoint), and closes the rollout when done."""
    for sig in signals:
        signal.signal(sig, signal.SIG_IGN)


def _process_main(spec: WorkerSpec, requests, results, parent_pid: int) -> None:
    ignore_stop_signals(signal.SIGINT)  # it ends with its trainer (below), or when the trainer closes it
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    if spec.threads:
        torch.set_num_threads(spec.threads)
    serve(spec, requests, results)
