"""End the whole job, with one line naming the rank and the stage, when a rank dies, stalls or fails.

Under torchrun every rank runs the same ``fit()``. When one rank is gone, the others wait in their
next collective (an all-gather of FSDP, an all-reduce of counts) until the process group's timeout
(10 to 30 minutes), or for ever. The watchdog turns that into one line within
``trainer.dist_timeout_s``::

    error: rank 1 stopped responding during stage 'update_actor' (step 3): no heartbeat for 30.4s (trainer.dist_timeout_s=30); the job is stopped

Usage, on every rank, in the main thread (``start`` initialises the process group if need be)::

    watchdog = Watchdog.start(cfg.trainer.dist_timeout_s)   # inert at world size 1
    with watchdog.stage("update_actor", step=global_step):
        ...
    watchdog.stop()

How it works, and what a heartbeat cannot see: docs/distributed.md ("How the watchdog works").
"""

from __future__ import annotations

import atexit
import itertools
import json
import math
import os
import select
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager, suppress
from datetime import timedelta

import torch.distributed as dist

from verl.distributed import processes
from verl.distributed.process_group import ensure_process_group, world_size
from verl.errors import VerlError

EXIT_CODE = 43
"""Exit code of a rank that the watchdog stopped because of another rank's failure."""

_FAILED_EXIT_GRACE_S = 5.0
"""How long a rank waits for a failed peer on its host to print its traceback and exit."""

_starts = itertools.count()  # a fresh key prefix for every watchdog this process starts
_running: set = set()  # this process's started watchdogs (a forked child disowns them)


