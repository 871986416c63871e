"""The `async_training` section: the rollout in a process of its own, running ahead of the trainer
(verl's one-step-off and fully-async keys; docs/async.md)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Literal

from verl.config.node import option, section
from verl.config.verl_rules import Section, verl_option


@dataclass
class CheckpointEngineConfig(Section):
    """How the trainer's weights reach the rollout process (verl's checkpoint engine)."""

    enable: bool = option(True, help="verl: use the checkpoint engine for weight syncs. Read for compatibility: "
                          "here every sync goes through it (backend below).")
    backend: Literal["auto", "shm", "file", "memory", "broadcast"] = option(
        "auto", help="shm: the weights travel as shared-memory tensors; file: a safetensors file written aside "
        "and renamed into place (folder: trainer.default_local_dir/weight_sync); broadcast: a torch.distributed "
        "(gloo) broadcast over a group of the trainer's rank 0 and the rollout process, one flat buffer per "
        "dtype, sent without waiting; memory: handed over in this process (rollout_placement=thread only); "
        "auto = shm for a process (and for rollout ranks on the trainer's machine), broadcast for rollout ranks on "
        "other machines, memory for a thread.")
    device_buffer_size_M: int = option(4096, bounds=">= 1", help="verl: bucket size of its NCCL sync. Read for "
                                       "compatibility: the weights move whole here (CPU shared memory or a file).")
    overlap_broadcast_and_consume: bool = option(False, help="verl: overlap the broadcast with loading. Read for "
                                                 "compatibility: a sync here is one hand-over.")


@dataclass
class RolloutPoolConfig(Section):
    """verl's top-level `rollout` keys of its asynchronous modes: the rollout's own resources, apart
    from the trainer's (trainer.nnodes x trainer.n_gpus_per_node)."""

    nnodes: int = option(1, bounds=">= 1", help="Nodes of the rollout (async_training.enable only): with "
                         "async_training.rollout_placement=ranks the rollout's ranks (or Ray actors) span this many; "
                         "processes the trainer starts run on its machine: 1.")
    n_gpus_per_node: int = option(1, bounds=">= 1", help="Processes of the rollout (async_training.enable only): "
                                  "each generates a slice of every step's prompts, the answers joined in order. On "
                                  "a CPU they share half the threads; on a GPU they share the trainer's device. At "
                                  "most data.train_batch_size; weights through shm or broadcast.")
    total_rollout_steps: int | None = option(None, bounds=">= 1", help="verl's fully-async mode: prompts to "
                                             "generate in all; its entry point makes it "
                                             "trainer.total_training_steps (docs/async.md). null = the epochs'.")
    total_epochs: int | None = option(None, bounds=">= 1", help="verl's fully-async mode: passes over the prompts; "
                                      "its entry point makes it trainer.total_epochs. null = trainer.total_epochs.")
    test_freq: int | None = option(None, help="verl's fully-async mode: validate every this many weight syncs; its "
                                   "entry point makes it trainer.test_freq. null = trainer.test_freq.")


