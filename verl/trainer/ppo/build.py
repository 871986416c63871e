"""Builds everything ``RLTrainer`` needs from a ``TrainerConfig``: data, workers, reward, logger.

Every check that can fail on user input runs here, before any training, so bad input costs
seconds, not a crashed run.
"""

from __future__ import annotations

import functools
import logging
import os
import weakref
from pathlib import Path


from verl.algorithms import (ADV_ESTIMATORS, KL_KINDS, NOT_IMPLEMENTED_ESTIMATORS, NOT_IMPLEMENTED_LOSSES,
                             POLICY_LOSSES)
from verl.config.key_errors import check_choice
from verl.data import PromptLoader, collate_prompts, create_rl_dataset, write_parquet
from verl.data.io import files_read_by_both
from verl.data.tasks import TASKS, sources_digest
from verl.errors import ConfigError, VerlError, naming_the_file
from verl.models.loading import check_token_ids
from verl.distributed.process_group import (ensure_process_group, is_main_process, launched_distributed,
                                            launched_world_size)
from verl.distributed.watchdog import Watchdog
from verl.rewards.scorers import check_builtin_rows, warn_rows_without_ground_truth
from verl.trainer.ppo.vision_run import policy_processor, prepare_vision_run
from verl.rollout import OTHER_ENGINES, ROLLOUT_NAMES
from verl.tracking import Tracker
from verl.trainer.ppo import distillation, placement, roles
from verl.trainer.ppo.rl_trainer import RLTrainer
from verl.utils.cache import cache_dir
from verl.utils.seed import seed_everything

logger = logging.getLogger(__name__)



def builtin_task_files(task_name: str) -> tuple[str, str]:
    """Parquet files (train, test) of a built-in task, written to the cache once."""
    if task_name not in TASKS:
        raise VerlError(f"unknown built-in task {task_name!r} (data.builtin_task); choose one of {sorted(TASKS)}")
    task = TASKS[task_name]
    folder = cache_dir("data", f"{task_name}-{sources_digest()[:10]}")  # an edited task: rows made anew
    paths = []
    for split in ("train", "test"):
        path = folder / f"{split}.parquet"
        if not path.exists():  # a name of its own per writer: two runs may build the cache together
            tmp = folder / f".{split}.parquet.{os.getpid()}.tmp"
            write_parquet(task.make_rows(split), tmp)
            tmp.replace(path)
        paths.append(str(path))
    return paths[0], paths[1]


def _dataset(files, tokenizer, data_cfg, config_key: str, tools: list[dict] | None = None, processor=None,
             seed: int | None = None):
    """RLDataset, or the user's class of data.custom_cls (for validation as for training, as in verl).
    ``seed``: trainer.seed, for a data.*_max_samples subset when data.seed is null (as for the shuffling)."""
    return create_rl_dataset(files, tokenizer, data_cfg, config_key=config_key, tools=tools, processor=processor,
                             seed=seed)


def _val_batches(dataset, batch_size: int | None, pad_token_id: int, extra_keys: tuple[str, ...] = ()):
    items = [dataset[i] for i in range(len(dataset))]
    size = batch_size or len(items)
    return [collate_prompts(items[i:i + size], pad_token_id, extra_keys) for i in range(0, len(items), size)]


def _reward_key_columns(data_cfg) -> tuple[str, ...]:
    """The column data.reward_fn_key names, carried in every batch beside data_source."""
    return () if data_cfg.reward_fn_key == "data_source" else (data_cfg.reward_fn_key,)


def uses_builtin_scorers(config) -> bool:
    """Rows are trained on the score of their data source's built-in scorer: no reward function, no
    reward model, and not a distillation whose loss leaves the task rewards out (they are only logged)."""
    distilled_only = config.distillation.enabled and not config.distillation.distillation_loss.use_task_rewards
    return not (config.custom_reward_function.path or config.reward.functions or config.reward_model.enable
                or distilled_only)


