"""The PPO-family trainer config: `TrainerConfig` and its sections, under verl's key names.

Defaults suit real models; the built-in demo layers its own preset on top. The commented
default YAML shipped as `verl/config/ppo_trainer.yaml` is generated from this file:

    python -m verl.config > verl/config/ppo_trainer.yaml

(`python -m verl.config.schema` prints the same text; a unit test fails when the committed file and this schema disagree).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from verl.config import checks, compat
from verl.config.compat import Section, strategy_option, verl_option, verl_section_alias
from verl.config.node import option, section
from verl.config.render import render_yaml
from verl.config.schema_actor import (ActorRolloutRefConfig, EngineFSDPConfig, HFModelVerlKeys, LossAggMode,
                                      OptimConfig)


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
    train_max_samples: int = verl_option(-1, help="Use at most this many training prompts; -1 = all.",
                                         inert=False, why="the whole file is used here",
                                         refuse_if=lambda v: v != -1, when="unless -1",
                                         instead="cut the file (e.g. pandas: df.head(n).to_parquet(...))")
    val_max_samples: int = verl_option(-1, help="Use at most this many validation prompts; -1 = all.",
                                       inert=False, why="the whole file is used here",
                                       refuse_if=lambda v: v != -1, when="unless -1",
                                       instead="cut the file (e.g. pandas: df.head(n).to_parquet(...))")
    gen_batch_size: int | None = option(None, help="verl: prompts per generation batch of dynamic sampling; "
                                        "here prompts are drawn data.train_batch_size at a time, so validate() "
                                        "refuses another value.")
    use_shm: bool = verl_option(False, help="Copy the data files to /dev/shm first.", why="files are read "
                                "where they are", warn_if=bool, when="to true")
    tool_config_path: str | None = verl_option(None, help="Tools of multi-turn rollouts.", inert=False,
                                               why="multi-turn / tool rollouts are not implemented",
                                               refuse_if=lambda v: v is not None, when="unless null")
    function_tool_path: str | None = verl_option(None, help="Function tools of multi-turn rollouts.", inert=False,
                                                 why="multi-turn / tool rollouts are not implemented",
                                                 refuse_if=lambda v: v is not None, when="unless null")
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
    custom_cls: dict = verl_option({"path": None, "name": None}, help="A custom dataset class.", inert=False,
                                   why="custom dataset classes are not supported",
                                   refuse_if=lambda v: v.get("path") is not None, when="with a path",
                                   instead="convert the data to a parquet/jsonl file with a prompt column "
                                   "(docs/data.md)", keys=("path",))
    image_key: str = verl_option("images", help="Column of the prompts' images.",
                                 why="vision-language models are not supported; the column is not read")
    video_key: str = verl_option("videos", help="Column of the prompts' videos.",
                                 why="vision-language models are not supported; the column is not read")
    audio_key: str = verl_option("audios", help="Column of the prompts' audio.",
                                 why="audio inputs are not supported; the column is not read")
    image_patch_size: int = verl_option(14, help="Vision patch size.", why="vision-language models are not supported")
    return_multi_modal_inputs: bool = verl_option(True, help="Return processed multimodal inputs.",
                                                  why="vision-language models are not supported")
    mm_processor_kwargs: dict = verl_option({}, help="Keyword arguments of the multimodal processor.",
                                            why="vision-language models are not supported")


@dataclass
class _CriticModel(Section):
    """The keys of CriticModelConfig that work here."""

    path: str | None = option(None, help="Hugging Face model id or folder; null = the actor's model.")
    tokenizer_path: str | None = option(None, help="Tokenizer id or folder; null = the model path.")
    trust_remote_code: bool = option(False, help="Allow custom modelling code from the model repository.")
    override_config: dict = option({}, help="Free-form keys set on the Hugging Face model config before loading.")
    enable_gradient_checkpointing: bool = option(False, help="Recompute activations in the backward pass.")
    use_remove_padding: bool = option(False, help="Run value and update passes on packed sequences (see "
                                      "actor_rollout_ref.model.use_remove_padding; checked at start, unsupported "
                                      "models fail with an error).")


@dataclass
class CriticModelConfig(HFModelVerlKeys, _CriticModel):
    """The value model (policy backbone plus a scalar value head)."""


@dataclass
class CriticConfig(Section):
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
    warmup_steps: int = option(0, help="RL steps that update only the critic before the actor starts "
                               "(verl: trainer.critic_warmup, which validate() moves here).")
    fsdp_config: EngineFSDPConfig = verl_section_alias(EngineFSDPConfig, aliases=("fsdp",),
                                                       help="Critic sharding (verl's name: critic.fsdp).")
    # verl's other critic keys.
    rollout_n: int | None = verl_option(None, help="verl copies rollout.n here.", why="rollout.n is read")
    strategy: str = strategy_option("Backend of the critic: fsdp or fsdp2 (both run this project's FSDP2).")
    ppo_micro_batch_size: int | None = option(None, help="verl's older global form of "
                                              "ppo_micro_batch_size_per_gpu; validate() divides it by the "
                                              "data-parallel size and moves it there.")
    forward_micro_batch_size: int | None = option(None, help="verl's older global form of "
                                                  "forward_micro_batch_size_per_gpu; validate() divides it by the "
                                                  "data-parallel size and moves it there.")
    forward_micro_batch_size_per_gpu: int | None = verl_option(
        None, help="Samples per value pass on each rank.", why="value passes use ppo_micro_batch_size_per_gpu "
        "(or forward_max_token_len_per_gpu with use_dynamic_bsz)", warn_if=lambda v: v is not None,
        when="to a number")
    ulysses_sequence_parallel_size: int = verl_option(
        1, help="Ulysses sequence-parallel group size.", inert=False, why="sequence parallelism is not "
        "implemented", refuse_if=lambda v: v != 1, when="unless 1",
        instead="use use_dynamic_bsz / ppo_max_token_len_per_gpu to fit long sequences")
    loss_scale_factor: float | None = verl_option(None, help="Constant divisor of seq-mean-token-sum-norm.",
                                                  inert=False, why="seq-mean-token-sum-norm divides by "
                                                  "data.max_response_length here", refuse_if=lambda v: v is not None,
                                                  when="unless null")
    data_loader_seed: int = verl_option(42, help="Seed of the mini-batch shuffling.",
                                        why="trainer.seed seeds the shuffling here")
    checkpoint: dict = verl_option(compat.checkpoint_defaults(), help="What a checkpoint holds.",
                                   why="a checkpoint holds the model, the optimiser and the trainer state here",
                                   warn_if=lambda v: bool(v.get("async_save")), when="async_save=true",
                                   keys=("async_save",))
    profiler: dict = verl_option(compat.profiler_defaults(), help="verl's per-role profiler.",
                                 why="profiling is not implemented", warn_if=lambda v: bool(v.get("enable")),
                                 when="enable=true", keys=("enable",))


@dataclass
class RewardModelModelConfig(Section):
    """A learned reward model's weights."""

    path: str | None = option(None, help="Hugging Face sequence-classification model id or folder.")
    tokenizer_path: str | None = option(None, help="Tokenizer id or folder; null = the model path.")
    trust_remote_code: bool = option(False, help="Allow custom modelling code from the model repository.")
    external_lib: str | None = verl_option(None, help="A Python module imported to register custom models.",
                                           inert=False, why="no module is imported for you",
                                           refuse_if=lambda v: v is not None, when="unless null",
                                           instead="use trust_remote_code=true for models with their own code")


