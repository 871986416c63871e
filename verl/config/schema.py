"""The PPO-family trainer config: `TrainerConfig` and its sections, under verl's key names.

Defaults suit real models; the built-in demo layers its own preset on top. The commented
default YAML shipped as `verl/config/ppo_trainer.yaml` is generated from this file:

    python -m verl.config > verl/config/ppo_trainer.yaml

(`python -m verl.config.schema` prints the same text; a unit test fails when the committed file and this schema disagree).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from verl.config import cross_checks, verl_defaults, verl_rules
from verl.config.verl_rules import Section, verl_option
from verl.config.node import option, section
from verl.config.render import render_help, render_yaml
from verl.config.schema_critic import (  # noqa: F401  (re-exported)
    CriticConfig, CriticModelConfig, CustomRewardFunctionConfig, RewardConfig, RewardModelConfig,
    RewardModelModelConfig)
from verl.config.schema_actor import KL_ESTIMATOR_NAMES, ActorRolloutRefConfig
from verl.config.schema_async import AsyncTrainingConfig, RolloutPoolConfig, TrainerV1Config
from verl.config.schema_distillation import DISTILLATION_ESTIMATORS, DistillationConfig  # noqa: F401  (re-exported)


@dataclass
class DataConfig(Section):
    """Prompts: where they come from and how they are batched."""

    train_files: str | list[str] | None = option(None, help="Training prompts: a parquet/jsonl file or "
                                                 "a list of them; null = the built-in task (builtin_task).")
    val_files: str | list[str] | None = option(None, help="Validation prompts, same forms as "
                                               "train_files; null = the built-in task's held-out split.")
    builtin_task: str = option("addition", help="Built-in verifiable task used when train_files is null.")
    prompt_key: str = option("prompt", help="Dataset column holding the prompt (chat messages or text).")
    reward_fn_key: str = option("data_source", help="Dataset column that selects the reward function.")
    max_prompt_length: int = option(512, bounds=">= 1", help="Longest prompt in tokens (see truncation).")
    max_response_length: int = option(512, bounds=">= 1", help="Most tokens generated per response.")
    seq_len: int | None = option(None, bounds=">= 1", help="Ceiling on a sample's tokens: a run whose "
                                 "max_prompt_length + max_response_length exceeds it is refused at start; "
                                 "null = no ceiling.")
    train_batch_size: int = option(32, bounds=">= 1", aliases=("batch_size",), help="Prompts per RL step; the "
                                   "step trains on this x rollout.n samples.")
    val_batch_size: int | None = option(None, bounds=">= 1", help="Prompts per validation batch; null = the whole "
                                        "validation set at once.")
    shuffle: bool = option(True, help="Shuffle the training prompts each epoch.")
    seed: int | None = option(1, bounds="[0, 4294967295]", help="Seed of the prompt shuffling; null = trainer.seed.")
    truncation: Literal["error", "left", "right", "middle"] = option("error", help="A prompt longer than "
                                                                     "max_prompt_length raises (error) or is cut from the "
                                                                     "left, the right or the middle (its two ends kept).")
    filter_overlong_prompts: bool = option(False, help="Drop prompts longer than max_prompt_length "
                                           "when loading the dataset.")
    chat_template_kwargs: dict = option({}, aliases=("apply_chat_template_kwargs",), help="Extra keyword "
                                        "arguments for the tokenizer's chat template, e.g. {enable_thinking: false} "
                                        "(verl's name: apply_chat_template_kwargs).")
    apply_chat_template: bool = option(True, help="Format chat-message prompts with the tokenizer's "
                                       "chat template (false = use the text as is).")
    # verl's other data keys.
    tokenizer: str | None = verl_option(None, help="Tokenizer of the dataset.", inert=False,
                                        why="the dataset is tokenized with the policy's tokenizer",
                                        refuse_if=lambda v: v is not None, when="unless null",
                                        instead="set actor_rollout_ref.model.tokenizer_path")
    train_max_samples: int = option(-1, bounds=">= -1", help="Use at most this many training prompts, as verl "
                                    "picks them: a random subset drawn with data.seed when data.shuffle, else the "
                                    "first ones; taken before filter_overlong_prompts; -1 (or 0) = all.")
    val_max_samples: int = option(-1, bounds=">= -1", help="The same for the validation prompts; -1 (or 0) = all.")
    gen_batch_size: int | None = option(None, bounds=">= 1", help="verl: prompts per generation batch of dynamic sampling; "
                                        "here prompts are drawn data.train_batch_size at a time, so validate() "
                                        "refuses another value.")
    use_shm: bool = verl_option(False, help="Copy the data files to /dev/shm first.", why="files are read "
                                "where they are", warn_if=bool, when="to true")
    tool_config_path: str | None = verl_option(None, help="verl's copy of the rollout's tool YAML (it follows "
                                               "actor_rollout_ref.rollout.multi_turn.tool_config_path there).",
                                               inert=False, why="the tools are read from the rollout's key only",
                                               refuse_if=lambda v: v is not None, when="unless null",
                                               instead="set actor_rollout_ref.rollout.multi_turn.tool_config_path")
    function_tool_path: str | None = verl_option(None, help="verl's copy of the rollout's tool functions file (it "
                                                 "follows actor_rollout_ref.rollout.multi_turn.function_tool_path).",
                                                 inert=False, why="the tools are read from the rollout's key only",
                                                 refuse_if=lambda v: v is not None, when="unless null",
                                                 instead="set actor_rollout_ref.rollout.multi_turn.function_tool_path")
    return_raw_input_ids: bool = verl_option(False, help="Also return untemplated input ids.",
                                             why="used by verl's reward-model path only")
    return_raw_chat: bool = verl_option(True, help="Also return the chat messages.",
                                        why="not needed here")
    return_full_prompt: bool = verl_option(False, help="Also return the templated prompt text.",
                                           why="not needed here")
    dataloader_num_workers: int = verl_option(8, help="Data-loader worker processes.",
                                              why="prompts load in the trainer process")
    validation_shuffle: bool = verl_option(False, help="Shuffle the validation prompts.", why="validation "
                                           "scores the whole set; its order does not change the scores")
    filter_overlong_prompts_workers: int = verl_option(1, help="Processes that filter overlong prompts.",
                                                       why="filtering runs in the trainer process")
    trust_remote_code: bool = verl_option(False, help="Allow custom processor code.",
                                          why="the tokenizer follows actor_rollout_ref.model.trust_remote_code")
    custom_cls: dict = option({"path": None, "name": None}, help="A dataset class of your own, for training "
                              "and validation: {path: a .py file, name: the class in it}; null path = the "
                              "built-in RLDataset. Built as cls(data_files=..., tokenizer=..., processor=None, "
                              "config=<this data section>); subclass verl.data.RLDataset (docs/data.md).")
    image_key: str = option("images", help="Column of the prompts' images, read with a vision-language policy "
                            "(Qwen2-VL, Qwen2.5-VL; docs/vision.md): PIL images, {bytes} / {path} dicts or paths, "
                            "one per <image> in the prompt. With a text policy a dataset with images is refused.")
    video_key: str = option("videos", help="Column of the prompts' videos. Videos are refused (one line naming "
                            "the row); a text policy refuses the column as it does images.")
    audio_key: str = verl_option("audios", help="Column of the prompts' audio.",
                                 why="audio inputs are not supported; the column is not read")
    image_patch_size: int = verl_option(14, help="Vision patch size.",
                                        why="the model's image processor has its own (preprocessor_config.json)")
    return_multi_modal_inputs: bool = verl_option(True, help="Return processed multimodal inputs.",
                                                  why="items with images always carry multi_modal_inputs")
    mm_processor_kwargs: dict = option({}, help="Keyword arguments of a vision-language policy's image processor "
                                       "(e.g. {max_pixels: 200704}): they change how many tokens an image takes.")

@dataclass
class KLControlConfig(Section):
    """Coefficient of the in-reward KL penalty."""

    type: Literal["fixed", "adaptive"] = option("fixed", help="fixed coefficient, or adaptive "
                                                "(Ziegler et al. 2019) steering the KL towards target_kl.")
    kl_coef: float = option(0.001, bounds=">= 0", help="(Initial) KL coefficient.")
    horizon: int = option(10000, bounds="> 0", help="Adaptive controller horizon in samples.")
    target_kl: float = option(0.1, bounds="> 0", help="KL the adaptive controller aims for.")


@dataclass
class FilterGroupsConfig(Section):
    """DAPO's dynamic sampling (Yu et al. 2025, "DAPO", section 3.2): drop prompt groups whose
    responses all score the same (they carry no group-relative signal) and draw more prompt
    batches until the step has data.train_batch_size groups."""

    enable: bool = option(False, help="Filter groups and draw extra prompt batches (needs rollout.n >= 2).")
    metric: str = option("score", help="What must differ within a group: score (the summed token "
                         "scores, after any overlong penalty), or the name of a numeric key the reward "
                         "function returns in its dict (e.g. acc).")
    max_num_gen_batches: int = option(10, bounds=">= 0", help="Most prompt batches drawn for one step, the "
                                      "first included; when reached, the step trains on the groups kept so "
                                      "far (filter_groups/cap_hit = 1 in the metrics). verl's 0 (no limit; "
                                      "its default) is refused by validate() with enable=true.")
    max_inflight_gen_batches: int = verl_option(1, help="Prompt batches generated at once.",
                                                why="extra batches are drawn one at a time here")


@dataclass
class RolloutCorrectionConfig(Section):
    """verl's rollout correction between the rollout engine's log-probs and the actor's old ones
    (docs/algorithms.md). Token-level truncated importance sampling (rollout_is=token) is
    actor_rollout_ref.actor.rollout_is_correction here; validate() moves it there (outside bypass
    mode). The rest is computed by the actor over each update batch, or per micro-batch in bypass
    mode (verl.algorithms.rollout_correction)."""

    rollout_is: str | None = verl_option(None, help="Importance-sampling level: token (min(ratio, C) per "
                                         "token), sequence (min(product of the response's ratios, C) on every "
                                         "token of it), or null = off.", inert=False,
                                         why="the levels are token and sequence",
                                         refuse_if=lambda v: v not in (None, "token", "sequence"),
                                         when="for anything but token / sequence / null")
    rollout_is_threshold: float | str = option(2.0, bounds="> 0", help="Cap C of the importance weight; moved to "
                                               "actor_rollout_ref.actor.rollout_is_threshold with rollout_is=token "
                                               "(verl's two-sided 'lower_upper' form, IcePop, is refused).")
    rollout_rs: str | None = option(None, help="Rejection sampling: comma-separated options, all of which a "
                                    "token must pass to stay in the actor's loss: token_k1/k2/k3, "
                                    "seq_sum_k1/k2/k3, seq_mean_k1/k2/k3, seq_max_k2/k3 (k1 = log(pi_rollout / "
                                    "pi_old), k2 = its square / 2, k3 = ratio - 1 - log ratio); a seq_* option "
                                    "drops the whole response. null = off.")
    rollout_rs_threshold: str | float | None = option(None, bounds="> 0", help="Bounds of rollout_rs: one for all options or "
                                                      "one per option, comma-separated, e.g. '0.6_1.6,2.5'. A k1 "
                                                      "option takes ratio bounds 'lower_upper' (one number U "
                                                      "means 1/U_U); the others one upper bound.")
    bypass_mode: bool = option(False, help="Skip the old-log-prob pass: the rollout engine's log-probs play "
                               "pi_old (sets actor_rollout_ref.rollout.calculate_log_probs=true), and the actor's "
                               "policy loss is loss_type's, with the importance weights and rejection computed per "
                               "micro-batch from the current policy against the rollout's; policy_loss.loss_mode "
                               "is then not used.")
    loss_type: str = verl_option("ppo_clip", help="Policy loss of bypass_mode: ppo_clip (PPO's clipped loss with "
                                 "ratio pi_theta / pi_rollout; the importance weights are only logged) or "
                                 "reinforce (-A * w * log pi_theta, w the importance weight, 1 without "
                                 "rollout_is). Without bypass_mode it has no effect (a warning).", inert=False,
                                 why="the bypass losses are ppo_clip and reinforce",
                                 refuse_if=lambda v: v not in ("ppo_clip", "reinforce"),
                                 when="for anything but ppo_clip / reinforce")
    rollout_is_batch_normalize: bool = option(False, help="Divide the importance weights by their mean over "
                                              "the update batch (valid tokens for token, responses for "
                                              "sequence; all data-parallel ranks), after the cap.")


@dataclass
class AlgorithmConfig(Section):
    """Advantage estimation and the KL penalty in the reward."""

    gamma: float = option(1.0, bounds="[0, 1]", help="Discount factor.")
    lam: float = option(1.0, bounds="[0, 1]", help="GAE lambda.")
    adv_estimator: str = option("grpo", help="Advantage estimator by name: gae, grpo, rloo, "
                                "reinforce_plus_plus, reinforce_plus_plus_baseline, remax, gpg, gdpo "
                                "(docs/algorithms.md).")
    norm_adv_by_std_in_grpo: bool = option(True, help="Divide GRPO advantages by the group's std "
                                           "(false = Dr. GRPO, Liu et al. 2025).")
    use_kl_in_reward: bool = option(False, help="Subtract a KL(policy || reference) penalty from the reward.")
    kl_penalty: str = option("kl", choices=KL_ESTIMATOR_NAMES,
                             help="KL estimator for the reward penalty: kl (k1), abs, mse (k2), "
                             "low_var_kl (k3).")
    kl_ctrl: KLControlConfig = section(KLControlConfig, help="KL coefficient control.")
    filter_groups: FilterGroupsConfig = section(FilterGroupsConfig, help="DAPO dynamic sampling "
                                                "(Yu et al. 2025).")
    rollout_correction: RolloutCorrectionConfig = section(RolloutCorrectionConfig, help="verl's rollout "
                                                          "correction (off-policy importance sampling).")
    use_pf_ppo: bool = verl_option(False, help="Preference-feedback PPO sample reweighting.", inert=False,
                                   why="PF-PPO is not implemented", refuse_if=bool, when="when true")
    pf_ppo: dict = verl_option({"reweight_method": "pow", "weight_pow": 2.0}, help="PF-PPO settings.",
                               why="PF-PPO is not implemented (use_pf_ppo=true is refused)")
    gdpo_reward_keys: list[str] | None = option(None, help="GDPO: the reward components normalised apart, "
                                                "by the keys the reward function returns in its dict beside "
                                                "\"score\" (e.g. [accuracy_reward, format_reward]); required by "
                                                "adv_estimator=gdpo, read by nothing else.")
    gdpo_reward_weights: list[float] | None = option(None, help="GDPO: weight of each of gdpo_reward_keys in "
                                                     "the sum of normalised components; null = all 1.")


@dataclass
class TrainerSectionConfig(Section):
    """Run length, logging, placement and checkpoints."""

    total_epochs: int = option(1, bounds=">= 1", help="Passes over the training prompts.")
    total_training_steps: int | None = option(None, bounds=">= 0", aliases=("max_steps",), help="Stop after "
                                              "this many RL steps; null = total_epochs x steps per epoch; 0 = no step (only "
                                              "validate, with val_before_train and validation data).")
    project_name: str = option("verl", help="Project name for loggers.")
    experiment_name: str = option("run", help="Run name for loggers.")
    logger: str | list[str] = option(["console"], help="Loggers: any of console, jsonl, tensorboard, wandb.",
                                     example="[console,wandb]; a dict(type=..., project=...) is the tutorial's "
                                     "top-level key logger: TrainerConfig(logger=dict(type='wandb', project='my-rl')), "
                                     "or logger.type=wandb logger.project=my-rl on the command line")
    write_report: bool = option(True, help="Write report.html and report/*.png (the run's curves) into the output "
                                "folder when the run ends; `verl report DIR` writes them later from metrics.jsonl.")
    memory_check: bool = option(True, help="Before loading, estimate each rank's peak memory from the config and "
                                "the model's config.json (printed at start; `main_ppo ... --plan` prints it and "
                                "exits) and refuse a run that cannot fit the device's memory (GPU memory, or "
                                "RAM on a CPU); false skips the refusal. See docs/performance.md.")
    log_val_generations: int = option(0, bounds=">= 0", help="Validation samples (prompt, response, score) to log "
                                      "each validation, the same prompts every time: printed, written to "
                                      "val_generations.jsonl, and a table in TensorBoard and wandb.")
    nnodes: int = option(1, bounds=">= 1", help="Machines in the job.")
    n_gpus_per_node: int = option(1, bounds=">= 1", help="Devices (GPUs, or CPU ranks) per machine.")
    device: str = option("auto", help="cuda, cpu, or auto (cuda when available). Under torchrun each "
                         "rank uses the GPU of its LOCAL_RANK.")
    backend: str = option("auto", choices=("auto", "ray"), help="Where the roles run. auto: in this process, "
                          "or one rank of each role per process under torchrun. ray: this process is the "
                          "driver and each role is a group of Ray actors on resource pools of trainer.nnodes x "
                          "trainer.n_gpus_per_node ranks (CPU ranks without GPUs); see docs/distributed.md.")
    resource_pools: dict = option({}, help="trainer.backend=ray: pools besides global_pool (which is "
                                  "[n_gpus_per_node] x nnodes), as name -> ranks per node, e.g. "
                                  "'{critic_pool: [1]}'.")
    role_pools: dict = option({}, help="trainer.backend=ray: the pool of a role (critic, reward, teacher), e.g. "
                              "'{critic: critic_pool}'. actor_rollout_ref is always on global_pool; a role not "
                              "named here shares it (colocated: one process per rank holds all its roles). The "
                              "reward runs in the driver unless it has a reward model.")
    dist_timeout_s: float = option(600.0, bounds="> 0", help="Multi-rank jobs: a rank that dies, stops responding or "
                                   "fails ends the whole job within this many seconds, with one line "
                                   "naming the rank and the stage (see docs/distributed.md).")
    save_freq: int = option(-1, help="Save a checkpoint every this many steps and after the "
                           "last one; -1 (any value <= 0) = no checkpoints.")
    test_freq: int = option(-1, help="Validate every this many steps and after the last "
                           "one; -1 (any value <= 0) = never during training (see val_before_train).")
    val_before_train: bool = option(True, help="Validate once before the first step (and once "
                                    "after the last, so every run reports a before/after pair).")
    val_sampled: bool = option(False, help="Validation also samples with the training settings "
                               "(temperature, top_p, top_k) and logs val-aux/<source>/reward/sampled_mean@1.")
    resume_mode: str = option("auto", choices=("auto", "disable", "resume_path"),
                              help="auto (resume from the latest checkpoint in "
                              "default_local_dir if any), disable, or resume_path (from resume_from_path).")
    resume_from_path: str | None = option(None, help="Checkpoint folder for resume_mode=resume_path.")
    default_local_dir: str = option("outputs/run", help="Folder for checkpoints and the exported model.")
    max_actor_ckpt_to_keep: int | None = option(None, bounds=">= 0", help="Keep only the newest this many "
                                                "checkpoints; null (or 0) = keep all.")
    progress_bar: bool = option(True, help="Show a progress bar.")
    balance_batch: bool = option(True, help="Before the updates, reorder each step's samples within every "
                                 "mini-batch so that each data-parallel rank gets a similar number of tokens "
                                 "(the slowest rank sets the pace); the mini-batches keep their samples. "
                                 "One process: nothing moves.")
    seed: int = option(1, bounds="[0, 4294967295]", help="Global seed (model init, sampling, dropout).")
    max_nonfinite_steps: int = option(3, bounds=">= 0", help="An update whose loss or gradient norm is NaN or inf "
                                      "is skipped (counted as actor/ and critic/num_nonfinite_skipped, with a "
                                      "warning); this many steps in a row with a skipped update are tolerated, "
                                      "the next one stops the run with an error (0: stop at the first).")
    # verl's other trainer keys.
    critic_warmup: int = option(0, bounds=">= 0", help="verl's name of critic.warmup_steps; validate() moves it there.")
    max_critic_ckpt_to_keep: int | None = option(None, bounds=">= 0", help="A checkpoint holds the actor and the critic "
                                                 "together here, so max_actor_ckpt_to_keep counts both; "
                                                 "validate() warns when this one differs.")
    val_only: bool = verl_option(False, help="Validate, then stop without training.", inert=False,
                                 why="not implemented", refuse_if=bool, when="when true",
                                 instead="run with trainer.total_training_steps=0 and val_before_train=true")
    rollout_data_dir: str | None = verl_option(None, help="Folder for the training rollouts as JSONL.",
                                               why="rollouts are not dumped (see log_val_generations)",
                                               warn_if=lambda v: v is not None, when="to a folder")
    validation_data_dir: str | None = verl_option(None, help="Folder for the validation generations as JSONL.",
                                                  why="generations are not dumped (see log_val_generations)",
                                                  warn_if=lambda v: v is not None, when="to a folder")
    default_hdfs_dir: str | None = verl_option(None, help="HDFS folder checkpoints are copied to.",
                                               why="checkpoints stay in default_local_dir",
                                               warn_if=lambda v: v is not None, when="to a folder")
    del_local_ckpt_after_load: bool = verl_option(False, help="Delete the local checkpoint after resuming.",
                                                  why="checkpoints are kept", warn_if=bool, when="to true")
    esi_redundant_time: float = verl_option(0, help="Seconds reserved to save before an elastic-instance "
                                            "shutdown.", why="not used here")
    ray_wait_register_center_timeout: int = verl_option(300, help="Ray worker registration timeout in "
                                                        "seconds.", why="under trainer.backend=ray, "
                                                        "trainer.dist_timeout_s bounds every wait for an actor, "
                                                        "its start included")
    use_v1: bool = option(True, help="verl: its V1 trainer loop, whose modes trainer.v1.trainer_mode chooses; false "
                          "(verl's legacy loop) leaves trainer.v1 unread. One loop here: the V1 modes run on this "
                          "project's asynchronous RL (docs/async.md).")
    v1: TrainerV1Config = section(TrainerV1Config, help="verl's V1 trainer modes (read with trainer.use_v1=true).")


@dataclass
class LoggerConfig(Section):
    """The tutorial's short form of the logging keys: logger=dict(type="wandb", project="my-rl")."""

    type: str | list[str] | None = option(None, help="Short form of trainer.logger: one logger name or a "
                                          "list (console, jsonl, tensorboard, wandb); replaces "
                                          "trainer.logger when set; null = use trainer.logger.")
    project: str | None = option(None, help="Short form of trainer.project_name; wins when set.")
    name: str | None = option(None, help="Short form of trainer.experiment_name; wins when set.")


