"""Ray placement (``trainer.backend=ray``): resource pools of role hosts, and the group that drives them.

HybridFlow's layout. The driver process runs the controller (``fit()``) and holds no model. Each
resource pool is a set of Ray actors, one per device (one per CPU rank on a machine without GPUs),
reserved together in one placement group; the actors of a pool form one ``torch.distributed``
group, so the roles they host shard their models with FSDP over the pool exactly as the ranks of
a torchrun job do. Roles mapped to the same pool are *colocated*: each actor of the pool holds one
rank of each of them in the same process (actor, rollout and reference always share one worker,
the hybrid engine; a critic or a reward model may join them or have a pool of its own).

:class:`RayWorkerGroup` is the worker-group contract of :mod:`verl.distributed.worker_group`
over a pool: ``run`` cuts the batch into the ranks' shares (the same shares a torchrun job takes),
sends each share to its actor, waits, and puts the results back in row order; ``call`` runs a
method on every actor with the same arguments and returns rank 0's result. Plain code, no
decorators: put a breakpoint in ``run`` and step through a dispatch.

Failures: every wait is bounded by ``trainer.dist_timeout_s``. An actor that dies, raises, or does
not answer in time ends the run with one :class:`~verl.errors.VerlError` naming the role, the rank
and the stage (``role.method``); the pools' actors are then killed, so nothing is left waiting in a
collective.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field

import torch

from verl.distributed.worker_group import WorkerGroup, merge_shares, shard_rows, tensor_bytes
from verl.errors import VerlError
from verl.protocol import Batch
from verl.utils.seed import seed_everything

logger = logging.getLogger("verl.dataflow")

GLOBAL_POOL = "global_pool"
RAY_INSTALL = "pip install 'verl[ray]' (or pip install 'ray[default]>=2.10')"
# Environment variables the hosts take over from the driver (a cluster's workers do not inherit
# the driver's environment): caches, offline switches, logging.
_PASSED_ENV_PREFIXES = ("HF_", "VERL_", "TRANSFORMERS_", "TOKENIZERS_", "PYTORCH_", "NCCL_", "GLOO_", "TORCH_")


class ActorLost(VerlError):
    """A Ray actor of a pool died (killed, out of memory, crashed): the root cause of a failed step."""


def import_ray():
    """The ``ray`` module, or a VerlError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise VerlError(f"trainer.backend=ray needs Ray, which is not installed: {RAY_INSTALL}; or leave "
                        f"trainer.backend=auto (one process, or torchrun for several)") from None
    return ray