@dataclass
class OverlongBufferConfig(Section):
    """DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", section 3.4): a length penalty
    added to the score of responses that end in the last `len` tokens before max_response_length."""

    enable: bool = option(False, help="Add the overlong penalty to training rewards (validation "
                          "scores stay unshaped).")
    len: int | None = option(None, help="Length of the penalty buffer in tokens (the paper's L_cache); "
                             "null = a fifth of data.max_response_length (the paper's 4096 of 20480).")
    penalty_factor: float = option(1.0, help="Penalty at exactly max_response_length; it rises "
                                   "linearly from 0 at the start of the buffer.")


@dataclass
class RewardModelConfig(Section):
    """Rewards: rule-based scoring, optionally plus a learned reward model."""

    enable: bool = option(False, help="Score responses with a learned reward model.")
    model: RewardModelModelConfig = section(RewardModelModelConfig, help="Reward model weights.")
    micro_batch_size_per_gpu: int | None = option(None, help="Samples per reward-model forward pass; null = all at once.")
    reward_manager: str = verl_option("naive", help="How scores are computed and placed on tokens; naive "
                                      "= one rule-function call per sample, score on the last token; dapo "
                                      "(naive plus overlong_buffer below) and prime (naive in parallel) give "
                                      "the same scores here.", inert=False, why="only the naive scoring is "
                                      "implemented", refuse_if=lambda v: v not in ("naive", "dapo", "prime"),
                                      when="for anything but naive / dapo / prime",
                                      instead="write the logic into custom_reward_function")
    max_length: int | None = option(None, help="Longest reward-model input in tokens; null = prompt + response limits.")
    weight: float = option(1.0, help="The reward model's score is multiplied by this and added to the rule rewards.")
    overlong_buffer: OverlongBufferConfig = section(OverlongBufferConfig, help="DAPO overlong reward "
                                                    "shaping (Yu et al. 2025).")
    # verl's other reward-model keys.
    reward_kwargs: dict = option({}, help="verl's keyword arguments of the reward manager. Its DAPO form "
                                 "overlong_buffer_cfg.{enable, len, penalty_factor} is moved to overlong_buffer by "
                                 "validate(); other entries have no effect here (a warning says so).")
    strategy: str = strategy_option("Backend of the reward model: fsdp or fsdp2 (it runs as a plain forward "
                                    "pass here).")
    num_workers: int | None = verl_option(None, help="Reward workers.", why="rewards are computed in the "
                                          "trainer process (see reward.max_concurrency)")
    enable_resource_pool: bool | None = verl_option(None, help="Put the reward model on its own devices.",
                                                    why="the reward model shares the trainer's devices here",
                                                    warn_if=bool, when="to true")
    n_gpus_per_node: int | None = verl_option(None, help="Devices per machine of the reward model's pool.",
                                              why="the reward model shares the trainer's devices here")
    nnodes: int | None = verl_option(None, help="Machines of the reward model's pool.",
                                     why="the reward model shares the trainer's devices here")
    launch_reward_fn_async: bool = verl_option(False, help="Score the step's rewards in the background.",
                                               why="rewards are scored before the update, concurrently for "
                                               "async functions (reward.max_concurrency)")
    reward_loop_source: str | None = verl_option(None, help="Where verl's reward loop comes from.", inert=False,
                                                 why="verl's reward loop is not implemented",
                                                 refuse_if=lambda v: v is not None, when="unless null",
                                                 instead="use custom_reward_function / reward.functions")
    reward_loop_module_path: str | None = verl_option(None, help="Module of a custom reward loop.", inert=False,
                                                      why="verl's reward loop is not implemented",
                                                      refuse_if=lambda v: v is not None, when="unless null",
                                                      instead="use custom_reward_function / reward.functions")
    reward_loop_class_name: str | None = verl_option(None, help="Class of a custom reward loop.", inert=False,
                                                     why="verl's reward loop is not implemented",
                                                     refuse_if=lambda v: v is not None, when="unless null",
                                                     instead="use custom_reward_function / reward.functions")
    rollout: dict = verl_option(compat.reward_rollout_defaults(), help="Serving engine of a generative reward "
                                "model.", why="the reward model "
                                "is a sequence classifier run as a forward pass here")