class Watchdog:
    """Heartbeats of every rank in the job's store; see the module docstring.

    Build it with :meth:`start`. ``beats`` counts the heartbeats this rank wrote.
    """

    def __init__(self, timeout_s: float, interval_s: float, rank: int = 0, world_size: int = 1,
                 store: dist.Store | None = None):
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        self.rank = rank
        self.world_size = world_size
        self.beats = 0
        self._store = store
        self._stage: str | None = None
        self._step: int | None = None
        self._last: tuple[str, int | None] | None = None  # the last stage left, for reports between stages
        self._status = "running"
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one store operation at a time: the thread's and the main thread's
        self._exiting = threading.Lock()  # held by the one path that ends the process
        self._stopping = False
        self._failed = False  # this rank published its own failure
        self._handled: BaseException | None = None
        self._sigterm = False
        # Set by the run loop while it stops at the next step boundary on a first SIGTERM
        # (verl.trainer.stop): then only a SIGTERM that follows another rank's failure ends the rank here.
        self.graceful_sigterm = False
        self._node = processes.node_id()
        # Under torchrun: this rank's node (the launcher's rank) and its launcher, whose loss (a node's
        # torchrun killed) ends the job as a rank's would.
        self._node_rank, self._nodes = _env_int("GROUP_RANK"), _env_int("GROUP_WORLD_SIZE") or 1
        self._launcher = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None
        # What the thread learned about the peers: identity (host, pid), last heartbeat, when its
        # counter last changed (this process's monotonic clock), and the ranks that finished.
        self._ids: dict[int, dict] = {}
        self._heartbeats: dict[int, dict] = {}
        self._changed: dict[int, tuple[int, float]] = {}
        self._finished: set[int] = set()
        self._started = time.monotonic()

    # ------------------------------------------------------------------ the API
    @classmethod
    def start(cls, timeout_s: float, interval_s: float | None = None) -> Watchdog:
        """Start this rank's heartbeat (every rank calls it, in the main thread). Starts the process
        group if there is none yet; inert at world size 1."""
        if timeout_s <= 0:
            raise VerlError(f"trainer.dist_timeout_s must be positive, got {timeout_s}")
        interval = interval_s if interval_s is not None else min(1.0, timeout_s / 4)
        ensure_process_group()
        if world_size() == 1:
            return cls(timeout_s, interval)
        run = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        store = dist.PrefixStore(f"verl/watchdog/{run}/{next(_starts)}/", _open_store(timeout_s))
        watchdog = cls(timeout_s, interval, dist.get_rank(), dist.get_world_size(), store)
        watchdog._begin()
        return watchdog

    @classmethod
    def inert(cls) -> Watchdog:
        """A watchdog that only names stages (no heartbeat, no store): for code that drives a few
        calls itself rather than a run."""
        return cls(math.inf, 1.0)

    @contextmanager
    def stage(self, name: str, step: int | None = None):
        """Mark the code inside as stage ``name`` (of ``step``, kept from the last stage if None).

        An exception leaving it stops the job: the other ranks report this rank, stage and message."""
        outer_stage, outer_step = self._stage, self._step
        self._stage, self._step = name, self._step if step is None else step
        try:
            yield
        except Exception as error:
            if self._thread is not None and error is not self._handled:
                self._on_error(error)
            raise
        finally:
            self._last = name, self._step
            self._stage = outer_stage
            if outer_stage is not None:  # back in the enclosing stage; at the top level the step carries on
                self._step = outer_step

    def where(self) -> str:
        """Where this rank is, as the reports say it: "during stage 'reward' (step 2)"."""
        if self._stage is not None:
            return f"during stage '{self._stage}'" + ("" if self._step is None else f" (step {self._step})")
        if self._last is None:
            return "before its first stage"
        name, step = self._last
        return f"after stage '{name}'" + ("" if step is None else f" (step {step})") + ", between stages"

    def stop(self) -> None:
        """End this rank's heartbeat: the rank is done and its exit is no failure (every rank calls it,
        at the end of a run; after a failure it changes nothing)."""
        if self._thread is None:
            return
        self._stopping = True
        try:
            with self._lock:
                self._status = "failed" if self._failed else "done"
                self._publish()
        except RuntimeError:  # the store is gone: nothing left to tell the others
            pass
        self._wake()
        self._thread.join(timeout=self.timeout_s)
        self._thread = None
        self._restore_hooks()
        self._wake_r.close()
        self._wake_w.close()

    # ------------------------------------------------------------------ start and stop
    def _begin(self) -> None:
        with self._lock:
            self._publish()  # first: a rank whose identity is in the store has a heartbeat there too
            self._store.set(f"id/{self.rank}", json.dumps(
                self._identity()))
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._at_exit)
        # SIGTERM from torchrun: seen by the thread at once, through the wakeup fd. Only where no one
        # else handles SIGTERM or owns the wakeup fd (asyncio does).
        self._previous_sigterm = None
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            previous_fd = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
            if previous_fd == -1:
                self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm_signal)
            else:
                signal.set_wakeup_fd(previous_fd)
        self._thread = threading.Thread(target=self._run, name="verl-watchdog", daemon=True)
        self._thread.start()
        _running.add(self)

    def _identity(self) -> dict:
        return {"host": socket.gethostname(), "node": self._node, "pid": os.getpid(), "node_rank": self._node_rank,
                "start": processes.process_state(os.getpid())[1] if self._node else None}

    def _name(self, r: int) -> str:
        """"rank R", and on a job of several nodes "rank R (node N of M, host H)"."""
        peer = self._identity() if r == self.rank else self._ids.get(r)
        if self._nodes <= 1 or not peer or peer.get("node_rank") is None:
            return f"rank {r}"
        return f"rank {r} (node {peer['node_rank']} of {self._nodes}, host {peer['host']})"

    def _restore_hooks(self) -> None:
        _running.discard(self)
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_excepthook
        atexit.unregister(self._at_exit)
        if self._previous_sigterm is not None and signal.getsignal(signal.SIGTERM) == self._on_sigterm_signal:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            signal.set_wakeup_fd(-1)

    def _disown(self) -> None:
        """In a forked child (a data-loader worker): not a rank. Its store connection and wake-up socket
        are the parent's, so it must not touch them, nor take SIGTERM for the parent's."""
        self._thread = None
        self._stopping = True
        self._restore_hooks()

    def _at_exit(self) -> None:
        # The interpreter exits without stop(): the rank finished (a failure was published before).
        if not self._failed:
            self.stop()

    # ------------------------------------------------------------------ the heartbeat thread
    def _run(self) -> None:
        last_tick = time.monotonic()
        while True:
            ready, _, _ = select.select([self._wake_r], [], [], self.interval_s)
            if ready and signal.SIGTERM in self._wake_r.recv(4096):
                self._sigterm = True
            if self._stopping:
                return
            try:
                if self._sigterm:
                    self._on_sigterm()
                now = time.monotonic()
                if now - last_tick > self.timeout_s / 2:  # this thread did not run: peers' ages mean nothing
                    self._changed = {r: (seq, now) for r, (seq, _) in self._changed.items()}
                    self._started = now
                verdict = self._tick(now)
                last_tick = time.monotonic()
                if verdict is not None:
                    verdict = self._declare(verdict)
                    # a culprit that detected itself (its launcher is gone) prints when no rank 0 will
                    self._stop_job(verdict, print_line=verdict["rank"] == verdict["detector"] == self.rank == 0)
            except RuntimeError as error:  # c10d store errors are RuntimeErrors
                if self._stopping or self._failed or (self.rank != 0 and 0 in self._finished):
                    return  # rank 0 finished and took the store down with it (no torchrun agent store)
                self._stop_job({"rank": self.rank, "detector": self.rank, "kind": "store",
                                "message": f"{self._name(self.rank)} lost the job's store: {_first_line(error)}"},
                               print_line=True)

    def _tick(self, now: float) -> dict | None:
        """Publish this rank's heartbeat, read the others'; a verdict when a rank is dead or stalled."""
        with self._lock:
            self._publish()
            abort = self._read_abort()
            if abort is not None:
                return abort
            if self._launcher is not None and os.getppid() != self._launcher:
                return {"rank": self.rank, "detector": self.rank, "kind": "orphaned",
                        "message": f"{self._name(self.rank)} lost its launcher {self.where()}: the torchrun of node "
                                   f"{self._node_rank} (pid {self._launcher} on {socket.gethostname()}) is gone "
                                   f"(killed, or its machine left the job)"}
            peers = [r for r in range(self.world_size) if r != self.rank]
            if not self._load_ids():
                return self._missing(now, peers)
            watched = [r for r in (peers if self.rank == 0 else [0]) if r not in self._finished]
            for r, value in zip(watched, self._store.multi_get([f"hb/{r}" for r in watched])):
                beat = json.loads(value)
                self._heartbeats[r] = beat
                if beat["status"] == "done":
                    self._finished.add(r)
                elif r not in self._changed or self._changed[r][0] != beat["seq"]:
                    self._changed[r] = beat["seq"], now
            dead = self._dead_local_peer()
        if dead is not None:
            return dead
        for r in watched:
            age = now - self._changed[r][1]
            if r not in self._finished and age > self.timeout_s:
                return {"rank": r, "detector": self.rank, "kind": "stalled",
                        "message": f"{self._name(r)} stopped responding {self._heartbeats[r]['where']}: no heartbeat for "
                                   f"{age:.1f}s (trainer.dist_timeout_s={self.timeout_s:g})"}
        return None

    def _load_ids(self) -> bool:
        """Read the peers' identities once all are in the store; whether they are (caller holds the lock)."""
        if not self._ids:
            keys = [f"id/{r}" for r in range(self.world_size) if r != self.rank]
            if self._store.check(keys):
                self._ids = {int(k[3:]): json.loads(v) for k, v in zip(keys, self._store.multi_get(keys))}
        return bool(self._ids)

    def _missing(self, now: float, peers: list[int]) -> dict | None:
        """Before every rank wrote its identity: the first watched rank still absent after the timeout."""
        if now - self._started <= self.timeout_s:
            return None
        for r in peers if self.rank == 0 else [0]:
            if not self._store.check([f"id/{r}"]):
                return {"rank": r, "detector": self.rank, "kind": "missing",
                        "message": f"rank {r} never started its watchdog: nothing from it {now - self._started:.1f}s "
                                   f"after rank {self.rank} started (trainer.dist_timeout_s={self.timeout_s:g})"}
        return None

    def _dead_local_peer(self) -> dict | None:
        """A rank on this host whose process is gone though it never finished (caller holds the lock)."""
        for r, peer in self._ids.items():
            if r in self._finished or not self._is_local(peer) or processes.alive(peer):
                continue
            beat = json.loads(self._store.get(f"hb/{r}"))
            if beat["status"] == "done":
                self._finished.add(r)
                continue
            abort = self._read_abort()  # it published its own failure before it exited
            if abort is not None:
                return abort
            return {"rank": r, "detector": self.rank, "kind": "died",
                    "message": f"{self._name(r)} died {beat['where']}: its process (pid {peer['pid']} on {peer['host']}) is "
                               f"gone without an error report (killed by a signal, or crashed in native code)"}
        return None

    # ------------------------------------------------------------------ failures of this rank
    def _on_error(self, error: Exception) -> None:
        """An exception left a stage (main thread): blame the rank that failed first, or publish ours."""
        self._handled = error
        where = self.where()
        try:
            verdict = self._culprit()
            if verdict is None and _is_communication_error(error):
                # A peer's death shows here first, as a broken connection or a timeout; the heartbeats
                # name it within the timeout (the thread then ends the process), else the error is ours.
                time.sleep(self.timeout_s + 2 * self.interval_s)
                verdict = self._culprit()
            if verdict is None:
                verdict = {"rank": self.rank, "detector": self.rank, "kind": "failed",
                           "message": f"{self._name(self.rank)} failed {where}: {type(error).__name__}: {_first_line(error)}"}
                self._failed = True
                with self._lock:
                    self._status = "failed"
                    self._publish(where)
            verdict = self._declare(verdict)
        except RuntimeError:  # the store is gone: let the exception speak for itself
            return
        if verdict["rank"] != self.rank:
            self._failed = False
            self._stop_job(verdict)

    def _excepthook(self, kind, error, traceback) -> None:
        if isinstance(error, Exception) and error is not self._handled and self._thread is not None:
            self._on_error(error)
        self._previous_excepthook(kind, error, traceback)

    def _on_sigterm_signal(self, signum, frame) -> None:
        # Runs in the main thread whenever it gets to Python; the thread has usually acted already.
        self._sigterm = True
        self._wake()

    def _on_sigterm(self) -> None:
        """torchrun stops this rank (another one exited): report the verdict first, if there is one."""
        if self._failed:  # this rank failed on its own: let it finish printing its traceback
            time.sleep(_FAILED_EXIT_GRACE_S)
            self._exit(1)
        verdict = self._culprit()
        if verdict is None and self.graceful_sigterm:
            self.graceful_sigterm = False  # a second SIGTERM ends the rank at once
            self._sigterm = False
            return
        verdict = verdict or {"rank": self.rank, "detector": self.rank, "kind": "terminated",
                              "message": f"{self._name(self.rank)} received SIGTERM {self.where()} (from the "
                                         f"launcher, the scheduler or a user)"}
        verdict = self._declare(verdict)
        if verdict["rank"] != self.rank:
            self._stop_job(verdict)
        if self.rank == 0:  # culprit and detector: no other rank prints it
            _print_verdict(verdict)
        self._exit(128 + signal.SIGTERM)  # as the signal would have ended it

    # ------------------------------------------------------------------ ending the job
    def _culprit(self) -> dict | None:
        """The verdict already written, or a rank on this host found dead; None if neither."""
        with self._lock:
            return self._read_abort() or (self._dead_local_peer() if self._load_ids() else None)

    def _declare(self, verdict: dict) -> dict:
        """Write ``verdict`` unless one was written first; the one that stands."""
        with self._lock:
            return json.loads(self._store.compare_set("abort", "", json.dumps(verdict)))

    def _stop_job(self, verdict: dict, print_line: bool = False) -> None:
        """End this process: rank 0 prints the verdict (or its detector, when rank 0 is the culprit)."""
        culprit = verdict["rank"]
        if culprit == self.rank and self._failed:
            return  # our own exception propagates and ends the process with its traceback
        if not self._exiting.acquire(blocking=False):
            threading.Event().wait()  # another thread is ending the process
        with self._lock, suppress(RuntimeError):  # RuntimeError: the store is gone
            self._load_ids()
        peer = self._ids.get(culprit)
        local = peer is not None and self._is_local(peer)
        if verdict["kind"] == "failed" and local:
            # Let the failed rank print its traceback, exit and be reaped by torchrun first: torchrun's
            # summary then names it as the root cause, and this line comes after its traceback.
            deadline = time.monotonic() + _FAILED_EXIT_GRACE_S
            while processes.alive(peer, zombie=True) and time.monotonic() < deadline:
                time.sleep(0.05)
        if print_line or (self.rank == 0 if culprit != 0 else verdict["detector"] == self.rank != culprit):
            _print_verdict(verdict)
        if verdict["kind"] == "stalled" and verdict["detector"] == self.rank and local and processes.alive(peer):
            with suppress(ProcessLookupError):
                os.kill(peer["pid"], signal.SIGKILL)  # a stopped process ignores torchrun's SIGTERM
        self._exit(EXIT_CODE)

    def _is_local(self, peer: dict) -> bool:
        """On this host, in this pid namespace: its process can be looked up in /proc."""
        return peer["node"] is not None and peer["node"] == self._node

    @staticmethod
    def _exit(code: int) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)

    # ------------------------------------------------------------------ store records
    def _publish(self, where: str | None = None) -> None:
        """Write this rank's heartbeat (caller holds the lock)."""
        self.beats += 1
        self._store.set(f"hb/{self.rank}", json.dumps(
            {"seq": self.beats, "status": self._status, "where": where or self.where()}))

    def _read_abort(self) -> dict | None:
        return json.loads(self._store.get("abort")) if self._store.check(["abort"]) else None

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"w")
        except BlockingIOError:  # the thread has wake-ups pending already
            pass


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def _print_verdict(verdict: dict) -> None:
    print(f"error: {verdict['message']}; the job is stopped", file=sys.stderr)