@dataclass
class SFTWarmstartConfig(Section):
    """Supervised warm start of the built-in tiny model (used only for the built-in demo)."""

    enable: bool = option(True, help="Run the warm start before RL when the built-in model and task are used.")
    target_accuracy: float = option(0.38, bounds="[0, 1]", help="Stop once held-out sampled accuracy (temperature 1) "
                                    "reaches this, leaving RL room to improve.")
    max_steps: int = option(3000, bounds=">= 1", help="Most supervised steps.")
    lr: float = option(1e-3, bounds="> 0", help="Supervised learning rate.")
    batch_size: int = option(64, bounds=">= 1", help="Examples per supervised step.")
    grad_clip: float | None = option(None, bounds="> 0", help="Clip each step's gradient norm to this; null: "
                                     "no clipping.")
    eval_every: int = option(10, bounds=">= 1", help="Check accuracy every this many steps (the accuracy jumps "
                             "quickly once the model learns carrying, so check often).")
    eval_samples: int = option(200, bounds=">= 1", help="Prompts used for each accuracy check.")
    direct_steps: int = option(0, bounds=">= 0", help="An agentic task: once the target is reached, this many "
                               "steps more on conversations that answer without the tool (a guess), "
                               "direct_tool_share of them still calling it, so that the model mostly answers "
                               "without it and RL has to learn to call it. 0: no such phase.")
    direct_batch_size: int | None = option(None, bounds=">= 1", help="Examples per step of the direct answers; "
                                           "null: batch_size.")
    direct_lr: float | None = option(None, bounds="> 0", help="Learning rate of the direct answers; null: lr.")
    direct_tool_share: float = option(0.15, bounds="[0, 1]", help="The share of direct_steps' conversations "
                                      "that call the tool.")
    direct_tool_calls: float | None = option(None, bounds="(0, 1]", help="Stop the direct answers once greedy "
                                             "decoding calls the tool on no held-out prompt and at least this "
                                             "share of sampled responses is expected to call it (checked after "
                                             "every step from the model's probability of opening a call); "
                                             "direct_steps is then the most steps. null: direct_steps steps.")


