"""The rollout on ranks of the torchrun job (``async_training.rollout_placement=ranks``): verl's separate
resource pools under torchrun.

The job is started with the trainer's ranks plus the rollout's: ``torchrun --nproc_per_node=T+R`` (or
over nodes), R = ``rollout.nnodes x rollout.n_gpus_per_node``. The last R ranks are the rollout, the first
T train. :func:`split_job` runs first on every rank:

* on a training rank it makes the job's ``WORLD_SIZE`` T, so that the process group, the batch sizes and
  every collective are the trainer's alone (the rollout ranks never join that group);
* a rollout rank instead runs :func:`serve_rank`: it meets the trainer's rank 0 through the job's store
  (torchrun's, at ``MASTER_ADDR:MASTER_PORT``), receives what builds its rollout worker, and answers
  requests with the server loop of a rollout process (:func:`verl.distributed.rollout_server.serve`).
  Its device is its own (``cuda:LOCAL_RANK`` on GPUs).

The trainer's end (:func:`open_rank_streams`) is a :class:`~verl.distributed.rollout_stream.RolloutStream`
per rollout rank over a socket, so the controller, the bound, partial rollouts, weight sync (``shm`` on
one machine, ``broadcast`` across machines) and resume are those of rollout processes. Messages are
pickled by value (tensors included): nothing relies on a shared file system or shared memory, except the
``shm`` weights, chosen only when every rank is on one machine.

When any rank dies torchrun stops the others; a rollout rank that dies or closes its connection ends the
trainer's wait at once, naming it.
"""

from __future__ import annotations

import datetime
import os
import pickle
import queue
import secrets
import signal
import socket
import threading
import time
from multiprocessing.connection import Client, Listener

from verl.distributed.rollout_server import ignore_stop_signals, serve
from verl.distributed.rollout_stream import AnswerReader, RolloutPool, RolloutStream
from verl.errors import ConfigError, VerlError

_KEY = "verl/rollout_ranks/"


def rollout_rank_count(config) -> int:
    """The rollout's ranks: ``rollout.nnodes x rollout.n_gpus_per_node`` (verl's rollout pool)."""
    return config.rollout.nnodes * config.rollout.n_gpus_per_node


def uses_ranks(config) -> bool:
    a = config.async_training
    return bool(a.enable) and a.rollout_placement == "ranks"


def split_job(config) -> int | None:
    """On every rank, before anything starts a process group. Returns this rank's index in the rollout
    (0 .. R-1) on a rollout rank; None on a training rank, whose ``WORLD_SIZE`` is now the trainer's.
    Refuses a job that was not started with room for both (one line naming the torchrun command)."""
    count = rollout_rank_count(config)
    if os.environ.get("VERL_ROLLOUT_RANKS"):  # split already: a training rank
        return None
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        raise ConfigError(f"async_training.rollout_placement=ranks runs the rollout on ranks of a torchrun job, and "
                          f"this process was not started by torchrun: start it with torchrun --nproc_per_node=T+{count} "
                          f"(T training ranks, {count} = rollout.nnodes x rollout.n_gpus_per_node rollout ranks), or "
                          f"set async_training.rollout_placement=process (a process started by the trainer)")
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if world <= count:
        raise ConfigError(f"async_training.rollout_placement=ranks: the torchrun job has {world} rank(s) and the "
                          f"rollout takes the last {count} (rollout.nnodes x rollout.n_gpus_per_node), which leaves "
                          f"none to train; start {count} more ranks (torchrun --nproc_per_node=T+{count}) or lower "
                          f"rollout.n_gpus_per_node")
    trainers = world - count
    if rank >= trainers:
        return rank - trainers
    os.environ["WORLD_SIZE"] = str(trainers)
    os.environ["VERL_ROLLOUT_RANKS"] = str(count)
    return None


def one_machine() -> bool:
    """Whether every rank of the torchrun job runs on this machine (its launcher's group is one node)."""
    return int(os.environ.get("GROUP_WORLD_SIZE", "1")) == 1


def _job_store(timeout_s: float):
    """A client of the job's store (torchrun's rendezvous store), shared by the trainer's rank 0 and the
    rollout ranks, under a prefix of our own."""
    import torch.distributed as dist

    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
    run = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.PrefixStore(_KEY + run, store)


def _listen_host() -> str:
    """Where the rollout ranks reach the trainer's rank 0: ``VERL_WEIGHT_SYNC_HOST``; on one machine the
    loopback; across machines this machine's name as torchrun's rendezvous gave it, else its hostname."""
    if os.environ.get("VERL_WEIGHT_SYNC_HOST"):
        return os.environ["VERL_WEIGHT_SYNC_HOST"]
    if one_machine():
        return "127.0.0.1"
    return os.environ.get("MASTER_ADDR") or socket.gethostname()


