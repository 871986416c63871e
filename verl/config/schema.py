"""The PPO-family trainer config: `TrainerConfig` and its sections, under verl's key names.

Defaults suit real models; the built-in demo layers its own preset on top. The commented
default YAML shipped as `verl/config/ppo_trainer.yaml` is generated from this file:

    python -m verl.config > verl/config/ppo_trainer.yaml

(`python -m verl.config.schema` prints the same text; a unit test fails when the committed file and this schema disagree).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from verl.config import checks
from verl.config.node import ConfigNode, option, section
from verl.config.render import render_yaml
from verl.config.schema_actor import ActorRolloutRefConfig, FSDPConfig, LossAggMode, OptimConfig


@dataclass
class DataConfig(ConfigNode):
    """Prompts: where they come from and how they are batched."""

    train_files: str | list[str] | None = option(None, help="Training prompts: a parquet/jsonl file or "
                                                 "a list of them; null = the built-in task (builtin_task).")
    val_files: str | list[str] | None = option(None, help="Validation prompts, same forms as "
                                               "train_files; null = the built-in task's held-out split.")
    builtin_task: str = option("addition", help="Built-in verifiable task used when train_files is null.")
    prompt_key: str = option("prompt", help="Dataset column holding the prompt (chat messages or text).")
    reward_fn_key: str = option("data_source", help="Dataset column that selects the reward function.")
    max_prompt_length: int = option(512, help="Longest prompt in tokens (see truncation).")
    max_response_length: int = option(512, help="Most tokens generated per response.")
    seq_len: int | None = option(None, help="Optional cap on prompt + response tokens; null = "
                                 "max_prompt_length + max_response_length.")
    train_batch_size: int = option(32, aliases=("batch_size",), help="Prompts per RL step; the "
                                   "step trains on this x rollout.n samples.")
    val_batch_size: int | None = option(None, help="Prompts per validation batch; null = the whole "
                                        "validation set at once.")
    shuffle: bool = option(True, help="Shuffle the training prompts each epoch.")
    seed: int = option(1, help="Seed of the prompt shuffling.")
    truncation: Literal["error", "left", "right"] = option("error", help="A prompt longer than "
                                                           "max_prompt_length raises (error) or is cut from the left or right.")
    filter_overlong_prompts: bool = option(False, help="Drop prompts longer than max_prompt_length "
                                           "when loading the dataset.")
    chat_template_kwargs: dict = option({}, help="Extra keyword arguments for the tokenizer's chat "
                                        "template, e.g. {enable_thinking: false}.")
    apply_chat_template: bool = option(True, help="Format chat-message prompts with the tokenizer's "
                                       "chat template (false = use the text as is).")


@dataclass
class CriticModelConfig(ConfigNode):
    """The value model (policy backbone plus a scalar value head)."""

    path: str | None = option(None, help="Hugging Face model id or folder; null = the actor's model.")
    tokenizer_path: str | None = option(None, help="Tokenizer id or folder; null = the model path.")
    trust_remote_code: bool = option(False, help="Allow custom modelling code from the model repository.")
    override_config: dict = option({}, help="Free-form keys set on the Hugging Face model config before loading.")
    enable_gradient_checkpointing: bool = option(False, help="Recompute activations in the backward pass.")
    use_remove_padding: bool = option(False, help="Run value and update passes on packed sequences (see "
                                      "actor_rollout_ref.model.use_remove_padding; checked at start, unsupported "
                                      "models fail with an error).")


@dataclass
class CriticConfig(ConfigNode):
    """The value function used by GAE."""

    enable: bool | None = option(None, help="Train a critic; null = exactly when the advantage "
                                 "estimator needs one (gae).")
    model: CriticModelConfig = section(CriticModelConfig, help="Value model.")
    optim: OptimConfig = section(OptimConfig(lr=1e-5), help="Critic optimiser.")
    ppo_mini_batch_size: int | None = option(None, help="Prompts per critic mini-batch; null = the "
                                             "actor's ppo_mini_batch_size.")
    ppo_micro_batch_size_per_gpu: int | None = option(None, help="Samples per critic forward/backward "
                                                      "pass on each rank; null = the actor's setting. "
                                                      "Ignored with use_dynamic_bsz.")
    ppo_epochs: int | None = option(None, help="Passes over the step's samples; null = the actor's ppo_epochs.")
    use_dynamic_bsz: bool = option(False, help="Cut critic micro-batches by tokens (ppo_max_token_len_per_gpu "
                                   "per update pass, forward_max_token_len_per_gpu per value pass) instead of "
                                   "rows; ppo_micro_batch_size_per_gpu is then ignored. Set it explicitly (verl "
                                   "defaults it to actor_rollout_ref.actor.use_dynamic_bsz).")
    ppo_max_token_len_per_gpu: int = option(32768, help="Token budget of one critic update micro-batch "
                                            "with use_dynamic_bsz.")
    forward_max_token_len_per_gpu: int | None = option(None, help="Token budget of one value pass with "
                                                       "use_dynamic_bsz; null = ppo_max_token_len_per_gpu.")
    shuffle: bool = option(False, help="Shuffle samples before splitting them into mini-batches.")
    cliprange_value: float = option(0.5, help="Clip range of the clipped value loss.")
    grad_clip: float = option(1.0, help="Clip the global gradient norm to this value.")
    loss_agg_mode: LossAggMode = option("token-mean", help="How per-token value losses become one number "
                                "(same choices as the actor's).")
    warmup_steps: int = option(0, help="RL steps that update only the critic before the actor starts.")
    fsdp_config: FSDPConfig = section(FSDPConfig, help="Critic sharding.")


@dataclass
class RewardModelModelConfig(ConfigNode):
    """A learned reward model's weights."""

    path: str | None = option(None, help="Hugging Face sequence-classification model id or folder.")
    tokenizer_path: str | None = option(None, help="Tokenizer id or folder; null = the model path.")
    trust_remote_code: bool = option(False, help="Allow custom modelling code from the model repository.")