def _batch_rows(batch, reward_fn_key: str) -> list[dict]:
    keys = [k for k in dict.fromkeys(("data_source", reward_fn_key, "ground_truth", "index")) if k in batch.non_tensors]
    return [{k: batch.non_tensors[k][i] for k in keys} for i in range(len(batch))]


# Algorithms asked for by name as the estimator: each is an estimator with other settings, and said so
# (a did-you-mean would "correct" ppo to grpo and dapo to gdpo, other algorithms).
ALGORITHMS_NOT_ESTIMATORS = {
    "ppo": "PPO's estimator is gae (advantages from a critic, which gae trains): algorithm.adv_estimator=gae",
    "dapo": "DAPO is grpo with its extras: algorithm.adv_estimator=grpo algorithm.filter_groups.enable=true "
            "actor_rollout_ref.actor.clip_ratio_high=0.28 (docs/algorithms.md)",
    "dr_grpo": "Dr. GRPO is grpo without the std: algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=false "
               "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
    "gspo": "GSPO is a policy loss: algorithm.adv_estimator=grpo actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
}


def check_algorithm_names(config) -> None:
    """Every algorithm and engine picked by name exists (the config layer does not know the tables);
    called before anything is loaded."""
    actor, algo = config.actor_rollout_ref.actor, config.algorithm
    check_choice("algorithm.adv_estimator", algo.adv_estimator, list(ADV_ESTIMATORS), "advantage estimator",
                 {**NOT_IMPLEMENTED_ESTIMATORS, **ALGORITHMS_NOT_ESTIMATORS})
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


def build_rl_trainer(config) -> RLTrainer:
    """The trainer of ``config``, its roles placed by ``trainer.backend`` and how this process was
    launched: in this process (plain ``python``), as this rank's share of a torchrun job (every rank
    builds), or on Ray resource pools driven from here (``trainer.backend=ray``)."""
    if placement.uses_ray(config) and launched_distributed():
        raise ConfigError("trainer.backend=ray under torchrun: Ray places the ranks itself; start the driver with "
                          "plain python (python -m verl.trainer.main_ppo trainer.backend=ray ...), or leave "
                          "trainer.backend=auto to run under torchrun")
    from verl.trainer.ppo.v1_modes import apply_v1_mode

    apply_v1_mode(config)  # verl's trainer.v1.trainer_mode (main_ppo has applied it already)
    # The data-parallel size is the job's: torchrun's world size, else what the config declares.
    config.validate(dp_size=launched_world_size() if launched_distributed() else None)
    warn_unstarted_ranks(config)
    check_algorithm_names(config)
    # Under torchrun: collectives time out a minute after the watchdog would report a lost rank.
    ensure_process_group(timeout_s=config.trainer.dist_timeout_s)
    watchdog = Watchdog.start(config.trainer.dist_timeout_s)  # inert in one process
    with watchdog.stage("build"):
        return _build_rl_trainer(config, watchdog)


def warn_unstarted_ranks(config) -> None:
    """verl's scripts set trainer.n_gpus_per_node=8 and let Ray start the ranks. Here a plain ``python``
    run with trainer.backend=auto is one process: it trains the same numbers on one device, which is said
    once, with the two ways to start the ranks it asks for."""
    ranks = config.trainer.nnodes * config.trainer.n_gpus_per_node
    if ranks > 1 and not launched_distributed() and not placement.uses_ray(config):
        logger.warning("trainer.nnodes x trainer.n_gpus_per_node = %d ranks, but this is one process "
                       "(trainer.backend=auto, not under torchrun): it trains on one device, not %d (the same samples "
                       "and updates, more time). Start the ranks with torchrun --nproc_per_node=%d -m "
                       "verl.trainer.main_ppo ..., or set trainer.backend=ray to start them as Ray actors (as verl "
                       "does); trainer.n_gpus_per_node=1 says one process is meant", ranks,
                       ranks, config.trainer.n_gpus_per_node)


