"""The `critic`, `reward_model`, `custom_reward_function` and `reward` sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from verl.config import verl_defaults, verl_rules
from verl.config.verl_rules import Section, strategy_option, verl_option
from verl.config.node import option, section
from verl.config.schema_actor import (EngineFSDPConfig, HFModelVerlKeys, LossAggMode, OptimConfig,
                                      TrainedRoleVerlKeys)


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
class CriticLoraKeys(Section):
    """verl's LoRA keys of the critic model: adapters on the value model's backbone (PEFT), the new
    value head trained in full."""

    lora_rank: int = option(0, bounds=">= 0", help="LoRA rank of the value model: above 0, adapters of this rank "
                            "go on target_modules and only they and the value head train; 0 = train all weights.")
    lora_alpha: int = option(16, bounds="> 0", help="LoRA alpha of the value model: the adapters' output is "
                             "scaled by lora_alpha / lora_rank.")
    target_modules: str | list[str] = option("all-linear", help="Modules of the value model that get adapters: "
                                             "'all-linear' (every linear layer but the value head) or a list of "
                                             "names such as [q_proj, v_proj]; linear layers only.")
    exclude_modules: str | list[str] | None = option(None, help="Modules of the value model left without "
                                                     "adapters: a regex over full module names or a list of names.")
    lora_adapter_path: str | None = verl_option(None, help="A trained LoRA adapter for the value model.",
                                                inert=False, why="a PEFT adapter does not hold the value head, "
                                                "which the critic needs", refuse_if=lambda v: v is not None,
                                                when="unless null", instead="resume the run from its checkpoint "
                                                "(it holds adapters and head), or set critic.model.lora_rank to "
                                                "start new adapters")
    lora: dict = verl_option(verl_defaults.lora_defaults(), help="The Megatron-Bridge form of the LoRA settings.",
                             inert=False, why="critic LoRA is set by lora_rank, lora_alpha, target_modules and "
                             "exclude_modules here", refuse_if=lambda v: bool(v.get("rank")) or
                             v.get("adapter_path") is not None,
                             when="with a rank above 0 or an adapter_path", instead="set critic.model.lora_rank",
                             keys=("rank", "adapter_path"))


@dataclass
class CriticModelConfig(CriticLoraKeys, HFModelVerlKeys, _CriticModel):
    """The value model (policy backbone plus a scalar value head)."""


@dataclass
class _CriticCore(Section):
    """The main fields of CriticConfig."""

    enable: bool | None = option(None, help="Train a critic; null = exactly when the advantage "
                                 "estimator needs one (gae).")
    model: CriticModelConfig = section(CriticModelConfig, help="Value model.")
    optim: OptimConfig = section(OptimConfig(lr=1e-5), help="Critic optimiser.")
    ppo_mini_batch_size: int | None = option(None, bounds=">= 1", help="Prompts per critic mini-batch; null = the "
                                             "actor's ppo_mini_batch_size.")
    ppo_micro_batch_size_per_gpu: int | None = option(None, bounds=">= 1", help="Samples per critic forward/backward "
                                                      "pass on each rank; null = the actor's setting. "
                                                      "Ignored with use_dynamic_bsz.")
    ppo_epochs: int | None = option(None, bounds=">= 1", help="Passes over the step's samples; null = the actor's ppo_epochs.")
    use_dynamic_bsz: bool = option(False, help="Cut critic micro-batches by tokens (ppo_max_token_len_per_gpu "
                                   "per update pass, forward_max_token_len_per_gpu per value pass) instead of "
                                   "rows; ppo_micro_batch_size_per_gpu is then ignored. Set it explicitly (verl "
                                   "defaults it to actor_rollout_ref.actor.use_dynamic_bsz).")
    ppo_max_token_len_per_gpu: int = option(32768, bounds=">= 1", help="Token budget of one critic update micro-batch "
                                            "with use_dynamic_bsz.")
    forward_max_token_len_per_gpu: int | None = option(None, bounds=">= 1", help="Token budget of one value pass with "
                                                       "use_dynamic_bsz; null = ppo_max_token_len_per_gpu.")
    shuffle: bool = option(False, help="Shuffle samples before splitting them into mini-batches.")
    cliprange_value: float = option(0.5, bounds="> 0", help="Clip range of the clipped value loss.")
    grad_clip: float = option(1.0, bounds="> 0", help="Clip the global gradient norm to this value.")
    loss_agg_mode: LossAggMode = option("token-mean", help="How per-token value losses become one number "
                                "(same choices as the actor's).")
    warmup_steps: int = option(0, bounds=">= 0", help="RL steps that update only the critic before the actor starts "
                               "(verl: trainer.critic_warmup, which validate() moves here).")
    fsdp_config: EngineFSDPConfig = section(EngineFSDPConfig, aliases=("fsdp",),
                                            help="Critic sharding (verl's name: critic.fsdp).")
    # verl's other critic keys.
    rollout_n: int | None = verl_option(None, help="verl copies rollout.n here.", why="rollout.n is read")
    strategy: str = strategy_option("Backend of the critic: fsdp or fsdp2 (both run this project's FSDP2).")
    ppo_micro_batch_size: int | None = option(None, bounds=">= 1", help="verl's older global form of "
                                              "ppo_micro_batch_size_per_gpu; validate() divides it by the "
                                              "data-parallel size and moves it there.")
    forward_micro_batch_size: int | None = option(None, bounds=">= 1", help="verl's older global form of "
                                                  "forward_micro_batch_size_per_gpu; validate() divides it by the "
                                                  "data-parallel size and moves it there.")
    forward_micro_batch_size_per_gpu: int | None = verl_option(
        None, help="Samples per value pass on each rank.", why="value passes use ppo_micro_batch_size_per_gpu "
        "(or forward_max_token_len_per_gpu with use_dynamic_bsz)", warn_if=lambda v: v is not None,
        when="to a number")
    ulysses_sequence_parallel_size: int = verl_option(
        1, help="Ulysses sequence-parallel group size.", why=verl_rules.NO_SEQUENCE_PARALLEL, warn_if=lambda v: v != 1,
        when="above 1")
    profiler: dict = verl_option(verl_defaults.profiler_defaults(), help="verl's per-role profiler.",
                                 why="profiling is not implemented", warn_if=lambda v: bool(v.get("enable")),
                                 when="enable=true", keys=("enable",))


@dataclass
class CriticConfig(TrainedRoleVerlKeys, _CriticCore):
    """The value function used by GAE."""


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
    len: int | None = option(None, bounds=">= 1", help="Length of the penalty buffer in tokens (the paper's L_cache); "
                             "null = a fifth of data.max_response_length (the paper's 4096 of 20480).")
    penalty_factor: float = option(1.0, bounds=">= 0", help="Penalty at exactly max_response_length; it rises "
                                   "linearly from 0 at the start of the buffer.")


@dataclass
class RewardModelConfig(Section):
    """Rewards: rule-based scoring, optionally plus a learned reward model."""

    enable: bool = option(False, help="Score responses with a learned reward model.")
    model: RewardModelModelConfig = section(RewardModelModelConfig, help="Reward model weights.")
    micro_batch_size_per_gpu: int | None = option(None, bounds=">= 1", help="Samples per reward-model forward pass; null = all at once.")
    reward_manager: str = verl_option("naive", help="How scores are computed and placed on tokens; naive "
                                      "= one rule-function call per sample, score on the last token; batch = "
                                      "custom_reward_function called once per step with lists (data_sources, "
                                      "solution_strs, ground_truths, extra_infos), one score per response back; dapo "
                                      "(naive plus overlong_buffer below), prime (naive in parallel) and gdpo "
                                      "(naive; a dict's keys reach the batch as reward_extra/<key>, which "
                                      "adv_estimator=gdpo reads) give the same scores here.", inert=False,
                                      why="only the naive and batch scoring are implemented",
                                      refuse_if=lambda v: v not in ("naive", "batch", "dapo", "prime", "gdpo"),
                                      when="for anything but naive / batch / dapo / prime / gdpo",
                                      instead="write the logic into custom_reward_function")
    max_length: int | None = option(None, bounds=">= 1", help="Longest reward-model input in tokens; null = prompt + response limits.")
    weight: float = option(1.0, help="The reward model's score is multiplied by this and added to the rule "
                           "rewards (a negative weight makes it a penalty).")
    overlong_buffer: OverlongBufferConfig = section(OverlongBufferConfig, help="DAPO overlong reward "
                                                    "shaping (Yu et al. 2025).")
    # verl's other reward-model keys.
    reward_kwargs: dict = option({}, help="verl's keyword arguments of the reward manager. Its DAPO form "
                                 "overlong_buffer_cfg.{enable, len, penalty_factor} is moved to overlong_buffer by "
                                 "validate(); with reward_manager=batch the entries are passed to "
                                 "custom_reward_function at every call, as verl's batch manager passes them; with "
                                 "dapo, max_resp_len must equal data.max_response_length; other entries have no "
                                 "effect here (a warning says so).")
    strategy: str = strategy_option("Backend of the reward model: fsdp or fsdp2 (it runs as a plain forward "
                                    "pass here).")
    num_workers: int | None = verl_option(None, help="Reward workers.", why="rewards are computed in the "
                                          "trainer process (see reward.max_concurrency)")
    enable_resource_pool: bool | None = option(None, help="trainer.backend=ray: put the reward model on a pool of "
                                               "its own (reward_pool), of nnodes x n_gpus_per_node ranks; without "
                                               "Ray it shares the trainer's devices.")
    n_gpus_per_node: int | None = option(None, bounds=">= 1", help="Ranks per machine of the reward model's pool; "
                                         "null = trainer.n_gpus_per_node.")
    nnodes: int | None = option(None, bounds=">= 0", help="Machines of the reward model's pool; null or 0 = 1.")
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
    rollout: dict = verl_option(verl_defaults.reward_rollout_defaults(), help="Serving engine of a generative reward "
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
    rollout: dict = verl_option(verl_defaults.reward_rollout_defaults(), help="Serving engine of the reward model.", why="the reward model is a sequence classifier run as a "
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
    max_concurrency: int = option(64, bounds=">= 1", help="Samples an async reward function scores at once.")
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