class RoleHost:
    """One rank of a resource pool: a Ray actor process that holds this rank of every role mapped to
    the pool. The driver reaches it through :meth:`execute` only."""

    def __init__(self, rank: int, world_size: int, *, env: dict, cwd: str | None, seed: int, threads: int,
                 use_gpu: bool):
        os.environ.update(env)
        # Ray isolates one GPU per actor (CUDA_VISIBLE_DEVICES); in here it is device 0.
        os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": "0",
                           "LOCAL_WORLD_SIZE": "1"})
        if cwd and os.path.isdir(cwd):
            os.chdir(cwd)  # relative paths of the config mean what they mean to the driver
        if not use_gpu:
            torch.set_num_threads(threads)
        seed_everything(seed)  # as every torchrun rank does before it builds its roles
        self.rank = rank
        self.workers: dict[str, object] = {}
        self.kept: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}

    def address(self) -> tuple[str, int]:
        """(this node's address, a free port): the rendezvous of the pool's process group, on rank 0."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def init_group(self, master_addr: str, master_port: int, timeout_s: float) -> int:
        from verl.distributed.process_group import ensure_process_group

        import ray

        os.environ.update({"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)})
        ensure_process_group(timeout_s=timeout_s)
        return os.getpid(), ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()

    def build(self, role: str, factory, config, kwargs: dict) -> None:
        """``factory(config, **kwargs)`` is this rank of ``role``: a module-level function, which Ray
        sends by name (the trainer passes it; this layer knows no roles)."""
        self.workers[role] = factory(config, **kwargs)

    def execute(self, role: str, method: str, args: tuple, kwargs: dict, reply: bool = True,
                keep: tuple[str, ...] = (), restore: tuple[str, ...] = ()):
        """``role``'s ``method`` on this rank; its result (on the CPU), or None when ``reply`` is false
        (``call`` wants rank 0's result only: a state dict need not travel once per rank).

        ``keep``: columns of the result that stay here instead of travelling to the driver (keyed by
        the share's ``sample_id``); ``restore``: columns kept earlier that this call's share needs
        back, assembled from every rank of the pool (the rows may now sit on another rank)."""
        from verl.utils.preflight import explain_oom

        if restore:
            args = (self._restore(role, args[0], restore), *args[1:])
        with explain_oom(role, method=method):
            result = getattr(self.workers[role], method)(*args, **kwargs)
        if keep:
            ids = args[0]["sample_id"].cpu()
            store = self.kept.setdefault(role, {})
            for column in keep:
                store[column] = (ids, result[column])
            result = Batch({k: v for k, v in result.tensors.items() if k not in keep},
                           {k: v for k, v in result.non_tensors.items() if k not in keep}, result.meta)
        return _to_cpu(result) if reply else None

    def _restore(self, role: str, share: Batch, columns: tuple[str, ...]) -> Batch:
        from verl.distributed.process_group import all_gather_objects

        store = self.kept.get(role, {})
        # A collective over the pool (every rank is in this call): the kept rows move between the
        # workers, never through the driver.
        stores = all_gather_objects({c: (store[c][0], store[c][1].cpu()) for c in columns if c in store})
        wanted = share["sample_id"].cpu().tolist()
        restored = {}
        for column in columns:
            parts = [s[column] for s in stores if column in s]
            ids = torch.cat([p[0] for p in parts]).tolist()
            values = torch.cat([p[1] for p in parts])
            where = {sample: position for position, sample in enumerate(ids)}
            missing = [sample for sample in wanted if sample not in where]
            if missing:
                raise RuntimeError(f"{role}: column {column} was kept on the workers for other rows than these "
                                   f"(sample_id {missing[:5]} missing)")
            device = share["input_ids"].device if "input_ids" in share else values.device
            restored[column] = values[torch.tensor([where[sample] for sample in wanted])].to(device)
        return share.union(Batch(restored))

    def release(self, role: str) -> None:
        """Forget the columns ``role`` kept (the step that needed them is over)."""
        self.kept.pop(role, None)  # a CUDA tensor would arrive on the driver's device of the same index


def _to_cpu(value):
    if isinstance(value, (Batch, torch.Tensor)):
        return value.to("cpu")
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


@dataclass
class PoolSpec:
    """A pool's shape: ranks per node (``[n_gpus_per_node] * nnodes`` for the global pool)."""

    name: str
    ranks_per_node: list[int]
    roles: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return sum(self.ranks_per_node)


class RayResourcePool:
    """The actors of one pool, placed together (one bundle per rank) and joined in one process group."""

    def __init__(self, spec: PoolSpec, *, use_gpu: bool, seed: int, timeout_s: float, threads: int):
        ray = import_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.spec, self.timeout_s = spec, timeout_s
        self.pids: list[int] | None = None  # known once the pool's process group is up
        self.nodes: list[tuple[str, str]] | None = None  # each rank's Ray node: (node id, IP)
        self.hosts: list = []
        bundle = {"CPU": 1, "GPU": 1} if use_gpu else {"CPU": 1}
        # One placement group per node of the pool, its ranks packed on one machine (verl's layout:
        # a node's GPUs talk over NVLink); a one-node pool is one group that Ray may spread if need be.
        strict = len(spec.ranks_per_node) > 1
        self.placement_groups = [
            placement_group([dict(bundle) for _ in range(n)], strategy="STRICT_PACK" if strict else "PACK",
                            name=f"verl-{spec.name}-{i}")
            for i, n in enumerate(spec.ranks_per_node)]
        ready, _ = ray.wait([pg.ready() for pg in self.placement_groups], num_returns=len(self.placement_groups),
                            timeout=timeout_s)
        if len(ready) < len(self.placement_groups):
            self.shutdown()
            shape = " + ".join(f"{n} x {bundle}" for n in spec.ranks_per_node)
            raise VerlError(f"Ray could not reserve the resource pool {spec.name} ({shape}, roles "
                            f"{', '.join(spec.roles)}) within trainer.dist_timeout_s={timeout_s:g} s; the cluster "
                            f"has {ray.available_resources()} free{_nodes_line(ray)}. Lower trainer.n_gpus_per_node / "
                            f"nnodes (or the pool's size in trainer.resource_pools), or add machines")
        host_cls = ray.remote(RoleHost)
        env = {k: v for k, v in os.environ.items() if k.startswith(_PASSED_ENV_PREFIXES)}
        places = [(pg, index) for pg, n in zip(self.placement_groups, spec.ranks_per_node) for index in range(n)]
        self.hosts = [
            host_cls.options(num_cpus=1, num_gpus=1 if use_gpu else 0, name=None,
                             scheduling_strategy=PlacementGroupSchedulingStrategy(
                                 placement_group=pg, placement_group_bundle_index=index)
                             ).remote(rank, spec.world_size, env=env, cwd=os.getcwd(), seed=seed, threads=threads,
                                      use_gpu=use_gpu)
            for rank, (pg, index) in enumerate(places)]
        master_addr, master_port = self.wait([self.hosts[0].address.remote()], "start", "pool")[0]
        started = self.wait([h.init_group.remote(master_addr, master_port, timeout_s) for h in self.hosts],
                            "init_process_group", "pool")
        self.pids = [pid for pid, _, _ in started]
        self.nodes = [(node, ip) for _, ip, node in started]

    def layout(self) -> str:
        """Where the pool's ranks run, for the start-up line: "2 ranks on 2 nodes (node 3f2a9c1b at
        10.0.0.1: rank 0; node 8e7d6c5b at 10.0.0.2: rank 1)"."""
        by_node: dict[str, list[int]] = {}
        for rank in range(len(self.nodes or [])):
            by_node.setdefault(self._node_name(rank), []).append(rank)
        ranks = self.spec.world_size
        where = "; ".join(f"{node}: rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}"
                          for node, r in by_node.items())
        return (f"{ranks} rank{'s' if ranks != 1 else ''} on {len(by_node)} node{'s' if len(by_node) != 1 else ''} "
                f"({where})")

    def wait(self, refs: list, stage: str, role: str) -> list:
        """The results of ``refs`` (one per rank, in rank order), each within ``trainer.dist_timeout_s``
        of the call. A rank that fails or is lost ends the wait at once, with its role, rank and stage."""
        ray = import_ray()
        pending = {ref: rank for rank, ref in enumerate(refs)}
        results: list = [None] * len(refs)
        deadline = time.monotonic() + self.timeout_s
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(deadline - time.monotonic(), 0.0))
            if not ready:
                ranks = sorted(pending.values())
                raise VerlError(f"{role} rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} of "
                                f"{len(refs)} (Ray pool {self.spec.name}) did not finish {role}.{stage} within "
                                f"trainer.dist_timeout_s={self.timeout_s:g} s: hung, or slower than the limit "
                                f"(raise trainer.dist_timeout_s if the stage is legitimately that slow)")
            ref = ready[0]
            rank = pending.pop(ref)
            try:
                results[rank] = self._get(ray, ref, role, rank, stage)
            except Exception as failure:
                raise self._root_cause(ray, pending, role, stage) or failure
        return results

    def _root_cause(self, ray, pending: dict, role: str, stage: str) -> Exception | None:
        """When a rank fails because another one died (its collective lost a peer), the dead one is the
        news: the error of a rank that is lost, among those still pending, if one is within seconds."""
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=3.0)
        for ref in ready:
            try:
                self._get(ray, ref, role, pending[ref], stage)
            except ActorLost as lost:
                return lost
            except Exception:  # noqa: BLE001 - another consequence of the same failure
                continue
        return None

    def _get(self, ray, ref, role: str, rank: int, stage: str):
        where = f"{role} rank {rank} (Ray pool {self.spec.name}, {self._place(rank)}) during {role}.{stage}"
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else None
            if isinstance(cause, VerlError):
                raise cause from None  # the worker's own one-line error (a bad reward file, an OOM hint)
            raise RuntimeError(f"{where} failed: {type(cause).__name__ if cause else 'error'}: "
                               f"{cause if cause else e}") from e
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.WorkerCrashedError) as e:
            if self._node_lost(ray, rank, e):
                raise ActorLost(f"{where} was lost: its node left the cluster ({type(e).__name__}: the machine, or "
                                f"its Ray raylet, is gone). The checkpoints in trainer.default_local_dir are intact: "
                                f"run the same command on the nodes that remain (trainer.nnodes for them) and it "
                                f"resumes from the last one") from None
            raise ActorLost(f"{where} was lost: the actor process died ({type(e).__name__}). Its log is in the Ray "
                            f"session folder (/tmp/ray/session_latest/logs); a killed process is often out of "
                            f"memory") from None

    def _node_lost(self, ray, rank: int, error: Exception) -> bool:
        """Whether rank ``rank`` was lost with its node. An actor whose connection broke is
        "unavailable" until Ray's health checks settle it (about 15 s for a node): meanwhile its node
        is watched, and the actor pinged (a dead process is reported at once)."""
        if not self.nodes:
            return False
        node = self.nodes[rank][0]
        if _node_died(error):
            return True
        deadline = time.monotonic() + (min(self.timeout_s, 30.0)
                                       if isinstance(error, ray.exceptions.ActorUnavailableError) else 0.0)
        while True:
            if not any(n["NodeID"] == node and n["Alive"] for n in ray.nodes()):
                return True
            if time.monotonic() >= deadline:
                return False
            try:
                ray.get(self.hosts[rank].address.remote(), timeout=1.0)
            except ray.exceptions.GetTimeoutError:
                continue
            except ray.exceptions.RayActorError as again:
                if not isinstance(again, ray.exceptions.ActorUnavailableError):
                    return _node_died(again)  # settled: the process died (or its node, said so)
                time.sleep(0.5)
            else:
                return False  # it answers: not a lost node

    def _place(self, rank: int) -> str:
        """Where rank ``rank`` runs: "pid P", with its node when the pool spans several."""
        pid = f"pid {self.pids[rank]}" if self.pids else "pid ?"
        if self.nodes and len(set(self.nodes)) > 1:
            return f"{self._node_name(rank)}, {pid}"
        return pid

    def _node_name(self, rank: int) -> str:
        node, ip = self.nodes[rank]
        return f"node {node[:8]} at {ip}"

    def build(self, role: str, factory, config, **kwargs) -> RayWorkerGroup:
        """Build ``role`` on every actor of the pool with ``factory(config, **kwargs)`` (collectively:
        FSDP shards over the pool)."""
        self.wait([h.build.remote(role, factory, config, kwargs) for h in self.hosts], "build", role)
        return RayWorkerGroup(role, self)

    def shutdown(self) -> None:
        ray = import_ray()
        for host in self.hosts:
            ray.kill(host, no_restart=True)
        from ray.util.placement_group import remove_placement_group

        for pg in self.placement_groups:
            remove_placement_group(pg)


