"""A rollout that runs apart from the trainer: requests in, version-stamped batches out, in order.

The controller (``verl.trainer.ppo.async_trainer``) decides what to generate and when; this module
only carries it. A :class:`RolloutRequest` names the step it is for, the prompts (with their
sampling seeds), the sampling parameters and, when the rollout must change weights first, a
:class:`~verl.distributed.weight_sync.WeightMessage`. The server
(:func:`verl.distributed.rollout_server.serve`) takes requests in order, loads the weights a request
carries, generates, and answers with a :class:`RolloutResult` that says which policy version
generated the batch and how the server spent its time.

Two placements, one protocol (``async_training.rollout_placement``):

* :class:`ProcessRolloutStream`: a spawned process with its own torch threads; generation and
  training overlap. It exits on its own within a second when the trainer's process is gone.
* :class:`ThreadRolloutStream`: a thread of this process (breakpoints work; overlap only where
  torch releases the GIL).

and :class:`RolloutPool`, several processes behind the same protocol (``rollout.n_gpus_per_node``):
each request's prompts are cut into consecutive slices, one per process, and the answers joined.

Nothing waits forever: :meth:`RolloutStream.result` gives up after ``timeout_s`` without an answer,
and at once when the process died, with one line naming the step, the process and what to do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass

from verl.distributed.rollout_server import (POLL_S, RolloutRequest, RolloutResult, WeightUpdate, WorkerSpec,
                                             _process_main, serve)
from verl.distributed.weight_sync import BroadcastChannel, WeightMessage
from verl.errors import VerlError
from verl.protocol import Batch

__all__ = ["RolloutRequest", "RolloutResult", "WorkerSpec", "RolloutStream", "ProcessRolloutStream",
           "ThreadRolloutStream", "RolloutPool", "open_stream", "started"]

START_S = 300.0


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

    def submit(self, request: RolloutRequest, each_prompt: bool = False) -> None:
        """``each_prompt``: the server answers each of the request's prompts on its own (:attr:`WorkerSpec.groups`),
        else the request once, whole."""
        self._put(request)
        self.submitted.extend([request.step] * (len(request.prompts) if each_prompt else 1))

    def send_weights(self, weights: WeightMessage) -> None:
        """Weights on their own (partial rollouts): taken mid-generation, between two decode steps."""
        self._put(WeightUpdate(weights))

    def result(self) -> RolloutResult:
        """The answer to the oldest request still open."""
        if not self.submitted:
            raise RuntimeError("no rollout request is open")
        step = self.submitted[0]
        answer = self._wait(generating(step))
        if not isinstance(answer, RolloutResult) or answer.error is not None or answer.step != step:
            self._raise_failed(answer, generating(step))
        self.submitted.pop(0)
        return answer

    def any_result(self) -> RolloutResult:
        """The next answer to arrive, to whichever open request (prompts answered on their own come as they are
        done, in any order)."""
        if not self.submitted:
            raise RuntimeError("no rollout request is open")
        doing = generating(self.submitted[0]) + (f" to {max(self.submitted)}" if max(self.submitted) >
                                                 self.submitted[0] > 0 else "")
        answer = self._wait(doing)
        if not isinstance(answer, RolloutResult) or answer.error is not None or answer.step not in self.submitted:
            self._raise_failed(answer, doing)
        self.submitted.remove(answer.step)
        return answer

    def any_ready(self) -> bool:
        """Whether an answer has arrived, to any open request (never waits)."""
        return self.answer_ready()

    def answer_ready(self) -> bool:
        """Whether the answer to the oldest open request has arrived (never waits)."""
        if self._early is None:
            try:
                self._early = self._receive(0.0, generating(self.submitted[0]) if self.submitted else "idle")
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
                raise VerlError(ended(f"{self.describe()} {gone}", doing))
            if time.monotonic() >= deadline:
                raise VerlError(hangs(self.describe(), timeout_s, doing))

    def _raise_failed(self, answer, doing: str):
        if isinstance(answer, RolloutResult) and answer.error is not None:
            last = answer.error.strip().splitlines()[-1]
            raise VerlError(f"the rollout {self.describe()} failed while {doing}: {last}\n"
                            f"(its traceback follows)\n{answer.error}")
        raise RuntimeError(f"the rollout {self.describe()} answered {answer!r} while {doing}")


def generating(step: int) -> str:
    """What the rollout is doing for a request of ``step`` (negative: a validation's), as messages say it."""
    return f"generating step {step}" if step >= 0 else "validating"


def ended(rollout: str, doing: str) -> str:
    """The line of a rollout that can no longer answer (``rollout``: which, and how it ended)."""
    return (f"the rollout {rollout} while {doing}; the checkpoints in trainer.default_local_dir are intact: run the "
            f"same command again to resume")


def hangs(rollout: str, timeout_s: float, doing: str) -> str:
    """The line of a rollout that sent nothing for ``timeout_s``."""
    return (f"the rollout {rollout} sent nothing for {timeout_s:.0f} s (trainer.dist_timeout_s) while {doing}: it "
            f"hangs, or a batch takes longer than that (raise trainer.dist_timeout_s); the checkpoints in "
            f"trainer.default_local_dir are intact")


@dataclass
class _Unreadable:
    """What the answer reader passes on when an answer cannot be read (the server is gone)."""

    error: BaseException


class AnswerReader:
    """A server's answers, read by a thread of their own: reading one that a stopped or killed server left
    half-written blocks (or fails) there, while the trainer's wait stays bounded by its deadline.
    ``receive()`` returns the next answer; an error of ``ends`` from it means none can be read any more
    (:attr:`ended`), and every later :meth:`get` raises it."""

    def __init__(self, receive, ends: tuple[type[BaseException], ...], name: str):
        self.inbox: queue.Queue = queue.Queue()
        self.ended: BaseException | None = None
        threading.Thread(target=self._read, args=(receive, ends), name=name, daemon=True).start()

    def _read(self, receive, ends) -> None:
        while True:
            try:
                answer = receive()
            except ends as e:
                self.ended = e
                self.inbox.put(_Unreadable(e))
                return
            self.inbox.put(answer)

    def get(self, timeout: float):
        """The next answer, or queue.Empty after ``timeout`` seconds; the reading's end error once it ended."""
        answer = self.inbox.get(timeout=timeout)
        if isinstance(answer, _Unreadable):
            self.inbox.put(answer)  # every later read fails alike
            raise answer.error
        return answer


@contextlib.contextmanager
def _script_not_run_again():
    """Start a spawned process without running this process's script again in it. Spawn runs the main
    script of ``python script.py`` in every new process (as ``__mp_main__``), and a script that calls
    ``verl.trainer.main_ppo.main`` without an ``if __name__ == "__main__":`` guard would start a second
    training there, which fails (multiprocessing's "bootstrapping phase" error) after loading every
    model. The rollout process needs nothing from the script: spawn is not told of it while it starts.
    (``python -m`` modules, notebooks and guarded scripts are left as they are.)"""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(main, "__spec__", None) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


class ProcessRolloutStream(RolloutStream):
    def __init__(self, spec: WorkerSpec, timeout_s: float, channel: BroadcastChannel | None = None,
                 name: str = "process"):
        """``channel``: the broadcast backend's, connected here (a pool connects its own once every
        process has started); ``name``: how messages call it (a pool's say which of its processes)."""
        super().__init__(timeout_s)
        self.channel = channel
        self.name = name
        """The trainer's end of the weight broadcast (broadcast backend), joined once the process has."""
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.requests, self.results = ctx.Queue(), ctx.Queue()
        self.process = ctx.Process(target=_process_main, args=(spec, self.requests, self.results, os.getpid()),
                                   name="verl-rollout", daemon=True)
        with _script_not_run_again():
            self.process.start()
        # ValueError: the queue was closed
        self.reader = AnswerReader(self.results.get, (OSError, EOFError, ValueError), "verl-rollout-reader")
        if channel is not None:
            channel.connect(self._gone)

    def _put(self, request) -> None:
        self.requests.put(request)

    def _get(self, timeout: float):
        return self.reader.get(timeout)

    def _gone(self) -> str | None:
        if self.process.is_alive():
            return None
        code = self.process.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return f"died ({how})"

    def describe(self) -> str:
        return f"{self.name} (pid {self.process.pid})"

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


class RolloutPool(RolloutStream):
    """Several rollout processes behind one stream. A request's prompts are cut into consecutive slices,
    one per process (sizes differing by at most one), with the same weights; the answer is the slices'
    rows joined in prompt order, its version the oldest of theirs. Each prompt's samples depend only on
    its own seed, so the pool's batch is the one a single process would generate. Weights sent on their
    own (partial rollouts) go to every process. Any process that dies or hangs ends the run, named."""

    def __init__(self, members: list[RolloutStream], timeout_s: float, channel: BroadcastChannel | None = None):
        super().__init__(timeout_s)
        self.members = members
        self.routes: list[int] = []
        """How many processes each open whole request went to (in order; its answer joins theirs)."""
        self.channel = channel
        if channel is not None:
            channel.connect(self._gone)

    def start(self) -> None:
        for member in self.members:
            member.start()

    def submit(self, request: RolloutRequest, each_prompt: bool = False) -> None:
        """The request's prompts cut into consecutive slices, one per process (fewer prompts than processes: the
        first processes, one prompt each); ``each_prompt``: each process answers its prompts one by one."""
        members = self.members[:min(len(request.prompts), len(self.members))]
        for member, part in zip(members, request.prompts.chunk(len(members))):
            member.submit(dataclasses.replace(request, prompts=part), each_prompt)
        if request.weights is not None:  # the processes without prompts of it take its weights all the same
            for member in self.members[len(members):]:
                member.send_weights(request.weights)
        if not each_prompt:
            self.routes.append(len(members))
        self.submitted.extend([request.step] * (len(request.prompts) if each_prompt else 1))

    def any_result(self) -> RolloutResult:
        """The next answer any process sends (prompts answered on their own); a process that dies or hangs is
        said as :meth:`RolloutStream.result` says it."""
        if not self.submitted:
            raise RuntimeError("no rollout request is open")
        deadline = time.monotonic() + self.timeout_s
        while True:
            for member in self.members:
                if member.submitted and member.answer_ready():
                    answer = member.any_result()
                    self.submitted.remove(answer.step)
                    return answer
            doing = generating(self.submitted[0])
            gone = self._gone()
            if gone is not None:
                raise VerlError(ended(gone, doing))
            if time.monotonic() >= deadline:
                raise VerlError(hangs(self.describe(), self.timeout_s, doing))
            time.sleep(0.002)

    def any_ready(self) -> bool:
        return any(member.submitted and member.answer_ready() for member in self.members)

    def send_weights(self, weights: WeightMessage) -> None:
        for member in self.members:
            member.send_weights(weights)

    def result(self) -> RolloutResult:
        if not self.submitted:
            raise RuntimeError("no rollout request is open")
        members = self.members[:self.routes.pop(0)]
        parts = [member.result() for member in members]  # each bounded by its deadline, its death said
        step = self.submitted.pop(0)
        idle = [p.idle_seconds / max(p.idle_seconds + p.gen_seconds + p.load_seconds, 1e-9) for p in parts]
        return RolloutResult(step, Batch.concat([p.batch for p in parts]), min(p.version for p in parts),
                             gen_seconds=max(p.gen_seconds for p in parts),
                             idle_seconds=min(p.idle_seconds for p in parts),
                             load_seconds=max(p.load_seconds for p in parts), idle_frac=sum(idle) / len(idle),
                             score_seconds=max(p.score_seconds for p in parts))

    def answer_ready(self) -> bool:
        return bool(self.routes) and all(member.answer_ready() for member in self.members[:self.routes[0]])

    def _gone(self) -> str | None:
        for member in self.members:
            gone = member._gone()
            if gone is not None:
                return f"{member.describe()} {gone}"
        return None

    def describe(self) -> str:
        if all(isinstance(m, ProcessRolloutStream) for m in self.members):
            return f"pool of {len(self.members)} processes (pids {', '.join(str(m.process.pid) for m in self.members)})"
        return f"pool of {len(self.members)} ranks ({'; '.join(m.describe() for m in self.members)})"

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        for member in self.members:
            member.close()


def open_stream(placement: str, spec: WorkerSpec, timeout_s: float, broadcast: bool = False,
                processes: int = 1) -> RolloutStream:
    """A started stream of ``placement`` (``process`` or ``thread``); with ``broadcast`` (processes
    only) the weights travel by torch.distributed broadcast over a channel of its own; ``processes`` > 1:
    a :class:`RolloutPool` of that many."""
    if placement == "thread":
        stream = ThreadRolloutStream(spec, timeout_s)
    elif processes > 1:
        channel = BroadcastChannel.open(timeout_s, members=processes) if broadcast else None
        members = []
        try:
            for i in range(processes):
                member_spec = dataclasses.replace(spec, broadcast=channel.address if channel else None,
                                                  broadcast_rank=i + 1)
                members.append(ProcessRolloutStream(member_spec, timeout_s, name=f"process {i + 1} of {processes}"))
            stream = RolloutPool(members, timeout_s, channel)
        except BaseException:
            for member in members:
                member.close()
            raise
    else:
        channel = BroadcastChannel.open(timeout_s) if broadcast else None
        if channel is not None:
            spec = dataclasses.replace(spec, broadcast=channel.address)
        stream = ProcessRolloutStream(spec, timeout_s, channel)
    return started(stream)


def started(stream: RolloutStream) -> RolloutStream:
    """``stream`` once its server has built its worker (loaded the model); closed if it could not."""
    try:
        stream.start()
    except BaseException:
        stream.close()
        raise
    return stream
