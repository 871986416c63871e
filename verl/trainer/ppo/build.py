"""Builds everything ``RLTrainer`` needs from a ``TrainerConfig``: data, workers, reward, logger.

Every check that can fail on user input runs here, before any training, so bad input costs
seconds, not a crashed run.
"""

from __future__ import annotations

import hashlib
import logging
import random
from pathlib import Path

import numpy as np
import torch

from verl.algorithms import (ADV_ESTIMATORS, KL_KINDS, NOT_IMPLEMENTED_ESTIMATORS, NOT_IMPLEMENTED_LOSSES,
                             POLICY_LOSSES)
from verl.algorithms.rollout_correction import rollout_correction_of
from verl.config.errors import ConfigError, check_choice
from verl.data import PromptLoader, collate_prompts, create_rl_dataset, write_parquet
from verl.data.tasks import TASKS
from verl.distributed.fsdp import parallelize
from verl.distributed.process_group import (ensure_process_group, is_main_process, launched_distributed,
                                            launched_world_size, world_size)
from verl.distributed.watchdog import Watchdog
from verl.distributed.worker_group import make_worker_group
from verl.errors import VerlError
from verl.models.loading import load_causal_lm, load_tokenizer
from verl.models.tiny import builtin_model_path
from verl.models.value_model import ValueModel
from verl.rewards.manager import RuleRewardManager, build_reward_functions
from verl.rollout import OTHER_ENGINES, ROLLOUT_NAMES
from verl.tracking import Tracker
from verl.trainer.ppo import distillation
from verl.trainer.ppo.rl_trainer import RLTrainer
from verl.utils.cache import cache_dir
from verl.utils.checks import check_context_length
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.critic import Critic
from verl.workers.reward import RewardWorker

logger = logging.getLogger(__name__)



def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def builtin_task_files(task_name: str) -> tuple[str, str]:
    """Parquet files (train, test) of a built-in task, written to the cache once."""
    if task_name not in TASKS:
        raise VerlError(f"unknown built-in task {task_name!r} (data.builtin_task); choose one of {sorted(TASKS)}")
    task = TASKS[task_name]
    # Keyed by the generator's source, so an edited generator never serves stale cached rows.
    source = Path(task.__file__).read_bytes()
    folder = cache_dir("data", f"{task_name}-{hashlib.sha1(source).hexdigest()[:10]}")
    paths = []
    for split in ("train", "test"):
        path = folder / f"{split}.parquet"
        if not path.exists():
            tmp = folder / f".{split}.parquet.tmp"
            write_parquet(task.make_rows(split), tmp)
            tmp.replace(path)
        paths.append(str(path))
    return paths[0], paths[1]


def _dataset(files, tokenizer, data_cfg, config_key: str):
    """RLDataset, or the user's class of data.custom_cls (for validation as for training, as in verl)."""
    return create_rl_dataset(files, tokenizer, data_cfg, config_key=config_key)


def _val_batches(dataset, batch_size: int | None, pad_token_id: int):
    items = [dataset[i] for i in range(len(dataset))]
    size = batch_size or len(items)
    return [collate_prompts(items[i:i + size], pad_token_id) for i in range(0, len(items), size)]