# ------------------------------------------------------------------ the rollout rank's side
class _Requests:
    """The server loop's request queue, read from the trainer's connection (``get``/``get_nowait``)."""

    def __init__(self, conn):
        self.conn = conn

    def get(self):
        try:
            return pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            raise VerlError("the trainer closed its connection to this rollout (it ended or died)") from None

    def get_nowait(self):
        if not self.conn.poll(0):
            raise queue.Empty
        return self.get()


class _Results:
    def __init__(self, conn):
        self.conn = conn

    def put(self, item) -> None:
        self.conn.send_bytes(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))


def serve_rank(index: int, timeout_s: float) -> None:
    """A rollout rank's life: meet the trainer's rank 0, build the worker it describes, answer its
    requests until it says stop."""
    # torchrun passes Ctrl-C and SIGTERM to every rank: the trainer's ranks stop after their step, and rank 0
    # then needs this rank's answers before it checkpoints and closes the connection (this rank's end).
    ignore_stop_signals(signal.SIGINT, signal.SIGTERM)
    store = _job_store(timeout_s)
    store.wait(["address"], datetime.timedelta(seconds=timeout_s))
    host, port = store.get("address").decode().rsplit(":", 1)
    serve_at(index, (host, int(port)), store.get("authkey"))


def serve_at(index: int, address: tuple[str, int], authkey: bytes) -> None:
    """Connect to the trainer's listener at ``address``, say who this is, build the worker it describes
    and answer its requests until it says stop."""
    conn = Client(address, authkey=authkey)
    conn.send_bytes(pickle.dumps({"index": index, "pid": os.getpid(), "host": socket.gethostname()}))
    spec = pickle.loads(conn.recv_bytes())
    try:
        serve(spec, _Requests(conn), _Results(conn))
    finally:
        conn.close()


# ------------------------------------------------------------------ the trainer's side
class RankRolloutStream(RolloutStream):
    """The trainer's end of one rollout rank, over its socket."""

    def __init__(self, conn, timeout_s: float, name: str):
        super().__init__(timeout_s)
        self.conn, self.name = conn, name
        self.channel = None
        self.send_failed = False
        self._sending = threading.Lock()  # one message on the socket at a time
        self.reader = AnswerReader(lambda: pickle.loads(self.conn.recv_bytes()), (EOFError, OSError),
                                   "verl-rollout-rank-reader")

    def _put(self, request) -> None:
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        with self._sending:
            try:
                self.conn.send_bytes(data)
            except OSError:
                self.send_failed = True

    def _get(self, timeout: float):
        return self.reader.get(timeout)

    def _gone(self) -> str | None:
        if self.reader.ended is not None or self.send_failed:
            return "closed its connection (it died or left the job)"
        return None

    def describe(self) -> str:
        return self.name

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self._gone() is None:
            self._put(None)
        self.conn.close()