@dataclass
class CustomRewardFunctionConfig(Section):
    """A user reward function loaded from a Python file."""

    path: str | None = option(None, help="Python file defining the function; null = the built-in scorers.")
    name: str = option("compute_score", help="Function name inside that file.")
    reward_kwargs: dict = option({}, help="Extra keyword arguments passed to the function on every call.")


@dataclass
class RewardManagerConfig(Section):
    """verl's newer reward-manager selection."""

    source: str = verl_option("register", help="Where the manager comes from: register (by name) or importlib.",
                              inert=False, why="custom reward managers are not supported",
                              refuse_if=lambda v: v != "register", when="for anything but register",
                              instead="write the logic into custom_reward_function")
    name: str = option("naive", help="Manager name; validate() moves it to reward_model.reward_manager.")
    module: dict = verl_option({"path": None, "name": "custom_reward_manager"}, inert=False,
                               help="Module of a custom reward manager.", why="custom reward managers are not "
                               "supported", refuse_if=lambda v: v.get("path") is not None, when="with a path",
                               instead="write the logic into custom_reward_function", keys=("path",))


@dataclass
class NewRewardModelConfig(Section):
    """verl's newer reward-model keys."""

    enable: bool = option(False, help="validate() moves it to reward_model.enable.")
    model_path: str | None = option(None, help="validate() moves it to reward_model.model.path.")
    enable_resource_pool: bool = verl_option(False, help="Put the reward model on its own devices.",
                                             why="the reward model shares the trainer's devices here",
                                             warn_if=bool, when="to true")
    n_gpus_per_node: int = verl_option(8, help="Devices per machine of the reward model's pool.",
                                       why="the reward model shares the trainer's devices here")
    nnodes: int = verl_option(0, help="Machines of the reward model's pool.",
                              why="the reward model shares the trainer's devices here")
    rollout: dict = verl_option(compat.reward_rollout_defaults(), help="Serving engine of the reward model.", why="the reward model is a sequence classifier run as a "
                                "forward pass here")