_held_for_fork: list = []


def _before_fork() -> None:
    """A child is born with SIGTERM's default action and no wake-up fd: a SIGTERM that reaches it
    before it has run a line of Python (a data-loader worker terminated at once) would otherwise
    run the inherited C handler, which writes the signal to the parent's wake-up socket, and the
    parent would take it for its own. (A SIGTERM to the parent during the fork itself ends it with
    the default action.)"""
    watching = any(w._previous_sigterm is not None for w in _running)
    if watching and threading.current_thread() is threading.main_thread():
        _held_for_fork.append((signal.signal(signal.SIGTERM, signal.SIG_DFL), signal.set_wakeup_fd(-1)))


def _after_fork_in_parent() -> None:
    if _held_for_fork:
        handler, wakeup_fd = _held_for_fork.pop()
        signal.set_wakeup_fd(wakeup_fd, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, handler)


def _after_fork_in_child() -> None:
    _held_for_fork.clear()
    for watchdog in list(_running):
        watchdog._disown()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


def _open_store(timeout_s: float) -> dist.Store:
    """A connection of our own to the job's store, so the main thread's store calls (NCCL set-up,
    barriers) never wait behind the heartbeat, nor the heartbeat behind them."""
    default = dist.distributed_c10d._get_default_store()
    base = default
    while isinstance(base, dist.PrefixStore):
        base = base.underlying_store
    if isinstance(base, dist.TCPStore):
        return dist.TCPStore(base.host, base.port, is_master=False, timeout=timedelta(seconds=timeout_s))
    return default  # a file store (file:// init): shared with the process group


def _is_communication_error(error: Exception) -> bool:
    """Raised by a collective (NCCL's DistBackendError, gloo's RuntimeError): maybe a peer's fault."""
    return isinstance(error, dist.DistError) or (isinstance(error, RuntimeError) and "gloo" in str(error))


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:500] if lines else ""