def check_algorithm_names(config) -> None:
    """Every algorithm and engine picked by name exists (the config layer does not know the tables);
    called before anything is loaded."""
    actor, algo = config.actor_rollout_ref.actor, config.algorithm
    check_choice("algorithm.adv_estimator", algo.adv_estimator, list(ADV_ESTIMATORS), "advantage estimator",
                 NOT_IMPLEMENTED_ESTIMATORS)
    check_choice("actor_rollout_ref.actor.policy_loss.loss_mode", actor.policy_loss.loss_mode,
                 list(POLICY_LOSSES), "policy loss", NOT_IMPLEMENTED_LOSSES)
    check_choice("actor_rollout_ref.rollout.name", config.actor_rollout_ref.rollout.name, ROLLOUT_NAMES,
                 "rollout engine", OTHER_ENGINES)
    check_choice("actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type, KL_KINDS, "KL estimator")
    check_choice("algorithm.kl_penalty", algo.kl_penalty, KL_KINDS, "KL estimator")
    if algo.adv_estimator == "gdpo":
        check_gdpo(algo)


def check_gdpo(algo) -> None:
    """GDPO's settings agree with each other; whether the reward function returns the keys is known
    only at the first step (see ``verl.trainer.ppo.core.gdpo_reward_components``)."""
    keys, weights = algo.gdpo_reward_keys, algo.gdpo_reward_weights
    if not keys:
        raise ConfigError("algorithm.adv_estimator=gdpo normalises each reward component apart and needs their "
                          "names: set algorithm.gdpo_reward_keys to keys your reward function returns in its dict "
                          "beside \"score\", e.g. 'algorithm.gdpo_reward_keys=[accuracy_reward,format_reward]'")
    if weights is not None and len(weights) != len(keys):
        raise ConfigError(f"algorithm.gdpo_reward_weights has {len(weights)} weights for {len(keys)} "
                          f"algorithm.gdpo_reward_keys ({', '.join(keys)}); give one weight per key, or null for all 1")
    if algo.use_kl_in_reward:
        raise ConfigError("algorithm.use_kl_in_reward=true has no effect with algorithm.adv_estimator=gdpo: GDPO "
                          "builds its advantages from the reward components alone, not from the penalised reward; "
                          "use actor_rollout_ref.actor.use_kl_loss=true for a KL term instead")


def _reward_worker(config, tokenizer) -> RewardWorker:
    """Rule reward functions (custom_reward_function + reward.functions, else the built-in scorer of
    each row's data source) plus, with reward_model.enable, a learned reward model."""
    custom, reward_cfg, rm_cfg = config.custom_reward_function, config.reward, config.reward_model
    functions = build_reward_functions(list(reward_cfg.functions), custom.path, custom.name,
                                       dict(custom.reward_kwargs))
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


def build_rl_trainer(config) -> RLTrainer:
    """The trainer of ``config``, its roles placed by how this process was launched: in this
    process (plain ``python``), or as this rank's share of a torchrun job (every rank builds)."""
    # The data-parallel size is the job's: torchrun's world size, else what the config declares.
    config.validate(dp_size=launched_world_size() if launched_distributed() else None)
    check_algorithm_names(config)
    # Under torchrun: collectives time out a minute after the watchdog would report a lost rank.
    ensure_process_group(timeout_s=config.trainer.dist_timeout_s)
    watchdog = Watchdog.start(config.trainer.dist_timeout_s)  # inert in one process
    with watchdog.stage("build"):
        return _build_rl_trainer(config, watchdog)


def check_output_dir(path: Path, key: str) -> None:
    """Create the run's output folder and write a probe file in it, so a folder that cannot be written
    fails now, naming ``key``, rather than at the first checkpoint."""
    probe = path / ".verl-write-check"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise VerlError(f"{key}={path}: the output folder cannot be created or written ({type(e).__name__}: "
                        f"{e.strerror or e}); choose a folder you can write, e.g. {key}=outputs/run") from None


def _build_rl_trainer(config, watchdog: Watchdog) -> RLTrainer:
    seed_everything(config.trainer.seed)
    data_cfg, arr_cfg, trainer_cfg = config.data, config.actor_rollout_ref, config.trainer
    out_dir = Path(trainer_cfg.default_local_dir)
    if is_main_process():
        check_output_dir(out_dir, "trainer.default_local_dir")  # before any model loads

    train_files, val_files = data_cfg.train_files, data_cfg.val_files
    if train_files is None:
        train_files, builtin_val = builtin_task_files(data_cfg.builtin_task)
        val_files = val_files if val_files is not None else builtin_val
    model_path = str(arr_cfg.model.path) if arr_cfg.model.path else str(builtin_model_path())
    tokenizer = load_tokenizer(arr_cfg.model.tokenizer_path or model_path,
                               trust_remote_code=arr_cfg.model.trust_remote_code,
                               chat_template=arr_cfg.model.custom_chat_template)
    teachers = None
    if config.distillation.enabled:  # checked before any model loads: a wrong teacher costs seconds
        teachers = distillation.resolve_teachers(config.distillation)
        distillation.check_tokenizers(tokenizer, model_path, teachers, arr_cfg.model.trust_remote_code)
    reward_worker = _reward_worker(config, tokenizer)

    train_set = _dataset(train_files, tokenizer, data_cfg, "data.train_files")
    val_batches = []
    validating = trainer_cfg.val_before_train or trainer_cfg.test_freq > 0
    if val_files is not None and not validating:
        logger.info("validation is off (trainer.test_freq <= 0, val_before_train=false): %s not read", val_files)
    elif val_files is not None:
        val_set = _dataset(val_files, tokenizer, data_cfg, "data.val_files")
        val_batches = _val_batches(val_set, data_cfg.val_batch_size, tokenizer.pad_token_id)
    loader = PromptLoader(train_set, data_cfg.train_batch_size, shuffle=data_cfg.shuffle,
                          seed=data_cfg.seed if data_cfg.seed is not None else trainer_cfg.seed,
                          pad_token_id=tokenizer.pad_token_id)
    total_steps = trainer_cfg.total_training_steps or trainer_cfg.total_epochs * len(loader)

    use_ref = arr_cfg.actor.use_kl_loss or config.algorithm.use_kl_in_reward
    worker = ActorRolloutRefWorker(arr_cfg, tokenizer=tokenizer, with_ref=use_ref, device=trainer_cfg.device,
                                   max_response_length=data_cfg.max_response_length, total_steps=total_steps,
                                   seed=trainer_cfg.seed,
                                   rollout_correction=rollout_correction_of(arr_cfg.actor,
                                                                            config.algorithm.rollout_correction))
    check_context_length(worker.actor_model.config, data_cfg.max_prompt_length, data_cfg.max_response_length)
    critic = None
    if config.critic_enabled():
        critic_cfg = config.critic
        critic_path = str(critic_cfg.model.path) if critic_cfg.model.path else model_path
        value_model = ValueModel(load_causal_lm(critic_path, dtype=arr_cfg.model.dtype,
                                                trust_remote_code=critic_cfg.model.trust_remote_code,
                                                override_config=dict(critic_cfg.model.override_config),
                                                disable_dropout=arr_cfg.model.disable_dropout,
                                                config_key="critic.model.path"))
        if critic_cfg.model.enable_gradient_checkpointing:
            value_model.model.gradient_checkpointing_enable()
        sizes = config.derived_sizes(dp_size=world_size(), role="critic")
        value_model = parallelize(value_model, critic_cfg.fsdp_config, device=worker.device)
        critic = make_worker_group(Critic(value_model, critic_cfg, worker.device,
                                          samples_per_mini_batch=sizes["samples_per_mini_batch_per_rank"],
                                          ppo_epochs=sizes["ppo_epochs"], total_steps=total_steps,
                                          seed=trainer_cfg.seed, norm_len=data_cfg.max_response_length,
                                          micro_batch_size=sizes["samples_per_micro_batch"]),
                                   "critic", watchdog)
    teacher = distillation.build_teacher_group(config, teachers, worker.device, watchdog) if teachers else None
    reward = make_worker_group(reward_worker, "reward", watchdog)
    if is_main_process():
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.yaml").write_text(config.to_yaml())
    tracker = Tracker.from_config(config, out_dir, record=is_main_process())
    return RLTrainer(config, actor_rollout_ref=make_worker_group(worker, "actor_rollout_ref", watchdog), critic=critic,
                     reward=reward, train_loader=loader, val_batches=val_batches, tracker=tracker,
                     out_dir=out_dir, total_steps=total_steps, use_ref=use_ref, watchdog=watchdog,
                     teacher=teacher, distillation=distillation.loss_settings(config))
