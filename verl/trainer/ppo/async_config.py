"""The configuration side of asynchronous RL (``async_training``, docs/async.md): what is checked and
set before anything loads (:func:`prepare_async_config`), and the sizes derived from it: how many
processes generate, their threads, and the prompts of a step sent one version early."""

from __future__ import annotations

import math
import os

import torch

from verl.errors import ConfigError


def prepare_async_config(config) -> list[str]:
    """Check ``async_training`` against the rest of the config and set what stale samples need
    (the rollout's log-probs, the correction); returns the lines that say what was set."""
    a = config.async_training
    bound, k = a.staleness_bound(), a.trigger_parameter_sync_step
    if bound < k - 1:
        raise ConfigError(f"async_training.max_staleness={bound} with trigger_parameter_sync_step={k}: the weights "
                          f"reach the rollout every {k} steps, so a sample can be {k - 1} versions old before the "
                          f"next sync; set max_staleness >= {k - 1} or lower trigger_parameter_sync_step")
    refused = []
    if a.require_batches != 1:
        refused.append("async_training.require_batches other than 1 (a step takes data.train_batch_size prompts)")
    pool = config.rollout
    processes = rollout_processes(config)
    ranks = a.rollout_placement == "ranks"
    if ranks and config.trainer.backend != "ray" and "VERL_ROLLOUT_RANKS" not in os.environ:
        refused.append("rollout_placement=ranks outside a torchrun job started by python -m verl.trainer.main_ppo (or "
                       "its verl entry points) with room for the rollout's ranks: start it with torchrun "
                       f"--nproc_per_node=T+{processes}, or set async_training.rollout_placement=process")
    if pool.nnodes != 1 and not ranks:
        refused.append(f"rollout.nnodes={pool.nnodes} (the rollout's processes run on the trainer's machine here: set "
                       f"rollout.nnodes=1 and give the pool's size as rollout.n_gpus_per_node)")
    elif processes > 1:
        if a.rollout_placement == "thread":
            refused.append(f"rollout.n_gpus_per_node={processes} with rollout_placement=thread (a thread is one "
                           f"rollout: set rollout_placement=process for a pool)")
        elif a.weight_backend() not in ("shm", "broadcast"):
            refused.append(f"rollout.n_gpus_per_node={processes} with checkpoint_engine.backend="
                           f"{a.checkpoint_engine.backend} (a file is read once, by one process: use shm or broadcast)")
        if processes > config.data.train_batch_size:
            refused.append(f"rollout.n_gpus_per_node={processes} rollout processes for data.train_batch_size="
                           f"{config.data.train_batch_size} prompts a step (each process takes a slice of the "
                           f"prompts: at most {config.data.train_batch_size} processes)")
    if a.stream_samples:
        if config.algorithm.adv_estimator == "remax":
            refused.append("stream_samples=true with algorithm.adv_estimator=remax (each step's greedy baselines are "
                           "asked with its prompts: stream_samples=false)")
        if config.algorithm.filter_groups.enable:
            refused.append("stream_samples=true with algorithm.filter_groups.enable=true (DAPO's refills are asked per "
                           "step: stream_samples=false)")
    rollout = config.actor_rollout_ref.rollout
    if rollout.name not in ("auto", "hf", "native", "vllm"):
        refused.append(f"actor_rollout_ref.rollout.name={rollout.name} (the rollout process runs hf, native or vllm)")
    elif rollout.name == "vllm":
        if a.rollout_placement == "thread":
            refused.append("actor_rollout_ref.rollout.name=vllm with rollout_placement=thread (vLLM's engine runs in "
                           "a process of its own: set rollout_placement=process)")
        if ranks and _on_gpu(config):
            refused.append("actor_rollout_ref.rollout.name=vllm with rollout_placement=ranks on GPUs (not built: each "
                           "rank's engine would take the machine's first GPU; set rollout_placement=process)")
    if refused:
        raise ConfigError("async_training.enable=true does not support " + "; ".join(refused))
    test_freq = config.trainer.test_freq
    if not a.use_trainer_do_validate and k > 1 and test_freq > 0 and test_freq % k:
        raise ConfigError(f"async_training.use_trainer_do_validate=false validates on the rollout, which gets the "
                          f"trainer's weights every trigger_parameter_sync_step={k} steps, and trainer.test_freq="
                          f"{test_freq} validates between two of them: set trainer.test_freq to a multiple of {k} "
                          f"(e.g. {k * math.ceil(test_freq / k)}) or async_training.use_trainer_do_validate=true")
    if ranks and config.trainer.backend == "ray" and a.checkpoint_engine.backend == "auto":
        a.checkpoint_engine.backend = "broadcast"  # Ray may place the rollout's actors on other machines
    if a.checkpoint_engine.backend == "memory" and a.rollout_placement != "thread":
        raise ConfigError(f"async_training.checkpoint_engine.backend=memory hands weights over inside one process; "
                          f"with rollout_placement={a.rollout_placement} use shm, file or broadcast (or auto)")
    if a.checkpoint_engine.backend == "broadcast" and a.rollout_placement == "thread":
        raise ConfigError("async_training.checkpoint_engine.backend=broadcast sends the weights to a rollout process; "
                          "with rollout_placement=thread use memory (or auto)")
    said = []
    if not config.actor_rollout_ref.hybrid_engine:
        # verl's scripts of these modes set it: their rollout is apart; the trainer here may keep one for validation.
        config.actor_rollout_ref.hybrid_engine = True
        said.append("actor_rollout_ref.hybrid_engine=false: the rollout already runs apart (async_training)" +
                    ("; the trainer's validation decodes with its own weights, shared" if a.use_trainer_do_validate
                     else ""))
    if ranks and config.trainer.backend == "ray":
        where = f"{processes} Ray actor(s) of a pool of its own (rollout.nnodes x rollout.n_gpus_per_node)"
    elif ranks:
        where = f"the torchrun job's last {processes} rank(s) (rollout.nnodes x rollout.n_gpus_per_node)"
    elif processes > 1:
        where = f"{processes} processes of its own (rollout.n_gpus_per_node)"
    else:
        where = f"a {a.rollout_placement} of its own"
    whole, _ = a.staleness_split()
    head = head_prompts(config)
    ahead = f"{whole} step(s)" + (f" and the first {head} of the next step's {config.data.train_batch_size} prompts "
                                  f"(async_training.staleness_threshold={a.staleness_threshold})" if head else
                                  " (async_training.max_staleness)")
    said += [f"Asynchronous RL: the rollout runs in {where}, ahead of the trainer by at most {ahead}, weights synced "
             f"every {k} step(s) through {a.weight_backend()}"]
    if a.partial_rollout:
        said.append("partial rollouts: weights published mid-generation are taken at once (the unfinished "
                    "responses go on under them; async_training.partial_rollout=true)")
    if a.stream_samples:
        said.append(f"streaming: a step trains on the first {config.data.train_batch_size} prompts whose samples are "
                    f"all generated, whichever step they were sent with; one older than {bound} version(s) is dropped "
                    f"and sent again (async_training.stream_samples=true)")
    if not a.use_trainer_do_validate:
        said.append("validation: on the rollout, with the trainer's weights at each validation (sent then, if not "
                    "yet), after the requests queued ahead; the trainer holds no engine "
                    "(async_training.use_trainer_do_validate=false)")
    said += _reward_placement_line(config)
    said += _lora_sync_line(config)
    if bound == 0:
        return said  # every sample is on-policy: the synchronous step exactly
    if not a.use_rollout_log_probs and not a.compute_prox_log_prob:
        raise ConfigError(f"async_training.max_staleness={bound} trains on samples up to {bound} versions old, and "
                          f"with use_rollout_log_probs=false and compute_prox_log_prob=false nothing corrects for it: "
                          f"set async_training.use_rollout_log_probs=true (the rollout's log-probs are pi_old) or "
                          f"compute_prox_log_prob=true")
    rollout.calculate_log_probs = True
    correction = config.algorithm.rollout_correction
    if a.compute_prox_log_prob:
        if correction.rollout_is is None:
            correction.rollout_is = "token"
        said.append(f"stale samples: pi_old is recomputed by the trainer (proximal policy), each token weighted by "
                    f"pi_prox / pi_rollout (algorithm.rollout_correction.rollout_is={correction.rollout_is}, "
                    f"threshold {correction.rollout_is_threshold})")
    else:
        correction.bypass_mode = True
        said.append("stale samples: the rollout's log-probs are pi_old of the PPO ratio "
                    "(algorithm.rollout_correction.bypass_mode=true)")
    return said


