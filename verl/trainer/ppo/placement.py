"""Where the roles of an RL run live, and the worker groups the controller drives them through.

* ``trainer.backend=auto``: every role in this process, or under torchrun one rank of every role in
  each process (:func:`verl.distributed.worker_group.make_worker_group`).
* ``trainer.backend=ray``: this process is the driver; the roles are Ray actors on resource pools
  (:mod:`verl.distributed.ray_pool`). ``global_pool`` has ``[trainer.n_gpus_per_node] *
  trainer.nnodes`` ranks and holds actor, rollout and reference (one worker: the hybrid engine);
  ``trainer.role_pools`` moves the critic, the reward or the teachers to a pool of
  ``trainer.resource_pools``, and verl's ``reward_model.enable_resource_pool`` gives the reward
  model its own ``reward_pool`` of ``reward_model.nnodes x n_gpus_per_node``.

The controller code is the same for both: it only sees :class:`Roles`.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field

from verl.distributed.watchdog import Watchdog
from verl.distributed.worker_group import LocalWorkerGroup, WorkerGroup, make_worker_group
from verl.errors import ConfigError, VerlError
from verl.trainer.ppo import roles

logger = logging.getLogger(__name__)

MOVABLE_ROLES = ("critic", "reward", "teacher")
REWARD_POOL = "reward_pool"


@dataclass
class Roles:
    actor_rollout_ref: WorkerGroup
    reward: WorkerGroup
    critic: WorkerGroup | None = None
    teacher: WorkerGroup | None = None
    pools: list = field(default_factory=list)
    """The Ray resource pools (empty in-process); :meth:`shutdown` releases them."""

    def shutdown(self) -> None:
        for pool in self.pools:
            try:
                pool.shutdown()
            except Exception as e:  # noqa: BLE001 - releasing is best effort, after the run's own outcome
                logger.warning("releasing Ray pool %s: %s", pool.spec.name, e)
        self.pools = []


def uses_ray(config) -> bool:
    return config.trainer.backend == "ray"


def reward_in_driver(config) -> bool:
    """Whether the reward runs in this process: always in-process, and under Ray unless it is placed
    on a pool (a reward model, or ``trainer.role_pools.reward``)."""
    return not uses_ray(config) or role_mapping(config, pool_specs(config))["reward"] is None


def place_roles(config, *, total_steps: int, tokenizer, watchdog: Watchdog, reward_worker=None,
                teachers=None) -> Roles:
    """The worker groups of every role; ``reward_worker``: the reward, already built in this process
    (built early, so that a broken reward file fails before any model loads), when it runs here."""
    if uses_ray(config):
        return _place_on_ray(config, total_steps=total_steps, reward_worker=reward_worker, teachers=teachers)
    unused = [f"trainer.{key}" for key in ("resource_pools", "role_pools") if getattr(config.trainer, key)]
    if config.reward_model.enable_resource_pool:
        unused.append("reward_model.enable_resource_pool")
    if unused:
        logger.warning("%s only place roles under trainer.backend=ray; here every role runs in this process (or "
                       "one rank of each per torchrun process)", " and ".join(unused))
    worker = roles.actor_rollout_ref_worker(config, total_steps=total_steps, tokenizer=tokenizer)
    critic = None
    if config.critic_enabled():
        critic = make_worker_group(roles.critic_worker(config, total_steps=total_steps, device=worker.device),
                                   "critic", watchdog)
    teacher = None
    if teachers:
        from verl.trainer.ppo import distillation

        teacher = distillation.build_teacher_group(config, teachers, worker.device, watchdog)
    return Roles(actor_rollout_ref=make_worker_group(worker, "actor_rollout_ref", watchdog),
                 reward=make_worker_group(reward_worker or roles.reward_worker(config, tokenizer=tokenizer), "reward",
                                          watchdog),
                 critic=critic, teacher=teacher)


# ---------------------------------------------------------------------------------------------- Ray
def pool_specs(config) -> dict[str, list[int]]:
    """``{pool name: ranks per node}``: global_pool, the reward model's own pool (verl's keys), and
    ``trainer.resource_pools``; each checked to be a list of positive rank counts."""
    trainer, rm = config.trainer, config.reward_model
    specs = {"global_pool": [trainer.n_gpus_per_node] * trainer.nnodes}
    if rm.enable and rm.enable_resource_pool:
        nodes, per_node = rm.nnodes or 1, rm.n_gpus_per_node or trainer.n_gpus_per_node
        specs[REWARD_POOL] = [per_node] * nodes
    for name, ranks in dict(trainer.resource_pools).items():
        if name in specs:
            raise ConfigError(f"trainer.resource_pools.{name}: {name} is already defined "
                              f"({'trainer.nnodes x n_gpus_per_node' if name == 'global_pool' else 'by reward_model.enable_resource_pool'}); "
                              f"give the pool another name")
        ranks = [ranks] if isinstance(ranks, int) else list(ranks)
        if not ranks or any(not isinstance(r, int) or isinstance(r, bool) or r < 1 for r in ranks):
            raise ConfigError(f"trainer.resource_pools.{name}={ranks}: a pool is a list of ranks per node, each >= 1, "
                              f"e.g. trainer.resource_pools.{name}=[2] for 2 ranks on one machine")
        specs[str(name)] = ranks
    return specs


def role_mapping(config, specs: dict[str, list[int]]) -> dict[str, str | None]:
    """``{role: pool name}``; None for the reward when it runs in the driver (rule functions only)."""
    mapping = {str(k): str(v) for k, v in dict(config.trainer.role_pools).items()}
    for role, pool in mapping.items():
        if role not in MOVABLE_ROLES:
            hint = (" (actor, rollout and reference are one worker, always on global_pool)"
                    if role in ("actor_rollout_ref", "actor", "rollout", "ref") else "")
            raise ConfigError(f"trainer.role_pools.{role}: not a role that can move; roles: "
                              f"{', '.join(MOVABLE_ROLES)}{hint}")
        if pool not in specs:
            raise ConfigError(f"trainer.role_pools.{role}={pool}: no such pool; pools: {', '.join(specs)} "
                              f"(define more with trainer.resource_pools.NAME=[ranks per node])")
    placed = {"actor_rollout_ref": "global_pool"}
    if config.critic_enabled():
        placed["critic"] = mapping.get("critic", "global_pool")
    if config.distillation.enabled:
        placed["teacher"] = mapping.get("teacher", "global_pool")
    if config.reward_model.enable:
        default = REWARD_POOL if REWARD_POOL in specs else "global_pool"
        placed["reward"] = mapping.get("reward", default)
    else:
        placed["reward"] = mapping.get("reward")  # rule rewards: in the driver unless asked otherwise
    for role in mapping:
        if role not in placed:
            logger.warning("trainer.role_pools.%s has no effect: this run has no %s", role, role)
    return placed


def init_ray(config, total_ranks: int):
    """Connect to the cluster of ``ray_kwargs.ray_init.address`` (or RAY_ADDRESS, or the one ``ray start``
    started on this machine), or start a local Ray with room for every rank; a no-op when Ray is
    already initialised (a notebook, ``ray job submit``)."""
    from verl.distributed.ray_pool import import_ray

    ray = import_ray()
    if ray.is_initialized():
        return ray
    kwargs = {k: v for k, v in dict(config.ray_kwargs.get("ray_init") or {}).items() if v is not None}
    runtime_env = {k: v for k, v in dict(kwargs.pop("runtime_env", None) or {}).items() if v is not None}
    if runtime_env:
        kwargs["runtime_env"] = runtime_env
    local = kwargs.get("address") is None and not os.environ.get("RAY_ADDRESS")
    if not local:
        check_cluster_answers(kwargs.get("address"))
    started = _started_cluster() if local else None
    if started and _answers(started):
        # ray.init() joins the cluster `ray start` left its address for, and refuses num_cpus then
        logger.warning("trainer.backend=ray: joining the Ray cluster started on this machine (%s; `ray stop` "
                       "ends it, RAY_ADDRESS or ray_kwargs.ray_init.address names another)", started)
        local = False
    elif started:
        # a cluster that ended without `ray stop` (killed, a reboot): ray.init() would wait for it (more
        # than 5 minutes here, with no output); start a Ray of our own instead
        logger.warning("trainer.backend=ray: the Ray cluster last started on this machine (%s) does not answer; "
                       "starting a local Ray (`ray stop` removes the stale address)", started)
        kwargs["address"] = "local"
    if local:
        # Room for every rank of every pool (a CPU each), even on a machine with fewer cores.
        kwargs.setdefault("num_cpus", max(os.cpu_count() or 1, total_ranks))
        kwargs.setdefault("include_dashboard", False)
    kwargs.setdefault("log_to_driver", True)
    kwargs.setdefault("logging_level", logging.WARNING)
    ray.init(**kwargs)
    return ray


def check_cluster_answers(address: str | None, timeout_s: float = 3.0) -> None:
    """A cluster named by host:port (``ray_kwargs.ray_init.address``, else RAY_ADDRESS) must answer there
    within seconds: ray.init() would retry a silent address for minutes. ``auto`` and ``local`` are
    Ray's own words, left to it."""
    key = "ray_kwargs.ray_init.address" if address is not None else "RAY_ADDRESS"
    address = address if address is not None else os.environ.get("RAY_ADDRESS", "")
    target = address.split("://", 1)[-1].rstrip("/")
    if address in ("auto", "local") or ":" not in target:
        return
    if not _answers(target, timeout_s):
        raise VerlError(f"trainer.backend=ray: no Ray cluster answers at {address} (from {key}) within {timeout_s:g} s; "
                        f"start one there (`ray start --head --port={target.rpartition(':')[2]}` on that machine), "
                        f"correct the address, or unset it to start a local Ray")