class _Listener:
    """The trainer's end before the rollout connects: a socket listening at ``host`` (any interface unless
    it is the loopback), with a fresh key that every connection must prove."""

    def __init__(self, host: str):
        self.authkey = secrets.token_bytes(16)
        self.listener = Listener(("127.0.0.1" if host == "127.0.0.1" else "0.0.0.0", 0), authkey=self.authkey)
        self.address = (host, self.listener.address[1])

    def accept(self, count: int, timeout_s: float, what: str, check=None, fix: str = "") -> dict[int, tuple]:
        """The ``count`` connections, by the index each says it has, within ``timeout_s``; ``check()``, called
        while waiting, raises when a member can no longer connect (it failed to start)."""
        hellos: dict[int, tuple] = {}
        failure: list[BaseException] = []

        def accept():
            try:
                while len(hellos) < count:
                    conn = self.listener.accept()
                    hello = pickle.loads(conn.recv_bytes())
                    hellos[hello["index"]] = (conn, hello)
            except BaseException as e:  # noqa: BLE001 - said below
                failure.append(e)

        thread = threading.Thread(target=accept, name="verl-rollout-accept", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout_s
        try:
            while thread.is_alive() and time.monotonic() < deadline:
                thread.join(0.5)
                if check is not None and thread.is_alive():
                    check()
        except BaseException:
            self._close(hellos)
            raise
        finally:
            self.listener.close()
        if thread.is_alive() or failure:
            self._close(hellos)
            missing = [i + 1 for i in range(count) if i not in hellos]
            why = f": {failure[0]}" if failure else ""
            raise VerlError(f"{what} {missing} of {count} did not reach the trainer within {timeout_s:.0f} s "
                            f"(trainer.dist_timeout_s){why}{fix}")
        return hellos

    @staticmethod
    def _close(hellos) -> None:
        for conn, _ in hellos.values():
            conn.close()


def _streams(hellos: dict[int, tuple], spec, timeout_s: float, broadcast: bool, host: str, name) -> RolloutStream:
    """Send each connected member its worker spec (with the weight broadcast's address when ``broadcast``)
    and return their stream: one member's, or a pool of them. ``name(index, hello)``: how errors call one."""
    import dataclasses

    from verl.distributed.weight_sync import BroadcastChannel

    count = len(hellos)
    channel = BroadcastChannel.open(timeout_s, members=count, host=host) if broadcast else None
    members = []
    for index in range(count):
        conn, hello = hellos[index]
        member_spec = dataclasses.replace(spec, broadcast=channel.address if channel else None,
                                          broadcast_rank=index + 1)
        conn.send_bytes(pickle.dumps(member_spec, protocol=pickle.HIGHEST_PROTOCOL))
        members.append(RankRolloutStream(conn, timeout_s, name(index, hello)))
    if count == 1:
        stream = members[0]
        if channel is not None:
            stream.channel = channel
            channel.connect(stream._gone)
        return stream
    return RolloutPool(members, timeout_s, channel)


def open_rank_streams(spec, count: int, timeout_s: float, broadcast: bool) -> RolloutStream:
    """On the trainer's rank 0 of a torchrun job: wait for the job's ``count`` rollout ranks to connect (the
    address goes through torchrun's store) and return their stream, not yet started."""
    host = _listen_host()
    listener = _Listener(host)
    store = _job_store(timeout_s)
    store.set("authkey", listener.authkey)
    store.set("address", f"{host}:{listener.address[1]}")
    hellos = listener.accept(count, timeout_s, "rollout rank(s)",
                             fix="; every rank must run the same command (async_training.rollout_placement=ranks)")
    trainers = int(os.environ["WORLD_SIZE"])
    return _streams(hellos, spec, timeout_s, broadcast, host,
                    lambda index, hello: f"on rank {trainers + index} of the torchrun job (pid {hello['pid']} on "
                                         f"{hello['host']})")


# ------------------------------------------------------------------ Ray: rollout actors of a pool of their own
class RolloutHost:
    """A Ray actor of the rollout's own pool: :meth:`serve` connects back to the driver and answers its
    requests, as a rollout rank of a torchrun job does."""

    def __init__(self, env: dict, cwd: str | None, threads: int | None, use_gpu: bool):
        import torch

        os.environ.update(env)
        if cwd and os.path.isdir(cwd):
            os.chdir(cwd)
        if threads and not use_gpu:
            torch.set_num_threads(threads)

    def serve(self, index: int, address: tuple[str, int], authkey: bytes) -> None:
        serve_at(index, address, authkey)


def open_ray_rollout(spec, count: int, timeout_s: float, broadcast: bool, *, use_gpu: bool,
                     threads: int | None) -> RolloutStream:
    """On the Ray driver: a placement group of ``count`` bundles (a GPU each on GPUs), one
    :class:`RolloutHost` per bundle, connected back to this process; their stream, not yet started. Closing
    it kills the actors and frees their bundles."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from verl.distributed.ray_pool import _PASSED_ENV_PREFIXES, import_ray

    ray = import_ray()
    bundle = {"CPU": 1, "GPU": 1} if use_gpu else {"CPU": 1}
    group = placement_group([dict(bundle) for _ in range(count)], strategy="PACK", name="verl-rollout_pool")
    actors: list = []

    def release() -> None:
        for actor in actors:
            ray.kill(actor)
        remove_placement_group(group)

    try:
        ready, _ = ray.wait([group.ready()], timeout=timeout_s)
        if not ready:
            raise VerlError(f"Ray could not reserve the rollout's pool ({count} x {bundle}: rollout.nnodes x "
                            f"rollout.n_gpus_per_node) within trainer.dist_timeout_s={timeout_s:g} s; the cluster has "
                            f"{ray.available_resources()} free. Lower rollout.n_gpus_per_node or add machines")
        host = os.environ.get("VERL_WEIGHT_SYNC_HOST") or ray.util.get_node_ip_address()
        listener = _Listener(host)
        env = {k: v for k, v in os.environ.items() if k.startswith(_PASSED_ENV_PREFIXES)}
        host_cls = ray.remote(RolloutHost)
        actors = [host_cls.options(num_cpus=1, num_gpus=1 if use_gpu else 0, scheduling_strategy=
                                   PlacementGroupSchedulingStrategy(placement_group=group,
                                                                    placement_group_bundle_index=i)
                                   ).remote(env, os.getcwd(), threads, use_gpu) for i in range(count)]
        served = [actor.serve.remote(i, listener.address, listener.authkey) for i, actor in enumerate(actors)]

        def check():  # an actor that could not start, or failed before connecting, says why at once
            done, _ = ray.wait(served, num_returns=len(served), timeout=0)
            for ref in done:
                ray.get(ref)  # raises its error
        hellos = listener.accept(count, timeout_s, "Ray rollout actor(s)", check)
        stream = _streams(hellos, spec, timeout_s, broadcast, host,
                          lambda index, hello: f"on Ray actor {index + 1} of {count} (pid {hello['pid']} on "
                                               f"{hello['host']})")
    except BaseException:
        release()
        raise
    close = stream.close

    def close_and_release() -> None:
        try:
            close()
        finally:
            release()
    stream.close = close_and_release
    return stream