def _reward_placement_line(config) -> list[str]:
    """Where the rewards are scored (``async_training.reward_placement``, auto resolved), checked and said."""
    a = config.async_training
    model = config.reward_model.enable
    if a.reward_placement == "rollout" and model:
        raise ConfigError("async_training.reward_placement=rollout with reward_model.enable=true: the reward model is "
                          "loaded by the trainer, which scores with it; set reward_placement=trainer (or auto)")
    if a.reward_placement == "auto":
        a.reward_placement = "trainer" if model or a.rollout_placement == "thread" else "rollout"
    if a.reward_placement == "rollout":
        return ["rewards: scored by the rollout as each batch is generated, while the trainer updates "
                "(async_training.reward_placement=rollout)"]
    why = "the reward model is the trainer's" if model else "the rollout is a thread of the trainer" \
        if a.rollout_placement == "thread" else "async_training.reward_placement=trainer"
    return [f"rewards: scored by the trainer at the start of each step ({why})"]


def _lora_sync_line(config) -> list[str]:
    """How a LoRA policy's weights reach the rollout (verl's ``model.lora.merge``), checked and said."""
    from verl.models.lora import lora_requested

    merge = config.actor_rollout_ref.model.lora.get("merge", False)
    if not isinstance(merge, bool):
        raise ConfigError(f"actor_rollout_ref.model.lora.merge={merge!r}: true (the rollout gets merged weights) or "
                          f"false (the adapters alone)")
    if not lora_requested(config.actor_rollout_ref.model):
        return []
    if merge:
        return ["LoRA: the rollout gets the weights with the adapters merged in (actor_rollout_ref.model.lora.merge=true)"]
    return ["LoRA: the rollout gets the adapters alone and merges them into the base weights it got once "
            "(actor_rollout_ref.model.lora.merge=false, verl's default)"]