@dataclass
class AsyncTrainingConfig(Section):
    """Asynchronous RL: the rollout generates the next steps' samples while the trainer updates, each
    sample stamped with the policy version that generated it, at most `max_staleness` versions older
    than the trainer's (docs/async.md)."""

    enable: bool = option(False, help="Run the rollout on its own (a process, or a thread) ahead of the trainer. "
                          "Set by verl's entry points verl.experimental.one_step_off_policy.main_ppo and "
                          "verl.experimental.fully_async_policy.fully_async_main.")
    staleness_threshold: float = option(0.0, bounds=">= 0", help="verl: how far the rollout may run ahead, as a "
                                        "fraction of the samples between two weight syncs: it generates up to "
                                        "trigger_parameter_sync_step - 1 + staleness_threshold x "
                                        "trigger_parameter_sync_step steps ahead, the fractional part as the first "
                                        "prompts of the step after the whole ones (e.g. 0.1: a tenth of each step's "
                                        "prompts one version old). 0 = every step trains on samples of the current "
                                        "weights, as a synchronous run. max_staleness, when given, wins.")
    trigger_parameter_sync_step: int = option(1, bounds=">= 1", help="Send the trainer's weights to the rollout "
                                              "every this many steps.")
    max_staleness: int | None = option(None, bounds=">= 0", help="Most policy versions (trainer steps) a trained "
                                       "sample may be behind the trainer's weights: the rollout waits rather than "
                                       "generate an older one. null = from staleness_threshold (above); must be "
                                       ">= trigger_parameter_sync_step - 1. Like verl V1's max_off_policy_threshold "
                                       "or TRL's max_staleness.")
    require_batches: int = option(1, bounds=">= 1", help="verl: mini-batches the trainer takes at once. Here a step "
                                  "takes data.train_batch_size prompts, as a synchronous one; only 1 is accepted.")
    partial_rollout: bool = option(False, help="verl: weights published while a batch is being generated are "
                                   "taken at once: every row stops at the next decode step (or between the turns "
                                   "of a multi-turn trajectory), the unfinished ones go on under the new weights "
                                   "(prefilled again, sampling seeds continued; vllm: from a seed derived from "
                                   "the row's). Fresher samples; a run is then no longer reproducible (where a "
                                   "swap falls depends on timing). false: a batch is generated on one version "
                                   "from start to end.")
    stream_samples: bool = option(False, help="A step trains on the first data.train_batch_size prompts whose "
                                  "samples are all generated, whichever step's request they came with (verl's "
                                  "fully-async trainer; its entry point sets it), instead of its own step's "
                                  "prompts. A prompt whose samples are older than max_staleness when taken is "
                                  "dropped and sent again (async/dropped). Not reproducible (what finishes first "
                                  "depends on timing), except at max_staleness=0, the synchronous run.")
    continuous_batching: bool = option(True, help="The rollout's native engine decodes the rows of successive "
                                       "requests in one batch: the next steps' rows take the slots of this step's "
                                       "finished ones (at most actor_rollout_ref.rollout.max_num_seqs at once), so "
                                       "a long response no longer holds the next step back. Each row's tokens are "
                                       "the same either way (its prompt, seed and weights decide them). false: one "
                                       "request at a time. hf, vllm and multi-turn agent loops generate a request "
                                       "at a time.")
    use_rollout_log_probs: bool = option(True, help="Behaviour log-probs from the rollout engine: with stale "
                                         "samples (max_staleness > 0) they are pi_old of the PPO ratio (verl's "
                                         "bypass mode), unless compute_prox_log_prob.")
    compute_prox_log_prob: bool = option(False, help="With stale samples: the trainer recomputes pi_old under its "
                                         "current weights (the proximal policy) and the rollout's log-probs weight "
                                         "each token by pi_prox / pi_behaviour, truncated as "
                                         "algorithm.rollout_correction.rollout_is_threshold says (AReaL's decoupled "
                                         "PPO objective).")
    use_trainer_do_validate: bool = option(True, help="verl: who validates. true: the trainer, with an engine of its "
                                           "own; false (verl's fully-async default): the rollout, with the trainer's "
                                           "weights at each validation, while the trainer goes on (trainer.test_freq "
                                           "a multiple of trigger_parameter_sync_step); the trainer then holds no "
                                           "engine (on a GPU, no second vLLM engine).")
    use_dynamic_resource_scheduling: bool = verl_option(
        False, help="verl: hybrid rollout replicas on the trainer's GPUs, generating beside the standalone ones.",
        why="the trainer's devices are not lent to the rollout here", inert=False, refuse_if=bool, when="true",
        instead="set async_training.use_dynamic_resource_scheduling=false (rollout_placement=process generates on "
                "the trainer's devices, ranks on devices of their own)")
    dynamic_schedule_policy: str = verl_option("default", help="verl: the dynamic scheduling policy.",
                                               why="read only with use_dynamic_resource_scheduling, refused here")
    dynamic_schedule_deactivate_ratio: float = verl_option(
        0.3, help="verl: the share of a step's samples after which hybrid replicas stop.",
        why="read only with use_dynamic_resource_scheduling, refused here")
    dynamic_schedule_enable_rebalance: bool = verl_option(
        True, help="verl: move in-flight requests onto newly activated hybrid replicas.",
        why="read only with use_dynamic_resource_scheduling, refused here")
    concurrent_samples_per_replica: int = verl_option(
        16, help="verl: generation requests in flight per rollout server.",
        why="a rollout process takes every request it is sent; actor_rollout_ref.rollout.max_num_seqs bounds the "
            "rows it decodes at once (with the native engine, across requests: async_training.continuous_batching)")
    rollout_placement: Literal["process", "thread", "ranks"] = option(
        "process", help="Where the rollout runs: process (a process of its own: generation and training overlap), "
        "thread (in this process: breakpoints work, for debugging; they overlap only where torch releases the GIL) "
        "or ranks (devices of its own, verl's separate resource pools: under torchrun the job's last rollout.nnodes "
        "x rollout.n_gpus_per_node ranks, so start T + that many; under trainer.backend=ray that many actors in a "
        "pool of their own).")
    reward_placement: Literal["auto", "rollout", "trainer"] = option(
        "auto", help="Where the rewards are scored: rollout (each batch as soon as it is generated, in the rollout's "
        "process, while the trainer updates: verl's fully-async reward loop) or trainer (at the start of its step). "
        "auto: rollout, unless a reward model scores (reward_model.enable: it is loaded by the trainer) or the "
        "rollout is a thread of the trainer's process (rule rewards then run beside training under one GIL).")
    rollout_threads: int | None = option(None, bounds=">= 1", help="Torch threads of a rollout process on a CPU; "
                                         "null = half the cores (the trainer keeps the other half).")
    checkpoint_engine: CheckpointEngineConfig = section(CheckpointEngineConfig, help="verl's checkpoint engine: how "
                                                        "weights reach the rollout.")

    def staleness_split(self) -> tuple[int, float]:
        """How far the rollout may run ahead: whole steps, and the fraction of the step after them whose
        prompts it may generate one version earlier still. ``max_staleness``: that many whole steps.
        Else verl's ``staleness_threshold`` t: the rollout generates up to (1 + t) syncs' worth of samples
        per weight sync, so ``k - 1 + t x k`` steps (k = ``trigger_parameter_sync_step``), whole and part."""
        if self.max_staleness is not None:
            return self.max_staleness, 0.0
        k = self.trigger_parameter_sync_step
        extra = self.staleness_threshold * k
        whole = math.floor(extra + 1e-9)
        part = extra - whole
        return k - 1 + whole, part if part > 1e-9 else 0.0

    def staleness_bound(self) -> int:
        """The most versions a trained sample may lag the trainer (``max_staleness`` or its default:
        :meth:`staleness_split`'s whole steps, plus one for a part step)."""
        whole, part = self.staleness_split()
        return whole + (1 if part else 0)

    def weight_backend(self) -> str:
        """The checkpoint engine's backend, ``auto`` resolved: memory for a thread, shm for a process or the
        rollout ranks of a one-machine torchrun job (torchrun's ``GROUP_WORLD_SIZE``), broadcast across machines."""
        backend = self.checkpoint_engine.backend
        if backend == "auto":
            if self.rollout_placement == "ranks":  # shared memory reaches the ranks of this machine only
                return "shm" if int(os.environ.get("GROUP_WORLD_SIZE", "1")) == 1 else "broadcast"
            return "memory" if self.rollout_placement == "thread" else "shm"
        return backend


