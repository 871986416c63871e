"""verl's V1 trainer modes (``trainer.v1.trainer_mode``, read with verl's default ``trainer.use_v1=true``),
run by this project's asynchronous RL (docs/async.md, "verl's V1 trainer modes").

* ``sync``: the synchronous RL step.
* ``colocate_async``: the rollout runs ahead on the trainer's devices, ``num_warmup_batches`` steps ahead
  (at most ``sampler.max_off_policy_threshold``), with partial rollouts (V1's async client resumes
  interrupted trajectories under new weights): ``async_training`` with ``rollout_placement=process``.
* ``separate_async``: the rollout on devices of its own, ``actor_rollout_ref.rollout.nnodes x
  n_gpus_per_node`` (``rollout_placement=ranks``: the last ranks of a torchrun job, or Ray actors); a step
  is one weight sync, ``parameter_sync_step`` mini-batches (verl requires ``data.train_batch_size =
  parameter_sync_step x ppo_mini_batch_size``); a checkpoint engine other than ``naive`` (verl's nccl,
  nixl, mooncake) is the ``broadcast`` backend here.

Staleness: the rollout is never let ahead of the bound, so no sample reaches ``max_off_policy_threshold``
and verl's ``drop`` and ``wait`` strategies train the same samples. What was made of each key is said
at start.
"""

from __future__ import annotations

import logging
import weakref

from verl.distributed.process_group import is_main_process
from verl.errors import ConfigError

logger = logging.getLogger("verl.trainer")

_APPLIED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def apply_v1_mode(config) -> list[str]:
    """Set ``async_training`` (and the rollout's resources) from ``trainer.v1``, once per config; print and
    return the lines that say so (none for ``sync``)."""
    if _APPLIED.get(id(config)) is config:
        return []
    _APPLIED[id(config)] = config
    trainer = config.trainer
    mode = trainer.v1.trainer_mode
    if mode == "sync":
        return []
    if not trainer.use_v1:
        logger.warning("trainer.v1.trainer_mode=%s has no effect with trainer.use_v1=false (verl's legacy loop, "
                       "synchronous, does not read trainer.v1): the run is synchronous; set trainer.use_v1=true",
                       mode)
        return []
    v1, a = trainer.v1, config.async_training
    settings = v1.colocate_async if mode == "colocate_async" else v1.separate_async
    threshold = v1.sampler.max_off_policy_threshold
    ahead = min(settings.num_warmup_batches, threshold)
    said = [f"verl's V1 trainer_mode={mode}: asynchronous RL (async_training), the rollout "
            + ("on the trainer's devices" if mode == "colocate_async" else "on devices of its own")
            + f", {ahead} step(s) ahead (num_warmup_batches={settings.num_warmup_batches}, "
              f"max_off_policy_threshold={threshold}), "
            + "with partial rollouts"]
    a.enable, a.partial_rollout = True, True
    if a.max_staleness is None:
        a.max_staleness = ahead
    if mode == "separate_async":
        said += _separate(config, settings)
    if v1.sampler.max_off_policy_strategy == "drop":
        said.append("trainer.v1.sampler.max_off_policy_strategy=drop: the rollout never runs past the bound here, so "
                    "no sample reaches the threshold and none is dropped (the samples of strategy=wait)")
    if is_main_process():
        print("\n".join(said), flush=True)
    return said


def _separate(config, settings) -> list[str]:
    rollout, a = config.actor_rollout_ref.rollout, config.async_training
    if not rollout.nnodes or not rollout.n_gpus_per_node:
        raise ConfigError(f"trainer.v1.trainer_mode=separate_async runs the rollout on devices of its own, and "
                          f"actor_rollout_ref.rollout.nnodes={rollout.nnodes}, n_gpus_per_node="
                          f"{rollout.n_gpus_per_node} gives it none: set both (e.g. 1 and 2), as verl's separate_async "
                          f"does, or use trainer.v1.trainer_mode=colocate_async")
    mini = config.actor_rollout_ref.actor.ppo_mini_batch_size
    steps = settings.parameter_sync_step
    if config.data.train_batch_size != steps * mini:
        raise ConfigError(f"trainer.v1.trainer_mode=separate_async: data.train_batch_size={config.data.train_batch_size} "
                          f"must be trainer.v1.separate_async.parameter_sync_step={steps} x "
                          f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} = {steps * mini} (verl's invariant: a "
                          f"step is one weight sync's mini-batches); set one of the three to match")
    config.rollout.nnodes, config.rollout.n_gpus_per_node = rollout.nnodes, rollout.n_gpus_per_node
    rollout.nnodes, rollout.n_gpus_per_node = 0, None  # moved: the rollout's own pool is read from there
    a.rollout_placement, a.trigger_parameter_sync_step = "ranks", 1
    said = [f"  the rollout's devices: actor_rollout_ref.rollout.nnodes={config.rollout.nnodes} x n_gpus_per_node="
            f"{config.rollout.n_gpus_per_node} (async_training.rollout_placement=ranks); a step is one weight sync, "
            f"parameter_sync_step={steps} mini-batches of {mini}"]
    backend = (rollout.checkpoint_engine or {}).get("backend") or "naive"
    if backend != "naive" and a.checkpoint_engine.backend == "auto":
        a.checkpoint_engine.backend = "broadcast"
        said.append(f"  actor_rollout_ref.rollout.checkpoint_engine.backend={backend}: the weights go by "
                    f"torch.distributed broadcast (async_training.checkpoint_engine.backend=broadcast; gloo, through "
                    f"host memory here)")
    return said