@dataclass
class OverlongBufferConfig(ConfigNode):
    """DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", section 3.4): a length penalty
    added to the score of responses that end in the last `len` tokens before max_response_length."""

    enable: bool = option(False, help="Add the overlong penalty to training rewards (validation "
                          "scores stay unshaped).")
    len: int | None = option(None, help="Length of the penalty buffer in tokens (the paper's L_cache); "
                             "null = a fifth of data.max_response_length (the paper's 4096 of 20480).")
    penalty_factor: float = option(1.0, help="Penalty at exactly max_response_length; it rises "
                                   "linearly from 0 at the start of the buffer.")


@dataclass
class RewardModelConfig(ConfigNode):
    """Rewards: rule-based scoring, optionally plus a learned reward model."""

    enable: bool = option(False, help="Score responses with a learned reward model.")
    model: RewardModelModelConfig = section(RewardModelModelConfig, help="Reward model weights.")
    micro_batch_size_per_gpu: int | None = option(None, help="Samples per reward-model forward pass; null = all at once.")
    reward_manager: str = option("naive", help="How scores are computed and placed on tokens; naive "
                                 "= one rule-function call per sample, score on the last token.")
    max_length: int | None = option(None, help="Longest reward-model input in tokens; null = prompt + response limits.")
    weight: float = option(1.0, help="The reward model's score is multiplied by this and added to the rule rewards.")
    overlong_buffer: OverlongBufferConfig = section(OverlongBufferConfig, help="DAPO overlong reward "
                                                    "shaping (Yu et al. 2025).")


@dataclass
class CustomRewardFunctionConfig(ConfigNode):
    """A user reward function loaded from a Python file."""

    path: str | None = option(None, help="Python file defining the function; null = the built-in scorers.")
    name: str = option("compute_score", help="Function name inside that file.")
    reward_kwargs: dict = option({}, help="Extra keyword arguments passed to the function on every call.")