def _node_died(error: Exception) -> bool:
    """Ray's actor error says that the actor's node is gone (not just its process)."""
    text = str(error).lower()
    return any(words in text for words in ("node has died", "node died", "node is dead", "raylet died",
                                           "node was terminated"))


def _nodes_line(ray) -> str:
    alive = [n for n in ray.nodes() if n.get("Alive")]
    return f" on {len(alive)} node{'s' if len(alive) != 1 else ''}"


class RayWorkerGroup(WorkerGroup):
    """A role's ranks on a :class:`RayResourcePool` (see the module docstring)."""

    def __init__(self, name: str, pool: RayResourcePool):
        super().__init__(name, pool.spec.world_size)
        self.pool = pool
        self.kept_columns: set[str] = set()
        """Private result columns (``run(..., private=...)``) that stay on the workers until :meth:`end_step`."""

    def run(self, method: str, batch: Batch | None = None, *, block: int | None = None,
            private: tuple[str, ...] = (), **kwargs):
        start = time.perf_counter()
        if batch is None:
            return self._everywhere(method, (), kwargs)
        restore = tuple(sorted(self.kept_columns))
        ids = None
        if private and "sample_id" not in batch:  # how the workers find their kept rows again
            ids = torch.arange(len(batch))
            batch = batch.union(Batch({"sample_id": ids}))
        if restore and "sample_id" not in batch:
            raise RuntimeError(f"{self.name}.{method}: columns kept on the workers ({', '.join(restore)}) are "
                               f"matched to rows by the sample_id column that came back with them, and this "
                               f"batch has none")
        rows = shard_rows(len(batch), self.world_size, block)
        shares = [batch.index(r) for r in rows]
        refs = [host.execute.remote(self.name, method, (share,), kwargs, True, tuple(private), restore)
                for host, share in zip(self.pool.hosts, shares)]
        self.kept_columns.update(private)
        sent = sum(tensor_bytes(s) + tensor_bytes(kwargs) for s in shares)
        results = self.pool.wait(refs, method, self.name)
        received = sum(tensor_bytes(r) for r in results)
        self._count(sent, received)
        if isinstance(results[0], Batch) and not results[0].keys():
            result = Batch(meta=results[0].meta)  # every column stayed on the workers
        elif isinstance(results[0], (Batch, torch.Tensor)):
            result = merge_shares(results, rows, len(batch), self.name)
        else:
            result = results[0]  # metrics: the workers reduced them over the ranks already
        if ids is not None:  # the controller's batch carries the ids from here on (reordered with its rows)
            result = result.union(Batch({"sample_id": ids}))
        self._log(method, batch, result, start, f"ray x{self.world_size} ")
        return result

    def call(self, method: str, *args, **kwargs):
        return self._everywhere(method, args, kwargs)

    def end_step(self) -> None:
        if self.kept_columns:
            self.pool.wait([host.release.remote(self.name) for host in self.pool.hosts], "release", self.name)
            self.kept_columns.clear()

    def _everywhere(self, method: str, args: tuple, kwargs: dict):
        ray = import_ray()
        payload_bytes = tensor_bytes(args) + tensor_bytes(kwargs)
        if payload_bytes:  # put in the object store once (Ray resolves the refs), not pickled once per rank
            args, kwargs = ray.put(args), ray.put(kwargs)
        # Every rank runs the method (it may be a collective); only rank 0's result comes back.
        refs = [host.execute.remote(self.name, method, args, kwargs, rank == 0)
                for rank, host in enumerate(self.pool.hosts)]
        result = self.pool.wait(refs, method, self.name)[0]
        received = tensor_bytes(result)
        self._count(payload_bytes * self.world_size, received)
        return result

    def _count(self, sent: int, received: int) -> None:
        self.bytes_sent += sent
        self.bytes_received += received
        self.bytes_to_workers += sent
        self.bytes_from_workers += received