def _started_cluster() -> str | None:
    """The address of the cluster `ray start` started on this machine (Ray keeps it in
    /tmp/ray/ray_current_cluster until `ray stop`), which a plain ``ray.init()`` joins; None if none."""
    try:
        from ray._private.services import find_bootstrap_address
    except ImportError:  # a Ray without it: ray.init() decides alone
        return None
    return find_bootstrap_address(None)


def _answers(address: str, timeout_s: float = 2.0) -> bool:
    """Whether something listens at ``host:port`` (the cluster's GCS)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def _place_on_ray(config, *, total_steps: int, reward_worker, teachers) -> Roles:
    from verl.distributed.ray_pool import PoolSpec, RayResourcePool
    from verl.models.loading import resolve_device

    specs = pool_specs(config)
    placed = role_mapping(config, specs)
    used = {pool for pool in placed.values() if pool is not None}
    for name in specs:
        if name not in used:
            logger.warning("Ray pool %s has no role mapped to it and is not started (trainer.role_pools)", name)
    total_ranks = sum(sum(specs[name]) for name in used)
    if config.async_training.enable and config.async_training.rollout_placement == "ranks":
        total_ranks += config.rollout.nnodes * config.rollout.n_gpus_per_node  # the rollout's own pool
    use_gpu = resolve_device(config.trainer.device).type == "cuda"
    init_ray(config, total_ranks)
    threads = max(1, (os.cpu_count() or 1) // total_ranks)
    pools = {}
    result = Roles(actor_rollout_ref=None, reward=None)  # type: ignore[arg-type]
    try:
        for name in [n for n in specs if n in used]:
            spec = PoolSpec(name, specs[name], roles=[r for r, p in placed.items() if p == name])
            pools[name] = RayResourcePool(spec, use_gpu=use_gpu, seed=config.trainer.seed,
                                          timeout_s=config.trainer.dist_timeout_s, threads=threads)
            result.pools.append(pools[name])
            print(f"Ray pool {name} ({', '.join(spec.roles)}): {pools[name].layout()}", flush=True)
        # The order in which roles are built on a pool is the order a single process builds them in.
        def build(role: str, **kwargs):
            return pools[placed[role]].build(role, roles.ROLE_FACTORIES[role], config, **kwargs)

        result.actor_rollout_ref = build("actor_rollout_ref", total_steps=total_steps)
        if "critic" in placed:
            result.critic = build("critic", total_steps=total_steps)
        if "teacher" in placed:
            result.teacher = build("teacher")
        if placed["reward"] is None:
            result.reward = LocalWorkerGroup(reward_worker or roles.reward_worker(config), "reward")
        else:
            result.reward = build("reward")
    except BaseException:
        result.shutdown()
        raise
    return result
