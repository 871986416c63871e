"""The role workers of an RL run, built from a ``TrainerConfig`` in the process that will hold them.

One place builds each role, so that the three placements build the same thing: a plain process
(every role here), each rank of a torchrun job, and each Ray actor of a resource pool
(:mod:`verl.distributed.ray_pool`, which gets the factory of :data:`ROLE_FACTORIES` from the placement
and calls it inside the actor).
Every factory takes the config plus plain keyword arguments, so the call can cross a process
boundary as the config and a few numbers.
"""

from __future__ import annotations

import logging

import torch

from verl.config.compat import reward_manager_call_kwargs
from verl.algorithms.rollout_correction import rollout_correction_of
from verl.distributed.fsdp import parallelize
from verl.distributed.process_group import world_size
from verl.models.loading import load_causal_lm, load_tokenizer, resolve_device
from verl.models.lora import lora_requested
from verl.models.value_model import ValueModel
from verl.rewards.manager import RuleRewardManager, build_reward_functions
from verl.utils.preflight import check_context_length
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker, policy_folder
from verl.workers.critic import Critic
from verl.workers.reward import RewardWorker

logger = logging.getLogger(__name__)


def policy_path(config) -> str:
    """The policy's model folder or hub id (the built-in tiny model when none is set)."""
    return policy_folder(config.actor_rollout_ref.model)


def policy_config(config):
    """The policy's model config as the actor builds it (the built-in tiny model when no path is
    set), with the loader's clear errors for a missing folder or an unknown hub id; no weights read."""
    return _model_config(config.actor_rollout_ref.model, policy_path(config), "actor_rollout_ref.model.path")


def critic_config(config):
    """The critic's model config (``critic.model.path``, the policy's when unset) as :func:`value_critic` loads
    it, with the same clear errors; no weights read."""
    model = config.critic.model
    return _model_config(model, str(model.path) if model.path else policy_path(config), "critic.model.path")


def _model_config(model, path: str, config_key: str):
    """``path``'s model config with ``model``'s (a model section's) trust_remote_code and override_config."""
    from verl.models.loading import hub_access, load_causal_lm_config

    local = bool(hub_access(path, "model", config_key).get("local_files_only"))
    return load_causal_lm_config(path, trust_remote_code=model.trust_remote_code,
                                 override_config=dict(model.override_config), local_files_only=local,
                                 config_key=config_key)


def resolve_rollout_engine(config, model_config=None) -> str:
    """``actor_rollout_ref.rollout.name=auto`` made the engine it stands for (from the policy's
    architecture), said once at start; a named engine is kept. Returns the engine."""
    from verl.distributed.process_group import is_main_process
    from verl.rollout import auto_engine

    rollout = config.actor_rollout_ref.rollout
    if rollout.name == "auto":
        model_type = (model_config if model_config is not None else policy_config(config)).model_type
        engine, why = auto_engine(model_type)
        rollout.name = engine
        if is_main_process():
            print(f"Rollout engine: {engine} (actor_rollout_ref.rollout.name=auto: {why}; name hf, native or vllm "
                  f"to choose)", flush=True)
    if rollout.name != "vllm" and rollout.tensor_model_parallel_size > 1 and is_main_process():
        logger.warning("actor_rollout_ref.rollout.tensor_model_parallel_size=%d has no effect with the %s engine: it "
                       "splits a vLLM engine's model over that many GPUs, and %s holds the whole model on every "
                       "rank. Set actor_rollout_ref.rollout.name=vllm to split it, or the size to 1",
                       rollout.tensor_model_parallel_size, rollout.name, rollout.name)
    return rollout.name


def policy_tokenizer(config):
    model = config.actor_rollout_ref.model
    return load_tokenizer(model.tokenizer_path or policy_path(config), trust_remote_code=model.trust_remote_code,
                          chat_template=model.custom_chat_template)


def uses_reference(config) -> bool:
    return bool(config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward)


def trainer_generates(config) -> bool:
    """Whether the trainer's own worker generates: not in an asynchronous run whose rollout also validates
    (``async_training.use_trainer_do_validate=false``), where every sample comes from the rollout."""
    a = config.async_training
    return not (a.enable and not a.use_trainer_do_validate)


def actor_rollout_ref_worker(config, *, total_steps: int, tokenizer=None) -> ActorRolloutRefWorker:
    """Actor, rollout and (when a KL term needs it) reference, in one worker: the hybrid engine."""
    arr = config.actor_rollout_ref
    worker = ActorRolloutRefWorker(arr, tokenizer=tokenizer or policy_tokenizer(config), with_ref=uses_reference(config),
                                   device=config.trainer.device, max_response_length=config.data.max_response_length,
                                   total_steps=total_steps, seed=config.trainer.seed,
                                   rollout_correction=rollout_correction_of(arr.actor,
                                                                            config.algorithm.rollout_correction),
                                   generates=trainer_generates(config))
    check_context_length(worker.actor_model.config, config.data.max_prompt_length, config.data.max_response_length)
    return worker


