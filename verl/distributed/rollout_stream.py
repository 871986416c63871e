"""A rollout that runs apart from the trainer: requests in, version-stamped batches out, in order.

The controller (``verl.trainer.ppo.async_trainer``) decides what to generate and when; this module
only carries it. A :class:`RolloutRequest` names the step it is for, the prompts (with their
sampling seeds), the sampling parameters and, when the rollout must change weights first, a
:class:`~verl.distributed.weight_sync.WeightMessage`. The server (:func:`serve`) takes requests in
order, loads the weights a request carries, generates, and answers with a :class:`RolloutResult`
that says which policy version generated the batch and how the server spent its time.

Two placements, one protocol (``async_training.rollout_placement``):

* :class:`ProcessRolloutStream`: a spawned process with its own torch threads; generation and
  training overlap. It exits on its own within a second when the trainer's process is gone.
* :class:`ThreadRolloutStream`: a thread of this process (breakpoints work; overlap only where
  torch releases the GIL).

Nothing waits forever: :meth:`RolloutStream.result` gives up after ``timeout_s`` without an answer,
and at once when the process died, with one line naming the step, the process and what to do.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass

import torch

from verl.distributed.weight_sync import BroadcastChannel, WeightMessage, unpack
from verl.errors import VerlError
from verl.protocol import Batch

POLL_S = 0.5
START_S = 300.0


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
            self._stash(item.weights)

    def _stash(self, message: WeightMessage) -> None:
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
                self._stash(item.weights)
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
        channel = BroadcastChannel.join(spec.broadcast) if spec.broadcast else None
        worker = spec.build()
    except BaseException:  # noqa: BLE001 - reported to the trainer, which raises it with context
        results.put(RolloutResult(0, None, -1, error=traceback.format_exc()))
        return
    inbox = _Inbox(requests, worker, channel) if spec.partial else None
    results.put("ready")
    last = time.perf_counter()
    while True:
        request = inbox.next() if inbox is not None else requests.get()
        if request is None:
            return
        start = time.perf_counter()
        idle, load = start - last, 0.0
        try:
            if request.weights is not None:
                worker.load_weights(unpack(request.weights, channel), request.weights.version)
                load = time.perf_counter() - start
            if inbox is not None:
                inbox.load_seconds = 0.0
            batch = worker.generate_sequences(request.prompts, request.params, swap=inbox)
            if inbox is not None:
                load += inbox.load_seconds
        except BaseException:  # noqa: BLE001
            results.put(RolloutResult(request.step, None, -1, error=traceback.format_exc()))
            return
        version = int(batch["policy_version_first"].min()) if len(batch) else -1 if worker.version is None \
            else worker.version
        step = request.step
        del request  # the weights it carried: mapped memory released before the next wait
        last = time.perf_counter()
        results.put(RolloutResult(step, batch, version, gen_seconds=last - start - load, idle_seconds=idle,
                                  load_seconds=load))


def _exit_with_parent(parent_pid: int) -> None:
    """In the rollout process: end it when the trainer's process is gone (a killed trainer leaves no
    orphan generating for nobody)."""
    while True:
        time.sleep(POLL_S)
        if os.getppid() != parent_pid:
            os._exit(3)


def _process_main(spec: WorkerSpec, requests, results, parent_pid: int) -> None:
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    if spec.threads:
        torch.set_num_threads(spec.threads)
    serve(spec, requests, results)


class RolloutStream:
    """The trainer's end of a rollout server: :meth:`submit` requests, take each :meth:`result` in order."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.submitted: list[int] = []
        """Steps submitted and not yet answered, in order."""
        self._early = None
        """An answer :meth:`answer_ready` took from the queue, not yet returned by :meth:`result`."""

    # ------------------------------------------------------------------ what a placement provides
    def _put(self, request) -> None:
        raise NotImplementedError

    def _get(self, timeout: float):
        """The next answer, or raise queue.Empty after ``timeout`` seconds."""
        raise NotImplementedError

    def _gone(self) -> str | None:
        """Why the server can no longer answer (it died), or None while it lives."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ the protocol
    def start(self) -> None:
        """Wait until the server has built its worker (loading the model), or say why it could not: for
        ``timeout_s`` or 5 minutes, whichever is longer (a large model loads for minutes, a short
        timeout is for the steps); a process that dies while starting is said at once."""
        answer = self._wait("starting (loading the model)", max(self.timeout_s, START_S))
        if answer != "ready":
            self._raise_failed(answer, "starting")

    def submit(self, request: RolloutRequest) -> None:
        self._put(request)
        self.submitted.append(request.step)

    def send_weights(self, weights: WeightMessage) -> None:
        """Weights on their own (partial rollouts): taken mid-generation, between two decode steps."""
        self._put(WeightUpdate(weights))

    def result(self) -> RolloutResult:
        """The answer to the oldest request still open."""
        if not self.submitted:
            raise RuntimeError("no rollout request is open")
        step = self.submitted[0]
        answer = self._wait(f"generating step {step}")
        if not isinstance(answer, RolloutResult) or answer.error is not None or answer.step != step:
            self._raise_failed(answer, f"generating step {step}")
        self.submitted.pop(0)
        return answer

    def answer_ready(self) -> bool:
        """Whether the answer to the oldest open request has arrived (never waits)."""
        if self._early is None:
            try:
                self._early = self._receive(0.0, f"generating step {self.submitted[0]}" if self.submitted else "idle")
            except queue.Empty:
                return False
        return True

    def _receive(self, timeout: float, doing: str):
        """The next answer (queue.Empty after ``timeout``). An answer whose tensors cannot be read any
        more (a process that died just after sending it: its shared memory went with it) is said as
        the server's end."""
        try:
            return self._get(timeout)
        except queue.Empty:
            raise
        except (OSError, EOFError) as e:
            gone = None
            for _ in range(20):  # a killed process closes its sockets a moment before it can be reaped
                gone = self._gone()
                if gone is not None:
                    break
                time.sleep(0.05)
            gone = gone or "failed"
            raise VerlError(f"the rollout {self.describe()} {gone} while {doing} (its last answer could not be read: "
                            f"{type(e).__name__}: {e}); the checkpoints in trainer.default_local_dir are intact: run "
                            f"the same command again to resume") from None

    def _wait(self, doing: str, timeout_s: float | None = None):
        if self._early is not None:
            answer, self._early = self._early, None
            return answer
        timeout_s = timeout_s or self.timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._receive(min(POLL_S, max(deadline - time.monotonic(), 0.01)), doing)
            except queue.Empty:
                pass
            gone = self._gone()
            if gone is not None:
                try:  # an answer it sent just before it ended (its error) says more than its end
                    return self._receive(POLL_S, doing)
                except queue.Empty:
                    pass
                raise VerlError(f"the rollout {self.describe()} {gone} while {doing}; the checkpoints in "
                                f"trainer.default_local_dir are intact: run the same command again to resume")
            if time.monotonic() >= deadline:
                raise VerlError(f"the rollout {self.describe()} sent nothing for {timeout_s:.0f} s "
                                f"(trainer.dist_timeout_s) while {doing}: it hangs, or a batch takes longer than "
                                f"that (raise trainer.dist_timeout_s); the checkpoints in trainer.default_local_dir "
                                f"are intact")

    def _raise_failed(self, answer, doing: str):
        if isinstance(answer, RolloutResult) and answer.error is not None:
            last = answer.error.strip().splitlines()[-1]
            raise VerlError(f"the rollout {self.describe()} failed while {doing}: {last}\n"
                            f"(its traceback follows)\n{answer.error}")
        raise RuntimeError(f"the rollout {self.describe()} answered {answer!r} while {doing}")


