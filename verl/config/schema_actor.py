"""The `actor_rollout_ref` sections: policy model, actor (PPO update), reference and rollout.

Batch sizes carry their unit in the help text: *prompts* (before sampling n responses each) or
*samples* (prompt-response pairs, i.e. prompts x rollout.n). They are checked together in
`verl.config.cross_checks`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from verl.config import verl_defaults, verl_rules
from verl.config.verl_rules import Section, strategy_option, verl_option
from verl.config.node import option, section
from verl.config.schema_rollout import RolloutConfig, ValKwargsConfig  # noqa: F401  (ValKwargsConfig re-exported)

# The KL estimators by name (verl.algorithms.KL_KINDS implements them; a unit test keeps the two equal).
KL_ESTIMATOR_NAMES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
Dtype = Literal["float32", "fp32", "bfloat16", "bf16", "float16", "fp16", "auto"]
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@dataclass
class HFModelVerlKeys(Section):
    """verl's other Hugging Face model keys, shared by the policy and the critic model: accepted with
    no effect, or refused (see verl.config.verl_rules)."""

    hf_config_path: str | None = verl_option(None, help="Hugging Face config to use instead of the model's own.",
                                             inert=False, why="the model's own config.json is always used",
                                             refuse_if=lambda v: v is not None, when="unless null",
                                             instead="change single values with override_config")
    custom_chat_template: str | None = verl_option(
        None, help="A Jinja chat template replacing the tokenizer's.", inert=False,
        why="prompts are formatted with the tokenizer's own template", refuse_if=lambda v: v is not None,
        when="unless null", instead="put the template in the tokenizer folder (tokenizer_config.json, "
        "chat_template) and point tokenizer_path at it")
    external_lib: str | None = verl_option(None, help="A Python module imported to register custom models.",
                                           inert=False, why="no module is imported for you",
                                           refuse_if=lambda v: v is not None, when="unless null",
                                           instead="use trust_remote_code=true for models with their own code")
    use_shm: bool = verl_option(False, help="Copy the model to /dev/shm before loading.",
                                why="weights load from path as they are", warn_if=bool, when="to true")
    enable_activation_offload: bool = verl_option(False, help="Offload activations to CPU memory.",
                                                  why="a memory saving only; activations stay on the device",
                                                  warn_if=bool, when="to true")
    use_liger: bool = verl_option(False, help="Liger kernels for the model.", why="no Liger kernels are used "
                                  "(a speed/memory saving; the numbers are the same)", warn_if=bool, when="to true")
    use_fused_kernels: bool = verl_option(False, help="Fused linear + log-prob/entropy kernels.",
                                          why="no fused kernels are used (a speed/memory saving; the numbers "
                                          "are the same)", warn_if=bool, when="to true")
    fused_kernel_options: dict = verl_option({"impl_backend": "torch"}, help="Options of the fused kernels.",
                                             why="no fused kernels are used")
    tiled_mlp: dict = verl_option({"enabled": False, "num_shards": 4}, help="Tiled MLP computation.",
                                  why="a memory saving only; the MLPs run whole",
                                  warn_if=lambda v: bool(v.get("enabled")), when="enabled=true", keys=("enabled",))
    mtp: dict = verl_option(verl_defaults.mtp_defaults(), inert=False,
                            help="Multi-token prediction heads.", why="multi-token prediction is not implemented",
                            refuse_if=lambda v: any(bool(v.get(k)) for k in ("enable", "enable_train",
                                                                              "enable_rollout")),
                            when="when enabled", instead="leave it disabled",
                            keys=("enable", "enable_train", "enable_rollout"))


@dataclass
class LoraKeys(Section):
    """LoRA on the policy (PEFT; see verl.models.lora and docs/lora.md)."""

    lora_rank: int = option(0, bounds=">= 0", help="LoRA rank: above 0, adapters of this rank go on target_modules and only "
                            "they train (the base weights stay frozen); 0 = train all weights.")
    lora_alpha: int = option(16, bounds="> 0", help="LoRA alpha: the adapters' output is scaled by lora_alpha / lora_rank.")
    target_modules: str | list[str] = option("all-linear", help="Modules that get adapters: 'all-linear' "
                                             "(every linear layer but the output head) or a list of module "
                                             "names such as [q_proj, v_proj]; linear layers only.")
    exclude_modules: str | list[str] | None = option(None, help="Modules left without adapters: a regex "
                                                     "matched against full module names (e.g. '.*visual.*') "
                                                     "or a list of names; null = none.")
    lora_adapter_path: str | None = option(None, help="A trained PEFT LoRA adapter folder (adapter_config.json "
                                           "+ adapter_model.safetensors) to continue training; its own rank, "
                                           "alpha and target modules apply. Turns LoRA on by itself.")
    lora: dict = verl_option(verl_defaults.lora_defaults(),
                             help="The Megatron-Bridge form of the LoRA settings.", inert=False,
                             why="LoRA here is PEFT on FSDP, set by lora_rank, lora_alpha, target_modules, "
                             "exclude_modules and lora_adapter_path; merge is read by asynchronous runs (false: "
                             "the rollout gets the adapters alone; true: merged weights; docs/async.md), the "
                             "other entries have no effect",
                             refuse_if=lambda v: bool(v.get("rank")) or v.get("adapter_path") is not None,
                             when="with a rank above 0 or an adapter_path",
                             instead="set lora_rank (or lora_adapter_path) of the same model section",
                             keys=("rank", "adapter_path"))


@dataclass
class _PolicyModel(Section):
    """The keys of ModelConfig that work here."""

    path: str | None = option(None, help="Hugging Face model id or local folder; null = the built-in tiny model.")
    tokenizer_path: str | None = option(None, help="Tokenizer id or folder; null = the model path.")
    trust_remote_code: bool = option(False, help="Allow custom modelling code from the model repository.")
    dtype: Dtype = option("float32", help="Weight dtype for training: float32/fp32, bfloat16/bf16, "
                          "float16/fp16, or auto (the checkpoint's own dtype). Weights to train cannot be "
                          "float16 (AdamW's first update makes them NaN): for fp16 compute keep float32 and set "
                          "fsdp_config.mixed_precision.param_dtype=fp16.")
    attn_implementation: str | None = option(None, help="Attention kernel passed to Hugging Face "
                                             "(eager, sdpa, flash_attention_2); null = its default.")
    enable_gradient_checkpointing: bool = option(False, help="Recompute activations in the backward "
                                                 "pass: less memory, about 30% more compute.")
    override_config: dict = option({}, help="Free-form keys set on the Hugging Face model config "
                                   "before loading, e.g. {attention_dropout: 0.0}.")
    disable_dropout: bool = option(True, help="Set every dropout of the policy, reference and critic "
                                   "to 0 for RL: with dropout on, the log-probs of the update and of the "
                                   "rollout come from different networks (and differ across ranks).")
    use_remove_padding: bool = option(False, help="Run the actor's and reference's log-prob and update "
                                      "passes on packed sequences (pads removed, rows concatenated, position "
                                      "ids restarting per sequence): same numbers, less work where the kernel "
                                      "uses it (flash_attention_2 on GPU; sdpa/eager only mask). Needs a model "
                                      "whose causal mask follows position ids (Llama, Qwen2, GPT-2 ...); "
                                      "checked at start, others (e.g. OPT) fail with an error.")


@dataclass
class ModelConfig(LoraKeys, HFModelVerlKeys, _PolicyModel):
    """The policy model (also the reference model's starting point)."""

    custom_chat_template: str | None = option(
        None, aliases=("chat_template",), help="A Jinja chat template replacing the tokenizer's own, as text or "
        "as the path of a file that holds it; it formats the prompts (data.apply_chat_template) and is saved with "
        "the exported model. null = the tokenizer's template. Also spelled chat_template (under model, not data).")


@dataclass
class PolicyLossConfig(Section):
    """Which policy-gradient loss the actor minimises."""

    loss_mode: str = option("vanilla", help="Policy loss by name: vanilla = the PPO clipped "
                            "surrogate (Schulman et al. 2017) with dual-clip and clip-higher; gspo = "
                            "sequence-level ratio (Zheng et al. 2025); also cispo, geo_mean, gpg, sapo, "
                            "clip_cov, kl_cov, dppo_tv (docs/algorithms.md).")
    clip_cov_ratio: float = option(0.0002, bounds="(0, 1]", help="clip_cov loss: fraction of tokens clipped. Read by loss_mode=clip_cov.")
    clip_cov_lb: float = option(1.0, help="clip_cov loss: lower covariance bound. Read by loss_mode=clip_cov.")
    clip_cov_ub: float = option(5.0, help="clip_cov loss: upper covariance bound. Read by loss_mode=clip_cov.")
    kl_cov_ratio: float = option(0.0002, bounds="(0, 1]", help="kl_cov loss: fraction of tokens penalised. Read by loss_mode=kl_cov.")
    ppo_kl_coef: float = option(0.1, bounds=">= 0", help="kl_cov loss: KL coefficient. Read by loss_mode=kl_cov.")
    dro_beta: float | None = verl_option(None, help="DRO loss: beta.", why="read only by a DRO loss mode, "
                                         "which is not implemented")
    tau_pos: float = verl_option(1.0, help="SAPO loss: temperature for positive advantages.",
                                 why="SAPO reads actor_rollout_ref.actor.tau_pos")
    tau_neg: float = verl_option(1.05, help="SAPO loss: temperature for negative advantages.",
                                 why="SAPO reads actor_rollout_ref.actor.tau_neg")


@dataclass
class OptimConfig(Section):
    """AdamW optimiser and learning-rate schedule."""

    lr: float = option(1e-6, bounds="> 0", help="Peak learning rate.")
    weight_decay: float = option(0.01, bounds=">= 0", help="AdamW decoupled weight decay.")
    betas: list[float] = option([0.9, 0.999], help="AdamW betas (beta1, beta2).")
    eps: float = option(1e-8, bounds="> 0", help="AdamW epsilon.")
    lr_warmup_steps: int = option(-1, help="Linear warm-up length in optimiser steps; negative = "
                                  "use lr_warmup_steps_ratio instead.")
    lr_warmup_steps_ratio: float = option(0.0, bounds="[0, 1]", help="Warm-up length as a fraction of "
                                          "total_training_steps (used when lr_warmup_steps < 0).")
    warmup_style: Literal["constant", "cosine"] = verl_option(
        "constant", aliases=("lr_scheduler_type",), help="Schedule after warm-up: constant, or cosine decay to "
        "min_lr_ratio * lr (verl's newer name: lr_scheduler_type; verl's null = constant).", inert=False, why="",
        normalize=lambda v: "constant" if v is None else v)
    min_lr_ratio: float = option(0.0, bounds="[0, 1]", help="Floor of the cosine schedule as a fraction of lr.")
    total_training_steps: int | None = verl_option(None, bounds=">= 0", help="Length of the schedule in optimiser "
                                                   "steps; null (or 0, or verl's -1) = filled in by the trainer "
                                                   "at run time.",
                                                   inert=False, why="", normalize=lambda v: None if v == -1 else v)
    clip_grad: float | None = option(None, bounds="> 0", help="verl's newer spelling of the role's grad_clip (the "
                                     "global gradient-norm bound); null = use grad_clip. When set, "
                                     "validate() moves it to grad_clip.")
    num_cycles: float = verl_option(0.5, help="Cosine cycles over the schedule.", inert=False,
                                    why="the cosine schedule here is a single half cycle",
                                    refuse_if=lambda v: v != 0.5, when="unless 0.5")
    optimizer: str = verl_option("AdamW", help="Optimiser class name.", inert=False,
                                 why="the optimiser here is AdamW", refuse_if=lambda v: v.lower() != "adamw",
                                 when="for anything but AdamW")
    optimizer_impl: str = verl_option("torch.optim", help="Module the optimiser class comes from.", inert=False,
                                      why="the optimiser here is torch.optim.AdamW",
                                      refuse_if=lambda v: v != "torch.optim", when="for anything but torch.optim")
    zero_indexed_step: bool = verl_option(True, help="The schedule counts optimiser steps from 0.", inert=False,
                                          why="the schedule here counts from 0", refuse_if=lambda v: not v,
                                          when="when false")
    override_optimizer_config: dict | None = verl_option(None, help="Extra keyword arguments of the optimiser.",
                                                         inert=False, why="the optimiser takes only lr, betas, "
                                                         "eps and weight_decay here", refuse_if=bool,
                                                         when="unless null or empty",
                                                         instead="use lr / betas / eps / weight_decay")


@dataclass
class MixedPrecisionConfig(Section):
    """FSDP mixed-precision dtypes."""

    param_dtype: Dtype = option("auto", help="Dtype parameters are cast to for compute; auto = the "
                                "model's own dtype (actor_rollout_ref.model.dtype).")
    reduce_dtype: Dtype = option("fp32", help="Dtype of gradient reduction across ranks.")
    buffer_dtype: Dtype = option("fp32", help="Dtype of module buffers.")


@dataclass
class FSDPConfig(Section):
    """Fully-sharded data parallelism for one model."""

    fsdp_size: int = option(-1, bounds=">= -1", help="Ranks one model is sharded over; -1 = all ranks "
                            "(the rest replicate, hybrid sharding); otherwise a divisor of the world size (0 is "
                            "refused by validate()).")
    param_offload: bool = option(False, help="Keep parameters in CPU memory between uses.")
    optimizer_offload: bool = option(False, help="Keep optimiser state in CPU memory.")
    mixed_precision: MixedPrecisionConfig = section(MixedPrecisionConfig, help="Mixed-precision dtypes.")


def _sp_option():
    return verl_option(1, help="Ulysses sequence-parallel group size.", why=verl_rules.NO_SEQUENCE_PARALLEL,
                       warn_if=lambda v: v != 1, when="above 1")




@dataclass
class EngineFSDPConfig(FSDPConfig):
    """Fully-sharded data parallelism of a PPO role, with verl's other FSDP engine keys."""

    model_dtype: Dtype | None = option(None, help="Dtype the weights are loaded and trained in (verl's "
                                       "default fp32); null = actor_rollout_ref.model.dtype. On the actor, "
                                       "validate() moves it to model.dtype; the reference and the critic "
                                       "load the policy's dtype, so there another value is refused.")
    dtype: Dtype | None = option(None, help="Dtype blocks compute in (verl's default bfloat16); null = "
                                 "mixed_precision.param_dtype, where validate() moves a value given here.")
    strategy: str = strategy_option("Backend of this engine: fsdp or fsdp2 (both run this project's FSDP2).")
    wrap_policy: dict = verl_option({"min_num_params": 0}, help="Which modules are wrapped as FSDP units.",
                                    why="every transformer block is one FSDP unit here")
    offload_policy: bool = verl_option(False, help="FSDP2 CPU offload of parameters, gradients and optimiser "
                                       "state.", why=verl_rules.MEMORY_ONLY + " (use param_offload / optimizer_offload)",
                                       warn_if=bool, when="to true")
    reshard_after_forward: bool = verl_option(True, help="Free the gathered parameters after each forward.",
                                              why="parameters are resharded after forward here",
                                              warn_if=lambda v: not v, when="to false")
    forward_prefetch: bool = verl_option(False, help="Prefetch the next unit's parameters during forward.",
                                         why="a speed setting only", warn_if=bool, when="to true")
    use_orig_params: bool = verl_option(False, help="FSDP1's use_orig_params.", why="FSDP1 only; this "
                                        "project runs FSDP2")
    seed: int = verl_option(42, help="Seed of the engine.", why="trainer.seed seeds everything here")
    full_determinism: bool = verl_option(False, help="Deterministic kernels (debugging).",
                                         why="deterministic algorithms are not switched on",
                                         warn_if=bool, when="to true")
    ulysses_sequence_parallel_size: int = _sp_option()
    entropy_from_logits_with_chunking: bool = verl_option(False, help="Entropy computed in chunks.",
                                                          why=verl_rules.MEMORY_ONLY, warn_if=bool, when="to true")
    entropy_from_logits_chunk_size: int = verl_option(2048, help="Chunk size of the chunked entropy.",
                                                      why=verl_rules.MEMORY_ONLY)
    use_torch_compile: bool = verl_option(True, help="torch.compile the entropy computation.",
                                          why="nothing is compiled here")
    entropy_checkpointing: bool = verl_option(False, help="Recompute the entropy in the backward pass.",
                                              why=verl_rules.MEMORY_ONLY, warn_if=bool, when="to true")
    pad_to_length: bool = verl_option(False, help="Pad micro-batches to fixed lengths.",
                                      why="a speed setting only", warn_if=bool, when="to true")
    pad_to_length_bucket: int = verl_option(1024, help="Length bucket of pad_to_length.", why="a speed setting only")
    forward_only: bool = verl_option(False, help="The engine only runs forward passes.",
                                     why="set by the role here (the reference runs forward only)")
    qat: dict = verl_option(verl_defaults.qat_defaults(), inert=False,
                            help="Quantisation-aware training.", why="quantisation-aware training is not "
                            "implemented", refuse_if=lambda v: bool(v.get("enable")), when="with enable=true",
                            keys=("enable",))
    turbo_config: dict = verl_option(verl_defaults.turbo_defaults(), help="FSDP-Turbo engine settings.",
                                     why="the FSDP-Turbo backend is not supported (strategy=fsdp_turbo is refused)")


@dataclass
class _LogProbPassVerlKeys(Section):
    """verl keys that the actor and the reference both carry for their log-prob passes."""

    ulysses_sequence_parallel_size: int = _sp_option()
    use_torch_compile: bool = verl_option(True, help="torch.compile the entropy computation.",
                                          why="nothing is compiled here")
    entropy_from_logits_with_chunking: bool = verl_option(False, help="Entropy computed in chunks.",
                                                          why=verl_rules.MEMORY_ONLY, warn_if=bool, when="to true")
    entropy_from_logits_chunk_size: int = verl_option(2048, help="Chunk size of the chunked entropy.",
                                                      why=verl_rules.MEMORY_ONLY)
    entropy_checkpointing: bool = verl_option(False, help="Recompute the entropy in the backward pass.",
                                              why=verl_rules.MEMORY_ONLY, warn_if=bool, when="to true")
    pad_to_length: bool = verl_option(False, help="Pad micro-batches to fixed lengths.",
                                      why="a speed setting only", warn_if=bool, when="to true")
    profiler: dict = verl_option(verl_defaults.profiler_defaults(), help="verl's per-role profiler.",
                                 why="profiling is not implemented", warn_if=lambda v: bool(v.get("enable")),
                                 when="enable=true", keys=("enable",))
    router_replay: dict = verl_option({"mode": "disabled", "record_file": None, "replay_file": None}, inert=False,
                                      help="MoE routing replay.", why="MoE routing replay is not implemented",
                                      refuse_if=lambda v: v.get("mode", "disabled") != "disabled",
                                      when="unless mode=disabled", keys=("mode",))


@dataclass
class TrainedRoleVerlKeys(Section):
    """verl keys that the actor and the critic (the roles with an optimiser) both carry."""

    loss_scale_factor: float | None = verl_option(None, help="Constant divisor of seq-mean-token-sum-norm.",
                                                  inert=False, why="seq-mean-token-sum-norm divides by "
                                                  "data.max_response_length here", refuse_if=lambda v: v is not None,
                                                  when="unless null")
    data_loader_seed: int = verl_option(42, help="Seed of the mini-batch shuffling.",
                                        why="trainer.seed seeds the shuffling here")
    checkpoint: dict = verl_option(verl_defaults.checkpoint_defaults(), help="What a checkpoint holds.",
                                   why="a checkpoint holds the model, the optimiser and the trainer state here",
                                   warn_if=lambda v: bool(v.get("async_save")), when="async_save=true",
                                   keys=("async_save",))


@dataclass
class _ActorCore(Section):
    """The main fields of ActorConfig."""

    strategy: str = strategy_option("Training backend: fsdp or fsdp2 (both run this project's FSDP2 engine).")
    ppo_mini_batch_size: int = option(16, bounds=">= 1", help="Prompts per mini-batch (one optimiser step); the "
                                      "mini-batch holds this x rollout.n samples. Must divide data.train_batch_size.")
    ppo_micro_batch_size_per_gpu: int | None = option(None, bounds=">= 1", help="Samples per forward/backward "
                                                      "pass on each rank (gradient accumulation); null = the "
                                                      "rank's whole share of the mini-batch. Ignored with use_dynamic_bsz.")
    use_dynamic_bsz: bool = option(False, help="Cut each rank's mini-batch into micro-batches by tokens "
                                   "(prompt + response) instead of rows: the fewest balanced micro-batches of "
                                   "at most ppo_max_token_len_per_gpu tokens (a longer sample alone), as many "
                                   "on every rank; ppo_micro_batch_size_per_gpu is then ignored. The gradient "
                                   "is the same; only memory and speed change.")
    ppo_max_token_len_per_gpu: int = option(16384, bounds=">= 1", help="Token budget of one update micro-batch with "
                                            "use_dynamic_bsz (a few times max_prompt_length + max_response_length).")
    ppo_epochs: int = option(1, bounds=">= 1", help="Passes over the step's samples.")
    use_prefix_grouper: bool | None = option(
        None, help="Run each distinct prompt of a micro-batch once in the actor's and the reference's "
        "forward passes (log-probs and update; the n samples of a prompt share its keys and values): the same "
        "numbers, a fraction of the compute when rollout.n > 1 and prompts are long against responses. null = "
        "on where the model allows it (checked on the model at start; a warning names what stops it) and "
        "model.use_remove_padding is off; true = required (an error names what stops it); false = off. verl's "
        "default is false.")
    shuffle: bool = option(False, help="Shuffle samples before splitting them into mini-batches.")
    clip_ratio: float = option(0.2, bounds="> 0", help="PPO clip range epsilon: the ratio is clipped to [1 - eps, 1 + eps].")
    clip_ratio_low: float | None = option(None, bounds="> 0", help="Lower clip epsilon; null = clip_ratio.")
    clip_ratio_high: float | None = option(None, bounds="> 0", help="Upper clip epsilon (DAPO clip-higher); null = clip_ratio.")
    clip_ratio_c: float = option(3.0, bounds="> 1", help="Dual-clip bound for negative advantages (Ye et al. "
                                 "2020).")
    loss_agg_mode: LossAggMode = option(
        "token-mean", help="How per-token losses become one number: token-mean over all tokens of the "
        "mini-batch, or a mean over sequences of per-sequence token sums/means.")
    entropy_coeff: float = option(0.0, help="Weight of the entropy bonus (0 = none; a negative weight "
                                  "minimises the entropy instead).")
    use_kl_loss: bool = option(False, help="Add a KL(policy || reference) term to the loss (GRPO style).")
    kl_loss_coef: float = option(0.001, bounds=">= 0", help="Weight of the KL loss term.")
    kl_loss_type: str = option("low_var_kl", choices=KL_ESTIMATOR_NAMES,
                               help="KL estimator for the loss: k1 (kl), abs, k2 (mse), "
                               "k3 (low_var_kl).")
    mask_truncated_responses: bool = option(False, help="DAPO overlong filtering (Yu et al. 2025): "
                                            "responses cut off at data.max_response_length without EOS "
                                            "get response_mask 0 in the actor loss.")
    rollout_is_correction: bool = option(False, help="Multiply each token's policy loss by the "
                                         "truncated importance ratio min(pi_old / pi_rollout, "
                                         "rollout_is_threshold), detached (TIS, Yao et al. 2025); makes "
                                         "the rollout report its log-probs.")
    rollout_is_threshold: float = option(2.0, bounds="> 0", help="Cap C of the rollout importance ratio.")
    grad_clip: float = option(1.0, bounds="> 0", help="Clip the global gradient norm to this value.")
    policy_loss: PolicyLossConfig = section(PolicyLossConfig, help="Policy loss selection.")
    optim: OptimConfig = section(OptimConfig, help="Actor optimiser.")
    fsdp_config: EngineFSDPConfig = section(EngineFSDPConfig, help="Actor sharding.")
    # verl's other actor keys.
    rollout_n: int | None = verl_option(None, help="verl copies rollout.n here.", why="rollout.n is read")
    use_remove_padding: bool | None = option(None, help="verl copies model.use_remove_padding here; null = that. "
                                             "validate() refuses a different value (set model.use_remove_padding).")
    ppo_micro_batch_size: int | None = option(None, bounds=">= 1", help="verl's older global form of "
                                              "ppo_micro_batch_size_per_gpu (samples over all ranks); validate() "
                                              "divides it by the data-parallel size and moves it there.")
    use_fused_kernels: bool = verl_option(False, help="Fused log-prob/entropy kernels (verl copies "
                                          "model.use_fused_kernels).", why="no fused kernels are used (a "
                                          "speed/memory saving; the numbers are the same)", warn_if=bool,
                                          when="to true")
    calculate_entropy: bool = verl_option(False, help="Compute the entropy even with entropy_coeff = 0.",
                                          why="the entropy is computed and logged (actor/entropy) anyway")
    calculate_sum_pi_squared: bool = option(False, help="The old-log-prob pass also computes sum_v pi(v)^2 at each "
                                            "response token (batch key sum_pi_squared), which "
                                            "algorithm.adv_estimator=optimal_token_baseline reads; validate() "
                                            "switches it on for that estimator.")
    freeze_vision_tower: bool = option(False, help="Keep a vision-language model's vision tower frozen: only its "
                                       "language model (and projector) train. A text model has none: said once, "
                                       "no effect.")
    tau_pos: float = option(1.0, bounds="> 0", help="SAPO loss: temperature for positive advantages. Read by "
                            "loss_mode=sapo.")
    tau_neg: float = option(1.05, bounds="> 0", help="SAPO loss: temperature for negative advantages. Read by "
                            "loss_mode=sapo.")
    qat: dict = verl_option(verl_defaults.qat_defaults(), inert=False,
                            help="Quantisation-aware training.", why="quantisation-aware training is not "
                            "implemented", refuse_if=lambda v: bool(v.get("enable")), when="with enable=true",
                            keys=("enable",))


@dataclass
class ActorConfig(_LogProbPassVerlKeys, TrainedRoleVerlKeys, _ActorCore):
    """The policy update: PPO epochs over mini-batches of the step's samples."""


@dataclass
class _RefCore(Section):
    """The main fields of RefConfig."""

    log_prob_micro_batch_size_per_gpu: int | None = option(None, bounds=">= 1", help="Samples per forward pass "
                                                           "when computing reference log-probs; null = all at once. Ignored with "
                                                           "log_prob_use_dynamic_bsz.")
    log_prob_use_dynamic_bsz: bool | None = option(None, help="Cut reference log-prob passes by tokens "
                                                   "(at most log_prob_max_token_len_per_gpu each) instead of "
                                                   "log_prob_micro_batch_size_per_gpu rows; null = actor.use_dynamic_bsz.")
    log_prob_max_token_len_per_gpu: int | None = option(None, bounds=">= 1", help="Token budget of one reference "
                                                        "log-prob pass; null = actor.ppo_max_token_len_per_gpu.")
    fsdp_config: EngineFSDPConfig = section(EngineFSDPConfig, help="Reference-model sharding.")
    # verl's other reference keys.
    rollout_n: int | None = verl_option(None, help="verl copies rollout.n here.", why="rollout.n is read")
    strategy: str = strategy_option("Backend of the reference model: fsdp or fsdp2 (both run this project's FSDP2).")
    log_prob_micro_batch_size: int | None = option(None, bounds=">= 1", help="verl's older global form of "
                                                   "log_prob_micro_batch_size_per_gpu; validate() divides it by the "
                                                   "data-parallel size and moves it there.")


@dataclass
class RefConfig(_LogProbPassVerlKeys, _RefCore):
    """The frozen reference policy (used for the KL penalty or KL loss)."""


@dataclass
class ActorRolloutRefConfig(Section):
    """Policy model, its training, its reference copy and its generation."""

    hybrid_engine: bool = option(True, help="Actor and rollout share one copy of the weights in-process.")
    model: ModelConfig = section(ModelConfig, help="Policy model.")
    actor: ActorConfig = section(ActorConfig, help="Policy update.")
    ref: RefConfig = section(RefConfig, help="Reference policy.")
    rollout: RolloutConfig = section(RolloutConfig, help="Response generation.")
    nccl_timeout: int = verl_option(600, help="Timeout of the process-group operations in seconds.",
                                    why="trainer.dist_timeout_s bounds every collective here")