# ------------------------------------------------------------------ verl's V1 trainer modes
@dataclass
class V1WarmupConfig(Section):
    """verl V1: ``trainer.v1.colocate_async``."""

    num_warmup_batches: int = option(1, bounds=">= 0", help="verl V1: batches generated before the first training "
                                     "step. Here: steps the rollout runs ahead (async_training.max_staleness, "
                                     "capped by sampler.max_off_policy_threshold).")


@dataclass
class V1SeparateConfig(Section):
    """verl V1: ``trainer.v1.separate_async``."""

    num_warmup_batches: int = option(1, bounds=">= 0", help="verl V1: batches generated before the first training "
                                     "step. Here: steps the rollout runs ahead (async_training.max_staleness, "
                                     "capped by sampler.max_off_policy_threshold).")
    parameter_sync_step: int = option(4, bounds=">= 1", help="verl V1: mini-batch updates between two weight syncs; "
                                      "data.train_batch_size must be parameter_sync_step x ppo_mini_batch_size (a "
                                      "step here is one sync's worth).")
    hybrid_rollout: dict = verl_option(
        {"enable_switch": False, "switch_threshold_ratio": 0.4, "adaptive_switch_threshold": True,
         "switch_threshold_step_up": 0.05, "switch_threshold_step_down": 0.03, "switch_threshold_release_steps": 2,
         "switch_cost_window_size": 3}, help="verl V1: lending the trainer's devices to generation between steps.",
        why="the trainer's devices are not lent to the rollout here", inert=False,
        refuse_if=lambda v: bool(v.get("enable_switch")), when="with enable_switch=true",
        instead="set trainer.v1.separate_async.hybrid_rollout.enable_switch=false", keys=("enable_switch",))