@dataclass
class RewardConfig(ConfigNode):
    """How rule rewards are combined and what a failing reward function does."""

    functions: list[dict] = option([], help="More reward functions, summed with weights: a list of "
                                   "{name, path, weight, kwargs}; without a path, name is a built-in scorer "
                                   "(e.g. format/think). custom_reward_function, when set, is added with weight 1.")
    on_error: Literal["raise", "zero"] = option("raise", help="A reward function that raises or returns "
                                                "NaN/None/a non-number: raise stops the step naming the "
                                                "function and sample; zero scores it 0 and counts it "
                                                "(reward/num_errors).")
    max_concurrency: int = option(64, help="Samples an async reward function scores at once.")


@dataclass
class KLControlConfig(ConfigNode):
    """Coefficient of the in-reward KL penalty."""

    type: Literal["fixed", "adaptive"] = option("fixed", help="fixed coefficient, or adaptive "
                                                "(Ziegler et al. 2019) steering the KL towards target_kl.")
    kl_coef: float = option(0.001, help="(Initial) KL coefficient.")
    horizon: int = option(10000, help="Adaptive controller horizon in samples.")
    target_kl: float = option(0.1, help="KL the adaptive controller aims for.")


@dataclass
class FilterGroupsConfig(ConfigNode):
    """DAPO's dynamic sampling (Yu et al. 2025, "DAPO", section 3.2): drop prompt groups whose
    responses all score the same (they carry no group-relative signal) and draw more prompt
    batches until the step has data.train_batch_size groups."""

    enable: bool = option(False, help="Filter groups and draw extra prompt batches (needs rollout.n >= 2).")
    metric: str = option("score", help="What must differ within a group: score (the summed token "
                         "scores, after any overlong penalty), or the name of a numeric key the reward "
                         "function returns in its dict (e.g. acc).")
    max_num_gen_batches: int = option(10, help="Most prompt batches drawn for one step, the first "
                                      "included; when reached, the step trains on the groups kept so "
                                      "far (filter_groups/cap_hit = 1 in the metrics).")


@dataclass
class AlgorithmConfig(ConfigNode):
    """Advantage estimation and the KL penalty in the reward."""

    gamma: float = option(1.0, help="Discount factor.")
    lam: float = option(1.0, help="GAE lambda.")
    adv_estimator: str = option("grpo", help="Advantage estimator by name: gae, grpo, rloo, "
                                "reinforce_plus_plus, reinforce_plus_plus_baseline, remax (docs/algorithms.md).")
    norm_adv_by_std_in_grpo: bool = option(True, help="Divide GRPO advantages by the group's std "
                                           "(false = Dr. GRPO, Liu et al. 2025).")
    use_kl_in_reward: bool = option(False, help="Subtract a KL(policy || reference) penalty from the reward.")
    kl_penalty: str = option("kl", help="KL estimator for the reward penalty: kl (k1), abs, mse (k2), "
                             "low_var_kl (k3).")
    kl_ctrl: KLControlConfig = section(KLControlConfig, help="KL coefficient control.")
    filter_groups: FilterGroupsConfig = section(FilterGroupsConfig, help="DAPO dynamic sampling "
                                                "(Yu et al. 2025).")