@dataclass
class _Unreadable:
    """What the answer reader passes on when an answer cannot be read (the process is gone)."""

    error: BaseException


class ProcessRolloutStream(RolloutStream):
    def __init__(self, spec: WorkerSpec, timeout_s: float, channel: BroadcastChannel | None = None):
        super().__init__(timeout_s)
        self.channel = channel
        """The trainer's end of the weight broadcast (broadcast backend), joined once the process has."""
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.requests, self.results = ctx.Queue(), ctx.Queue()
        self.process = ctx.Process(target=_process_main, args=(spec, self.requests, self.results, os.getpid()),
                                   name="verl-rollout", daemon=True)
        self.process.start()
        # Answers are read by a thread of their own: reading one that a stopped or killed process left
        # half-written blocks (or fails) there, while the trainer's wait stays bounded by its deadline.
        self.inbox: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_answers, name="verl-rollout-reader", daemon=True).start()
        if channel is not None:
            channel.connect(self._gone)

    def _read_answers(self) -> None:
        while True:
            try:
                answer = self.results.get()
            except (OSError, EOFError, ValueError) as e:  # ValueError: the queue was closed
                self.inbox.put(_Unreadable(e))
                return
            self.inbox.put(answer)

    def _put(self, request) -> None:
        self.requests.put(request)

    def _get(self, timeout: float):
        answer = self.inbox.get(timeout=timeout)
        if isinstance(answer, _Unreadable):
            self.inbox.put(answer)  # every later read fails alike
            raise answer.error
        return answer

    def _gone(self) -> str | None:
        if self.process.is_alive():
            return None
        code = self.process.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return f"died ({how})"

    def describe(self) -> str:
        return f"process (pid {self.process.pid})"

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.process.is_alive():
            try:
                self.requests.put(None)
            except (OSError, ValueError):
                pass
            self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        for q in (self.requests, self.results):
            q.cancel_join_thread()
            q.close()


class ThreadRolloutStream(RolloutStream):
    def __init__(self, spec: WorkerSpec, timeout_s: float):
        super().__init__(timeout_s)
        self.requests: queue.Queue = queue.Queue()
        self.results: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=serve, args=(spec, self.requests, self.results), name="verl-rollout",
                                       daemon=True)
        self.thread.start()

    def _put(self, request) -> None:
        self.requests.put(request)

    def _get(self, timeout: float):
        return self.results.get(timeout=timeout)

    def _gone(self) -> str | None:
        return None if self.thread.is_alive() else "stopped"

    def describe(self) -> str:
        return "thread"

    def close(self) -> None:
        if self.thread.is_alive():
            self.requests.put(None)
            self.thread.join(timeout=30)


def open_stream(placement: str, spec: WorkerSpec, timeout_s: float, broadcast: bool = False) -> RolloutStream:
    """A started stream of ``placement`` (``process`` or ``thread``); with ``broadcast`` (a process
    only) the weights travel by torch.distributed broadcast over a channel of its own."""
    if placement == "thread":
        stream = ThreadRolloutStream(spec, timeout_s)
    else:
        channel = BroadcastChannel.open(timeout_s) if broadcast else None
        if channel is not None:
            spec = dataclasses.replace(spec, broadcast=channel.address)
        stream = ProcessRolloutStream(spec, timeout_s, channel)
    try:
        stream.start()
    except BaseException:
        stream.close()
        raise
    return stream