@dataclass
class V1SamplerConfig(Section):
    """verl V1: ``trainer.v1.sampler``, its staleness control."""

    max_off_policy_threshold: int = option(8, bounds=">= 0", help="verl V1: most model versions between a sample's "
                                           "first token and its training. Here it caps the steps the rollout runs "
                                           "ahead (async_training.max_staleness), so no sample is older.")
    max_off_policy_strategy: Literal["drop", "wait"] = option("drop", help="verl V1: what happens to a sample "
                                                              "reaching the threshold. Here the rollout never "
                                                              "generates one (it waits for the bound), so drop and "
                                                              "wait train the same samples.")
    sync_refill_failed_groups: bool = verl_option(False, help="verl V1: refill groups whose rollout failed.",
                                                  why="a failed rollout ends the run here, naming it")
    custom_sampler: dict = verl_option({"path": None, "name": None}, help="verl V1: a sampler class of your own.",
                                       why="the sampler is built in here", inert=False,
                                       refuse_if=lambda v: v.get("path") is not None, when="with a path",
                                       instead="leave trainer.v1.sampler.custom_sampler.path unset",
                                       keys=("path", "name"))
    sampler_kwargs: dict = verl_option({}, help="verl V1: arguments of the custom sampler.",
                                       why="there is no custom sampler here")


@dataclass
class TrainerV1Config(Section):
    """verl's V1 trainer (``trainer.use_v1=true``): its modes run on this project's asynchronous RL
    (docs/async.md, "verl's V1 trainer modes")."""

    trainer_mode: Literal["sync", "colocate_async", "separate_async"] = option(
        "sync", help="verl V1 (with trainer.use_v1=true): sync (the synchronous step), colocate_async (the rollout "
        "runs ahead on the trainer's devices: async_training with rollout_placement=process and partial "
        "rollouts) or separate_async (the rollout on devices of its own, actor_rollout_ref.rollout.nnodes x "
        "n_gpus_per_node: rollout_placement=ranks).")
    sync: dict = verl_option({}, help="verl V1: settings of the sync mode.", why="it has none here")
    colocate_async: V1WarmupConfig = section(V1WarmupConfig, help="verl V1: the colocate_async mode.")
    separate_async: V1SeparateConfig = section(V1SeparateConfig, help="verl V1: the separate_async mode.")
    sampler: V1SamplerConfig = section(V1SamplerConfig, help="verl V1: the staleness control of its async modes.")