def agent_tool_schemas(multi_turn) -> list[dict] | None:
    """The OpenAI schemas of a multi-turn run's tools (None for single-turn runs or without tools)."""
    if not multi_turn.enable:
        if multi_turn.tool_config_path or multi_turn.function_tool_path:
            logger.warning("actor_rollout_ref.rollout.multi_turn has tools but enable=false: rollouts are single-turn "
                           "and the tools are not offered; set actor_rollout_ref.rollout.multi_turn.enable=true")
        return None
    from verl.tools.registry import load_tools

    tools = load_tools(multi_turn.tool_config_path, multi_turn.function_tool_path)
    from verl.agent.interactions import environment_of

    answered = environment_of(multi_turn) is not None  # checked here, before any model loads
    if not tools and not answered:
        logger.warning("actor_rollout_ref.rollout.multi_turn.enable=true without tools (tool_config_path, "
                       "function_tool_path): a call the model writes is answered with an error")
    return [tool.tool_schema.model_dump(exclude_none=True) for tool in tools.values()] or None


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
    if config.async_training.enable:
        prepare_async(config)
    data_cfg, arr_cfg, trainer_cfg = config.data, config.actor_rollout_ref, config.trainer
    out_dir = Path(trainer_cfg.default_local_dir).expanduser()  # '~/runs/x' quoted: not a folder named ~
    if is_main_process():
        check_output_dir(out_dir, "trainer.default_local_dir")  # before any model loads

    train_files, val_files = data_cfg.train_files, data_cfg.val_files
    if train_files is None:
        train_files, builtin_val = builtin_task_files(data_cfg.builtin_task)
        val_files = val_files if val_files is not None else builtin_val
    model_path = roles.policy_path(config)
    model_config = roles.policy_config(config)
    prepare_vision(config, model_config)
    tokenizer = roles.policy_tokenizer(config)
    processor = policy_processor(config, model_config)
    teachers = None
    if config.distillation.enabled:  # checked before any model loads: a wrong teacher costs seconds
        teachers = distillation.resolve_teachers(config.distillation)
        distillation.check_tokenizers(tokenizer, model_path, teachers, arr_cfg.model.trust_remote_code)
    # A broken reward file fails here, before any model loads (when the reward runs in this process).
    reward_worker = roles.reward_worker(config, tokenizer=tokenizer) if placement.reward_in_driver(config) else None

    # Multi-turn: the tools load here too (a broken tool file fails before any model does), and their
    # schemas go into every prompt through the chat template.
    tool_schemas = agent_tool_schemas(arr_cfg.rollout.multi_turn)
    train_set = _dataset(train_files, tokenizer, data_cfg, "data.train_files", tool_schemas, processor,
                         trainer_cfg.seed)
    val_batches = []
    validating = trainer_cfg.val_before_train or trainer_cfg.test_freq > 0
    if val_files is not None and not validating:
        logger.info("validation is off (trainer.test_freq <= 0, val_before_train=false): %s not read", val_files)
    elif val_files is not None:
        for path in files_read_by_both(train_files, val_files)[:1]:  # said once: often a quick test on purpose
            logger.warning("data.val_files and data.train_files both read %s: validation then scores prompts the "
                           "policy trains on, which shows memorising more than learning; give held-out rows "
                           "(e.g. the test split) as data.val_files", path)
        val_set = _dataset(val_files, tokenizer, data_cfg, "data.val_files", tool_schemas, processor, trainer_cfg.seed)
        val_batches = _val_batches(val_set, data_cfg.val_batch_size, tokenizer.pad_token_id,
                                   _reward_key_columns(data_cfg))
    # An id past the model's embeddings would fail the first forward with torch's "index out of range".
    # The rows' ids and answers, without their images processed (a custom dataset: its items).
    rows = (lambda: (train_set.item(i, media=False) for i in range(len(train_set)))) if hasattr(train_set, "item") \
        else (lambda: (train_set[i] for i in range(len(train_set))))
    check_token_ids(tokenizer, model_config, (list(map(int, row["input_ids"])) for row in rows()),
                    data_key="data.train_files")
    for batch in val_batches:
        check_token_ids(tokenizer, model_config, (ids[mask.bool()].tolist() for ids, mask in
                                                  zip(batch["input_ids"], batch["attention_mask"])),
                        data_key="data.val_files")
    if uses_builtin_scorers(config):  # a row without an answer would score 0 all run: said now, by row
        check_builtin_rows(rows(), "data.train_files", data_cfg.reward_fn_key)
        for batch in val_batches:
            check_builtin_rows(_batch_rows(batch, data_cfg.reward_fn_key), "data.val_files", data_cfg.reward_fn_key)
    elif config.custom_reward_function.path or config.reward.functions:  # a gap in the answers: said once
        warn_rows_without_ground_truth(rows(), "data.train_files")
        warn_rows_without_ground_truth((row for batch in val_batches for row in _batch_rows(batch, "data_source")),
                                       "data.val_files")
    loader = PromptLoader(train_set, data_cfg.train_batch_size, shuffle=data_cfg.shuffle,
                          seed=data_cfg.seed if data_cfg.seed is not None else trainer_cfg.seed,
                          collate=functools.partial(collate_prompts, pad_token_id=tokenizer.pad_token_id,
                                                    extra_keys=_reward_key_columns(data_cfg)),
                          size_key="data.train_batch_size", data_key="data.train_files", warn=is_main_process())
    # 0 is a run that only validates (verl's trainer.val_only): not "unset".
    total_steps = (trainer_cfg.total_training_steps if trainer_cfg.total_training_steps is not None
                   else trainer_cfg.total_epochs * len(loader))

    # The loggers start before any model loads: a wandb that is not logged in fails in seconds, not
    # after the models have loaded; a run that then fails to place its roles is closed as failed.
    tracker = Tracker.from_config(config, out_dir, record=is_main_process())
    try:
        placed = placement.place_roles(config, total_steps=total_steps, tokenizer=tokenizer, watchdog=watchdog,
                                       reward_worker=reward_worker, teachers=teachers)
    except BaseException:
        tracker.close(failed=True)
        raise
    if is_main_process():
        out_dir.mkdir(parents=True, exist_ok=True)
        with naming_the_file(out_dir / "config.yaml"):
            (out_dir / "config.yaml").write_text(config.to_yaml())
    parts = dict(actor_rollout_ref=placed.actor_rollout_ref, critic=placed.critic, reward=placed.reward,
                 train_loader=loader, val_batches=val_batches, tracker=tracker, out_dir=out_dir,
                 total_steps=total_steps, use_ref=roles.uses_reference(config), watchdog=watchdog,
                 teacher=placed.teacher, distillation=distillation.loss_settings(config), placement=placed)
    if not config.async_training.enable:
        return RLTrainer(config, **parts)
    from verl.trainer.ppo.async_trainer import AsyncRLTrainer, open_rollout_stream

    return AsyncRLTrainer(config, stream=open_rollout_stream(config), **parts)


_PREPARED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_VISION_PREPARED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def prepare_vision(config, model_config) -> None:
    """A vision-language policy: checked and set up (:mod:`verl.trainer.ppo.vision_run`), said once per
    config (main_ppo calls it before the memory plan; building the trainer calls it again)."""
    if _VISION_PREPARED.get(id(config)) is config:
        return
    lines = prepare_vision_run(config, model_config)
    if lines:  # a vision-language policy (a text one may still become one: the shapes demo's warm start)
        _VISION_PREPARED[id(config)] = config
    if lines and is_main_process():
        print("\n".join(lines), flush=True)


def prepare_async(config) -> None:
    """``async_training.enable``: checked, and what stale samples need set, said once per config, before
    any model loads (main_ppo calls it before the warm start; building the trainer calls it again, which
    does nothing for a config already prepared)."""
    from verl.trainer.ppo.async_config import prepare_async_config

    if _PREPARED.get(id(config)) is config:
        return
    lines = prepare_async_config(config)
    _PREPARED[id(config)] = config
    if is_main_process():
        print("\n".join(lines), flush=True)