@dataclass
class RewardConfig(Section):
    """How rule rewards are combined and what a failing reward function does."""

    functions: list[dict] = option([], help="More reward functions, summed with weights: a list of "
                                   "{name, path, weight, kwargs}; without a path, name is a built-in scorer "
                                   "(e.g. format/think). custom_reward_function, when set, is added with weight 1.")
    on_error: Literal["raise", "zero"] = option("raise", help="A reward function that raises or returns "
                                                "NaN/None/a non-number: raise stops the step naming the "
                                                "function and sample; zero scores it 0 and counts it "
                                                "(reward/num_errors).")
    max_concurrency: int = option(64, help="Samples an async reward function scores at once.")
    # verl's newer reward section; validate() moves what is set here to the keys this project reads.
    num_workers: int = verl_option(8, help="Reward workers.", why="rewards are computed in the trainer "
                                   "process (see max_concurrency)")
    custom_reward_function: CustomRewardFunctionConfig = section(
        CustomRewardFunctionConfig(name="compute_score"), help="verl's newer place of the top-level "
        "custom_reward_function; validate() moves a path given here there.")
    reward_manager: RewardManagerConfig = section(RewardManagerConfig, help="verl's newer place of "
                                                  "reward_model.reward_manager.")
    reward_model: NewRewardModelConfig = section(NewRewardModelConfig, help="verl's newer place of the "
                                                 "reward_model.enable / model.path keys.")
    sandbox_fusion: dict = verl_option({"url": None, "max_concurrent": 64, "memory_limit_mb": 1024}, inert=False,
                                       help="A SandboxFusion service for code rewards.", why="SandboxFusion is "
                                       "not used; code rewards run in the built-in sandbox (docs/code_reward.md)",
                                       refuse_if=lambda v: v.get("url") is not None, when="with a url", keys=("url",))


