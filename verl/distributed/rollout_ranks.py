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
import socket
import threading
from multiprocessing.connection import Client, Listener

from verl.distributed.rollout_server import serve
from verl.distributed.rollout_stream import RolloutPool, RolloutStream, _Unreadable
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
            raise VerlError("the trainer's rank 0 closed its connection to this rollout rank (it ended or died); "
                            "torchrun stops the job") from None

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
    store = _job_store(timeout_s)
    store.wait(["address"], datetime.timedelta(seconds=timeout_s))
    host, port = store.get("address").decode().rsplit(":", 1)
    conn = Client((host, int(port)), authkey=store.get("authkey"))
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
        self.closed: str | None = None
        self._sending = threading.Lock()
        self.inbox: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_answers, name="verl-rollout-rank-reader", daemon=True).start()

    def _read_answers(self) -> None:
        while True:
            try:
                answer = pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError) as e:
                self.closed = "closed its connection (it died or left the job)"
                self.inbox.put(_Unreadable(e))
                return
            self.inbox.put(answer)

    def _put(self, request) -> None:
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        with self._sending:
            try:
                self.conn.send_bytes(data)
            except OSError:
                self.closed = self.closed or "closed its connection (it died or left the job)"

    def _get(self, timeout: float):
        answer = self.inbox.get(timeout=timeout)
        if isinstance(answer, _Unreadable):
            self.inbox.put(answer)
            raise answer.error
        return answer

    def _gone(self) -> str | None:
        return self.closed

    def describe(self) -> str:
        return self.name

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.closed is None:
            self._put(None)
        self.conn.close()


def open_rank_streams(spec, count: int, timeout_s: float, broadcast: bool) -> RolloutStream:
    """On the trainer's rank 0: wait for the ``count`` rollout ranks to connect, send each its worker spec
    (with the weight broadcast's address, ``broadcast``), and return their stream (a pool of them when
    more than one), not yet started."""
    import dataclasses

    from verl.distributed.weight_sync import BroadcastChannel

    host = _listen_host()
    authkey = secrets.token_bytes(16)
    listener = Listener(("127.0.0.1" if host == "127.0.0.1" else "0.0.0.0", 0), authkey=authkey)
    store = _job_store(timeout_s)
    store.set("authkey", authkey)
    store.set("address", f"{host}:{listener.address[1]}")
    hellos: dict[int, tuple] = {}
    failure: list[BaseException] = []

    def accept():
        try:
            while len(hellos) < count:
                conn = listener.accept()
                hello = pickle.loads(conn.recv_bytes())
                hellos[hello["index"]] = (conn, hello)
        except BaseException as e:  # noqa: BLE001 - said below
            failure.append(e)

    thread = threading.Thread(target=accept, name="verl-rollout-rank-accept", daemon=True)
    thread.start()
    thread.join(timeout_s)
    listener.close()
    if thread.is_alive() or failure:
        missing = sorted(set(range(count)) - set(hellos))
        for conn, _ in hellos.values():
            conn.close()
        why = f": {failure[0]}" if failure else ""
        raise VerlError(f"rollout rank(s) {missing} of {count} did not reach the trainer within {timeout_s:.0f} s "
                        f"(trainer.dist_timeout_s){why}; every rank must run the same command with "
                        f"async_training.rollout_placement=ranks")
    channel = BroadcastChannel.open(timeout_s, members=count, host=host) if broadcast else None
    trainers = int(os.environ["WORLD_SIZE"])
    members = []
    for index in range(count):
        conn, hello = hellos[index]
        member_spec = dataclasses.replace(spec, broadcast=channel.address if channel else None,
                                          broadcast_rank=index + 1)
        conn.send_bytes(pickle.dumps(member_spec, protocol=pickle.HIGHEST_PROTOCOL))
        name = f"on rank {trainers + index} of the torchrun job (pid {hello['pid']} on {hello['host']})"
        members.append(RankRolloutStream(conn, timeout_s, name))
    if count == 1:
        stream = members[0]
        if channel is not None:
            stream.channel = channel
            channel.connect(stream._gone)
        return stream
    return RolloutPool(members, timeout_s, channel)