def critic_worker(config, *, total_steps: int, device: torch.device | str | None = None) -> Critic:
    """The value model (a causal LM with a zero-initialised value head), sharded over this group's ranks."""
    critic_cfg, arr_cfg = config.critic, config.actor_rollout_ref
    sizes = config.derived_sizes(dp_size=world_size(), role="critic")
    return value_critic(critic_cfg, str(critic_cfg.model.path) if critic_cfg.model.path else policy_path(config),
                        device=resolve_device(device or config.trainer.device), dtype=arr_cfg.model.dtype,
                        disable_dropout=arr_cfg.model.disable_dropout,
                        samples_per_mini_batch=sizes["samples_per_mini_batch_per_rank"],
                        ppo_epochs=sizes["ppo_epochs"], total_steps=total_steps, seed=config.trainer.seed,
                        norm_len=config.data.max_response_length, micro_batch_size=sizes["samples_per_micro_batch"])


def value_critic(critic_cfg, path: str, *, device: torch.device, dtype: str, disable_dropout: bool,
                 samples_per_mini_batch: int, ppo_epochs: int, total_steps: int | None, seed: int = 0,
                 norm_len: int | None = None, micro_batch_size: int | None = None,
                 config_key: str = "critic.model.path") -> Critic:
    """A :class:`Critic` over the causal LM at ``path`` with a zero-initialised value head, as the
    ``critic`` section ``critic_cfg`` describes it: the one place a critic is built (the RL run's
    :func:`critic_worker` and the tutorial's ``PPOTrainer``). ``config_key`` names ``path``'s setting in
    errors."""
    value_model = ValueModel(load_causal_lm(path, dtype=dtype, trust_remote_code=critic_cfg.model.trust_remote_code,
                                            override_config=dict(critic_cfg.model.override_config),
                                            disable_dropout=disable_dropout, config_key=config_key,
                                            missing_ok=("lm_head",)))  # the value head replaces it
    if critic_cfg.model.enable_gradient_checkpointing:
        value_model.model.gradient_checkpointing_enable()
    if lora_requested(critic_cfg.model):
        value_model.use_lora(critic_cfg.model)
    value_model = parallelize(value_model, critic_cfg.fsdp_config, device=device)
    return Critic(value_model, critic_cfg, device, samples_per_mini_batch=samples_per_mini_batch,
                  ppo_epochs=ppo_epochs, total_steps=total_steps, seed=seed, norm_len=norm_len,
                  micro_batch_size=micro_batch_size)


def reward_worker(config, *, tokenizer=None) -> RewardWorker:
    """Rule reward functions (custom_reward_function + reward.functions, else the built-in scorer of
    each row's data source) plus, with reward_model.enable, a learned reward model."""
    tokenizer = tokenizer or policy_tokenizer(config)
    custom, reward_cfg, rm_cfg = config.custom_reward_function, config.reward, config.reward_model
    functions = build_reward_functions(list(reward_cfg.functions), custom.path, custom.name,
                                       reward_manager_call_kwargs(config), rm_cfg.reward_manager)
    manager = None
    if functions or not rm_cfg.enable:
        manager = RuleRewardManager(tokenizer, functions=functions, reward_fn_key=config.data.reward_fn_key,
                                    on_error=reward_cfg.on_error, max_concurrency=reward_cfg.max_concurrency)
    reward_model = None
    if rm_cfg.enable:
        from verl.workers.reward_model import RewardModelWorker

        # trainer.device resolves here as it does for the actor, so both sit on the same device.
        reward_model = RewardModelWorker(
            rm_cfg, config.trainer.device, policy_tokenizer=tokenizer, dtype=config.actor_rollout_ref.model.dtype,
            default_max_length=config.data.max_prompt_length + config.data.max_response_length)
    return RewardWorker(manager, reward_model, rm_cfg.weight)


def teacher_worker(config, *, device: torch.device | str | None = None):
    """The frozen teachers of on-policy distillation, sharded like the reference."""
    from verl.trainer.ppo import distillation

    teachers = distillation.resolve_teachers(config.distillation)
    return distillation.teacher_worker(config, teachers, resolve_device(device or config.trainer.device))


ROLE_FACTORIES = {"actor_rollout_ref": actor_rollout_ref_worker, "critic": critic_worker,
                  "reward": reward_worker, "teacher": teacher_worker}
"""Role name -> factory(config, **kwargs): what a Ray actor calls to build the role it hosts."""