@dataclass
class TrainerConfig(Section):
    """Everything a PPO-family run needs. Call `validate()` before building anything."""

    data: DataConfig = section(DataConfig, help="Prompt data and batching.")
    actor_rollout_ref: ActorRolloutRefConfig = section(ActorRolloutRefConfig, help="Policy, reference and rollout.")
    critic: CriticConfig = section(CriticConfig, help="Value function (GAE).")
    reward_model: RewardModelConfig = section(RewardModelConfig, help="Learned reward model.")
    custom_reward_function: CustomRewardFunctionConfig = section(CustomRewardFunctionConfig,
                                                                 help="User reward function.")
    reward: RewardConfig = section(RewardConfig, help="Several weighted reward functions; error handling.")
    algorithm: AlgorithmConfig = section(AlgorithmConfig, help="Advantages and KL penalty.")
    trainer: TrainerSectionConfig = section(TrainerSectionConfig, help="Run control, logging, checkpoints.")
    sft_warmstart: SFTWarmstartConfig = section(SFTWarmstartConfig, help="Built-in demo warm start.")
    logger: LoggerConfig = section(LoggerConfig, help="Short form of trainer.logger / project_name / "
                                   "experiment_name (the tutorial's spelling); where set it wins.")
    # verl's other top-level keys.
    model_engine: str = verl_option("dp", help="verl's training-engine family: dp (FSDP), the one that runs here.",
                                    inert=False, refuse_if=lambda v: v not in ("dp", "fsdp"),
                                    why=lambda v: (f"the {verl_rules.BACKENDS.get(v, v)} backend is not supported"),
                                    when="for anything but dp", instead=verl_rules.FSDP_INSTEAD)
    ray_kwargs: dict = option(verl_defaults.ray_kwargs_defaults(), help="trainer.backend=ray: ray_init holds the "
                              "arguments of ray.init (address: a running cluster, e.g. auto; num_cpus; "
                              "runtime_env); with no address and no RAY_ADDRESS a local Ray starts.")
    global_profiler: dict = verl_option(verl_defaults.global_profiler_defaults(), help="verl's global profiler.",
                                        why="profiling is not implemented",
                                        warn_if=lambda v: v.get("tool") is not None or bool(v.get("steps")),
                                        when="with a tool or steps", keys=("tool", "steps"))
    transfer_queue: dict = verl_option(verl_defaults.transfer_queue_defaults(), help="verl's TransferQueue data plane.",
                                       why="data moves in-process here", warn_if=lambda v: bool(v.get("enable")),
                                       when="enable=true", keys=("enable",))
    skip: dict = verl_option(verl_defaults.skip_defaults(), help="verl's rollout caching for debugging.",
                             why="rollouts are never cached",
                             warn_if=lambda v: any(isinstance(x, dict) and x.get("enable") for x in v.values()),
                             when="with enable=true")
    sandbox_fusion: dict = verl_option({"url": None, "max_concurrent": None, "memory_limit_mb": None}, inert=False,
                                       help="verl's older place of reward.sandbox_fusion.", why="SandboxFusion is "
                                       "not used; code rewards run in the built-in sandbox (docs/code_reward.md)",
                                       refuse_if=lambda v: v.get("url") is not None, when="with a url", keys=("url",))
    distillation: DistillationConfig = section(DistillationConfig, help="verl's on-policy distillation.")
    rollout: RolloutPoolConfig = section(RolloutPoolConfig, help="verl's asynchronous modes: the rollout's own "
                                         "resources (docs/async.md).")
    async_training: AsyncTrainingConfig = section(AsyncTrainingConfig, help="Asynchronous RL: the rollout runs "
                                                  "ahead of the trainer (docs/async.md).")

    def validate(self, dp_size: int | None = None) -> None:
        """Raise ConfigError for inconsistent settings (batch-size arithmetic shown in the message).

        `dp_size` is the number of data-parallel ranks; None = trainer.nnodes x trainer.n_gpus_per_node.
        """
        cross_checks.validate(self, dp_size)

    def derived_sizes(self, dp_size: int | None = None, role: Literal["actor", "critic"] = "actor") -> dict[str, int]:
        """Batch sizes in prompts and samples for logging, e.g. `samples_per_mini_batch`."""
        return cross_checks.derived_sizes(self, dp_size, role)

    def resolved_logging(self) -> tuple[list[str], str, str]:
        """``(logger names, project, experiment)``: trainer.logger / project_name / experiment_name,
        each replaced by its short form in the top-level ``logger`` section where that is set."""
        short, trainer = self.logger, self.trainer
        names = short.type if short.type is not None else trainer.logger
        names = [names] if isinstance(names, str) else list(names)
        project = short.project if short.project is not None else trainer.project_name
        experiment = short.name if short.name is not None else trainer.experiment_name
        return list(dict.fromkeys(names)), project, experiment

    def critic_enabled(self) -> bool:
        """Whether a critic is trained: `critic.enable`, or when null, whether the estimator needs one."""
        return cross_checks.critic_enabled(self)


HEADER = """\
verl PPO-family trainer: default configuration, one comment per key.
Generated from verl/config/schema.py; do not edit by hand. Regenerate with:
    python -m verl.config > verl/config/ppo_trainer.yaml
Override any key on the command line as a.b.c=value, e.g. actor_rollout_ref.actor.optim.lr=1e-6"""


def render_default_yaml() -> str:
    """The text of `verl/config/ppo_trainer.yaml`: all defaults with their help as comments."""
    return render_yaml(TrainerConfig(), HEADER)


def render_reference() -> str:
    """The text of `docs/config_reference.md`: every key with its type, default and help, the same
    listing as `verl train --help`."""
    return ("# Config key reference\n\nGenerated from the schema (`python -m verl.config reference > "
            "docs/config_reference.md`; a unit test checks it is current). The same text as `verl train --help`. "
            "How verl's keys map here, and the command-line forms: [config.md](config.md).\n\n```\n"
            + render_help(TrainerConfig) + "```\n")


if __name__ == "__main__":
    print(render_default_yaml(), end="")