@dataclass
class TrainerSectionConfig(ConfigNode):
    """Run length, logging, placement and checkpoints."""

    total_epochs: int = option(1, help="Passes over the training prompts.")
    total_training_steps: int | None = option(None, aliases=("max_steps",), help="Stop after this "
                                              "many RL steps; null = total_epochs x steps per epoch.")
    project_name: str = option("verl", help="Project name for loggers.")
    experiment_name: str = option("run", help="Run name for loggers.")
    logger: str | list[str] = option(["console"], help="Loggers: any of console, jsonl, tensorboard, wandb.")
    log_val_generations: int = option(0, help="Validation samples (prompt, response, score) to log each validation.")
    nnodes: int = option(1, help="Machines in the job.")
    n_gpus_per_node: int = option(1, help="Devices (GPUs, or CPU ranks) per machine.")
    device: str = option("auto", help="cuda, cpu, or auto (cuda when available). Under torchrun each "
                         "rank uses the GPU of its LOCAL_RANK.")
    dist_timeout_s: float = option(600.0, help="Multi-rank jobs: a rank that dies, stops responding or "
                                   "fails ends the whole job within this many seconds, with one line "
                                   "naming the rank and the stage (see docs/distributed.md).")
    save_freq: int = option(-1, help="Save a checkpoint every this many steps and after the "
                           "last one; -1 = no checkpoints.")
    test_freq: int = option(-1, help="Validate every this many steps and after the last "
                           "one; -1 = never during training (see val_before_train).")
    val_before_train: bool = option(True, help="Validate once before the first step (and once "
                                    "after the last, so every run reports a before/after pair).")
    val_sampled: bool = option(False, help="Validation also samples with the training settings "
                               "(temperature, top_p, top_k) and logs val-aux/<source>/reward/sampled_mean@1.")
    resume_mode: str = option("auto", help="auto (resume from the latest checkpoint in "
                              "default_local_dir if any), disable, or resume_path (from resume_from_path).")
    resume_from_path: str | None = option(None, help="Checkpoint folder for resume_mode=resume_path.")
    default_local_dir: str = option("outputs/run", help="Folder for checkpoints and the exported model.")
    max_actor_ckpt_to_keep: int | None = option(None, help="Keep only the newest this many "
                                                "checkpoints; null = keep all.")
    progress_bar: bool = option(True, help="Show a progress bar.")
    balance_batch: bool = option(True, help="Before the updates, reorder each step's samples within every "
                                 "mini-batch so that each data-parallel rank gets a similar number of tokens "
                                 "(the slowest rank sets the pace); the mini-batches keep their samples. "
                                 "One process: nothing moves.")
    seed: int = option(1, help="Global seed (model init, sampling, dropout).")


@dataclass
class LoggerConfig(ConfigNode):
    """The tutorial's short form of the logging keys: logger=dict(type="wandb", project="my-rl")."""

    type: str | list[str] | None = option(None, help="Short form of trainer.logger: one logger name or a "
                                          "list (console, jsonl, tensorboard, wandb); replaces "
                                          "trainer.logger when set; null = use trainer.logger.")
    project: str | None = option(None, help="Short form of trainer.project_name; wins when set.")
    name: str | None = option(None, help="Short form of trainer.experiment_name; wins when set.")


@dataclass
class SFTWarmstartConfig(ConfigNode):
    """Supervised warm start of the built-in tiny model (used only for the built-in demo)."""

    enable: bool = option(True, help="Run the warm start before RL when the built-in model and task are used.")
    target_accuracy: float = option(0.38, help="Stop once held-out sampled accuracy (temperature 1) "
                                    "reaches this, leaving RL room to improve.")
    max_steps: int = option(3000, help="Most supervised steps.")
    lr: float = option(1e-3, help="Supervised learning rate.")
    batch_size: int = option(64, help="Examples per supervised step.")
    eval_every: int = option(10, help="Check accuracy every this many steps (the accuracy jumps "
                             "quickly once the model learns carrying, so check often).")
    eval_samples: int = option(200, help="Prompts used for each accuracy check.")


@dataclass
class TrainerConfig(ConfigNode):
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

    def validate(self, dp_size: int | None = None) -> None:
        """Raise ConfigError for inconsistent settings (batch-size arithmetic shown in the message).

        `dp_size` is the number of data-parallel ranks; None = trainer.nnodes x trainer.n_gpus_per_node.
        """
        checks.validate(self, dp_size)

    def derived_sizes(self, dp_size: int | None = None, role: Literal["actor", "critic"] = "actor") -> dict[str, int]:
        """Batch sizes in prompts and samples for logging, e.g. `samples_per_mini_batch`."""
        return checks.derived_sizes(self, dp_size, role)

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
        return checks.critic_enabled(self)


HEADER = """\
verl PPO-family trainer: default configuration, one comment per key.
Generated from verl/config/schema.py; do not edit by hand. Regenerate with:
    python -m verl.config > verl/config/ppo_trainer.yaml
Override any key on the command line as a.b.c=value, e.g. actor_rollout_ref.actor.optim.lr=1e-6"""


def render_default_yaml() -> str:
    """The text of `verl/config/ppo_trainer.yaml`: all defaults with their help as comments."""
    return render_yaml(TrainerConfig(), HEADER)


if __name__ == "__main__":
    print(render_default_yaml(), end="")