def rollout_processes(config) -> int:
    """How many processes generate (``rollout.nnodes x rollout.n_gpus_per_node``, verl's rollout pool)."""
    return config.rollout.nnodes * config.rollout.n_gpus_per_node


def _on_gpu(config) -> bool:
    from verl.models.loading import resolve_device

    return resolve_device(config.trainer.device).type == "cuda"


def split_threads(config) -> int | None:
    """Torch threads of each rollout process: ``rollout_threads``, else on a CPU half of this process's
    shared by the rollout's processes (at least one each), while this process's own drop to the rest
    (processes on the same cores each running all of them would run several times slower). None: the
    rollout keeps torch's default (a GPU, or a thread)."""
    a = config.async_training
    if a.rollout_placement != "process":
        return None
    if _on_gpu(config):
        return a.rollout_threads
    total, processes = torch.get_num_threads(), rollout_processes(config)
    each = a.rollout_threads or max(1, total // 2 // processes)
    torch.set_num_threads(max(1, total - each * processes))
    return each


def head_prompts(config) -> int:
    """Prompts of the step after the whole ones that a fractional ``staleness_threshold`` lets the rollout
    generate one version earlier: its fraction of ``data.train_batch_size``, rounded up, at least one per
    rollout process (each takes a slice); 0 without a fractional part."""
    _, part = config.async_training.staleness_split()
    if not part:
        return 0
    prompts = config.data.train_batch_size
    return min(prompts, max(math.ceil(part * prompts - 1e-9), rollout_processes(config)))