@dataclass
class KLControlConfig(Section):
    """Coefficient of the in-reward KL penalty."""

    type: Literal["fixed", "adaptive"] = option("fixed", help="fixed coefficient, or adaptive "
                                                "(Ziegler et al. 2019) steering the KL towards target_kl.")
    kl_coef: float = option(0.001, help="(Initial) KL coefficient.")
    horizon: int = option(10000, help="Adaptive controller horizon in samples.")
    target_kl: float = option(0.1, help="KL the adaptive controller aims for.")


@dataclass
class FilterGroupsConfig(Section):
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
    max_inflight_gen_batches: int = verl_option(1, help="Prompt batches generated at once.",
                                                why="extra batches are drawn one at a time here")


@dataclass
class RolloutCorrectionConfig(Section):
    """verl's rollout correction. Token-level truncated importance sampling (rollout_is=token) is
    actor_rollout_ref.actor.rollout_is_correction here; validate() moves it there."""

    rollout_is: str | None = verl_option(None, help="Importance-sampling level: token, or null = off.",
                                         inert=False, why="only token-level importance sampling is implemented",
                                         refuse_if=lambda v: v not in (None, "token"), when="for anything but "
                                         "token / null")
    rollout_is_threshold: float | str = option(2.0, help="Cap of the importance ratio; moved to "
                                               "actor_rollout_ref.actor.rollout_is_threshold with rollout_is=token "
                                               "(verl's two-sided 'low_high' form is refused).")
    rollout_rs: str | None = verl_option(None, help="Rejection sampling of samples far off-policy.", inert=False,
                                         why="rollout rejection sampling is not implemented",
                                         refuse_if=lambda v: v is not None, when="unless null")
    rollout_rs_threshold: str | float | None = verl_option(None, help="Bounds of the rejection sampling.",
                                                           why="rollout rejection sampling is not implemented "
                                                           "(rollout_rs is refused)")
    bypass_mode: bool = verl_option(False, help="Skip the old log-prob pass and use the rollout's.", inert=False,
                                    why="the old log-probs are always recomputed here", refuse_if=bool,
                                    when="when true")
    loss_type: str = verl_option("ppo_clip", help="Loss of bypass_mode.", inert=False,
                                 why="the loss is the actor's policy_loss.loss_mode here",
                                 refuse_if=lambda v: v != "ppo_clip", when="for anything but ppo_clip")
    rollout_is_batch_normalize: bool = verl_option(False, help="Normalise the importance weights per batch.",
                                                   inert=False, why="not implemented", refuse_if=bool,
                                                   when="when true")


@dataclass
class AlgorithmConfig(Section):
    """Advantage estimation and the KL penalty in the reward."""

    gamma: float = option(1.0, help="Discount factor.")
    lam: float = option(1.0, help="GAE lambda.")
    adv_estimator: str = option("grpo", help="Advantage estimator by name: gae, grpo, rloo, "
                                "reinforce_plus_plus, reinforce_plus_plus_baseline, remax, gpg (docs/algorithms.md).")
    norm_adv_by_std_in_grpo: bool = option(True, help="Divide GRPO advantages by the group's std "
                                           "(false = Dr. GRPO, Liu et al. 2025).")
    use_kl_in_reward: bool = option(False, help="Subtract a KL(policy || reference) penalty from the reward.")
    kl_penalty: str = option("kl", help="KL estimator for the reward penalty: kl (k1), abs, mse (k2), "
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
    gdpo_reward_keys: list[str] | None = verl_option(None, help="GDPO: reward components normalised apart.",
                                                     inert=False, why="the GDPO estimator is not implemented",
                                                     refuse_if=lambda v: v is not None, when="unless null")


@dataclass
class TrainerSectionConfig(Section):
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
    # verl's other trainer keys.
    critic_warmup: int = option(0, help="verl's name of critic.warmup_steps; validate() moves it there.")
    max_critic_ckpt_to_keep: int | None = option(None, help="A checkpoint holds the actor and the critic "
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
                                                        "seconds.", why="there is no Ray here "
                                                        "(trainer.dist_timeout_s bounds a lost rank)")
    use_v1: bool = verl_option(True, help="verl's v1 trainer loop.", why="one trainer loop here")
    v1: dict = verl_option(compat.trainer_v1_defaults(), inert=False, help="verl's v1 trainer modes.",
                           why="training is synchronous (on-policy) here",
                           refuse_if=lambda v: v.get("trainer_mode", "sync") != "sync",
                           when="unless trainer_mode=sync", keys=("trainer_mode",))


@dataclass
class DistillationConfig(Section):
    """verl's on-policy distillation, refused when enabled."""

    enabled: bool = verl_option(False, help="Distil from teacher models.", inert=False,
                                why="on-policy distillation is not implemented", refuse_if=bool, when="when true")
    distillation_loss: dict = verl_option(compat.distillation_defaults()["distillation_loss"],
                                          help="Distillation loss.", why="distillation is not implemented")
    n_gpus_per_node: int = verl_option(8, help="Devices per machine of the teachers.",
                                       why="distillation is not implemented")
    nnodes: int = verl_option(0, help="Machines of the teachers.", why="distillation is not implemented")
    teacher_models: dict = verl_option(compat.distillation_defaults()["teacher_models"], help="Teacher models.",
                                       why="distillation is not implemented")
    teacher_key: str = verl_option("data_source", help="Column that picks a prompt's teacher.",
                                   why="distillation is not implemented")


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
    target_accuracy: float = option(0.38, help="Stop once held-out sampled accuracy (temperature 1) "
                                    "reaches this, leaving RL room to improve.")
    max_steps: int = option(3000, help="Most supervised steps.")
    lr: float = option(1e-3, help="Supervised learning rate.")
    batch_size: int = option(64, help="Examples per supervised step.")
    eval_every: int = option(10, help="Check accuracy every this many steps (the accuracy jumps "
                             "quickly once the model learns carrying, so check often).")
    eval_samples: int = option(200, help="Prompts used for each accuracy check.")


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
                                    why=lambda v: (f"the {compat.BACKENDS.get(v, v)} backend is not supported"),
                                    when="for anything but dp", instead=compat.FSDP_INSTEAD)
    ray_kwargs: dict = verl_option(compat.ray_kwargs_defaults(), help="Arguments of ray.init.",
                                   why="there is no Ray here; launch with torchrun for several processes "
                                   "(docs/distributed.md)")
    global_profiler: dict = verl_option(compat.global_profiler_defaults(), help="verl's global profiler.",
                                        why="profiling is not implemented",
                                        warn_if=lambda v: v.get("tool") is not None or bool(v.get("steps")),
                                        when="with a tool or steps", keys=("tool", "steps"))
    transfer_queue: dict = verl_option(compat.transfer_queue_defaults(), help="verl's TransferQueue data plane.",
                                       why="data moves in-process here", warn_if=lambda v: bool(v.get("enable")),
                                       when="enable=true", keys=("enable",))
    skip: dict = verl_option(compat.skip_defaults(), help="verl's rollout caching for debugging.",
                             why="rollouts are never cached",
                             warn_if=lambda v: any(isinstance(x, dict) and x.get("enable") for x in v.values()),
                             when="with enable=true")
    sandbox_fusion: dict = verl_option({"url": None, "max_concurrent": None, "memory_limit_mb": None}, inert=False,
                                       help="verl's older place of reward.sandbox_fusion.", why="SandboxFusion is "
                                       "not used; code rewards run in the built-in sandbox (docs/code_reward.md)",
                                       refuse_if=lambda v: v.get("url") is not None, when="with a url", keys=("url",))
    distillation: DistillationConfig = section(DistillationConfig, help="verl's on-policy distillation.")

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
