"""The `actor_rollout_ref` sections: policy model, actor (PPO update), reference and rollout.

Batch sizes carry their unit in the help text: *prompts* (before sampling n responses each) or
*samples* (prompt-response pairs, i.e. prompts x rollout.n). They are checked together in
`verl.config.checks`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from verl.config.node import ConfigNode, option, section

Dtype = Literal["float32", "fp32", "bfloat16", "bf16", "float16", "fp16", "auto"]
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@dataclass
class ModelConfig(ConfigNode):
    """The policy model (also the reference model's starting point)."""

    path: str | None = option(None, help="Hugging Face model id or local folder; null = the built-in tiny model.")
    tokenizer_path: str | None = option(None, help="Tokenizer id or folder; null = the model path.")
    trust_remote_code: bool = option(False, help="Allow custom modelling code from the model repository.")
    dtype: Dtype = option("float32", help="Weight dtype for training: float32/fp32, bfloat16/bf16, "
                          "float16/fp16, or auto (the checkpoint's own dtype).")
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
class PolicyLossConfig(ConfigNode):
    """Which policy-gradient loss the actor minimises."""

    loss_mode: str = option("vanilla", help="Policy loss by name: vanilla = the PPO clipped "
                            "surrogate (Schulman et al. 2017) with dual-clip and clip-higher; gspo = "
                            "sequence-level ratio (Zheng et al. 2025).")


@dataclass
class OptimConfig(ConfigNode):
    """AdamW optimiser and learning-rate schedule."""

    lr: float = option(1e-6, help="Peak learning rate.")
    weight_decay: float = option(0.01, help="AdamW decoupled weight decay.")
    betas: list[float] = option([0.9, 0.999], help="AdamW betas (beta1, beta2).")
    eps: float = option(1e-8, help="AdamW epsilon.")
    lr_warmup_steps: int = option(-1, help="Linear warm-up length in optimiser steps; negative = "
                                  "use lr_warmup_steps_ratio instead.")
    lr_warmup_steps_ratio: float = option(0.0, help="Warm-up length as a fraction of "
                                          "total_training_steps (used when lr_warmup_steps < 0).")
    warmup_style: Literal["constant", "cosine"] = option("constant", help="Schedule after warm-up: "
                                                         "constant, or cosine decay to min_lr_ratio * lr.")
    min_lr_ratio: float = option(0.0, help="Floor of the cosine schedule as a fraction of lr.")
    total_training_steps: int | None = option(None, help="Length of the schedule in optimiser "
                                              "steps; null = filled in by the trainer at run time.")


@dataclass
class MixedPrecisionConfig(ConfigNode):
    """FSDP mixed-precision dtypes."""

    param_dtype: Dtype = option("auto", help="Dtype parameters are cast to for compute; auto = the "
                                "model's own dtype (actor_rollout_ref.model.dtype).")
    reduce_dtype: Dtype = option("fp32", help="Dtype of gradient reduction across ranks.")
    buffer_dtype: Dtype = option("fp32", help="Dtype of module buffers.")


@dataclass
class FSDPConfig(ConfigNode):
    """Fully-sharded data parallelism for one model."""

    fsdp_size: int = option(-1, help="Ranks one model is sharded over; -1 = all ranks "
                            "(the rest replicate, hybrid sharding).")
    param_offload: bool = option(False, help="Keep parameters in CPU memory between uses.")
    optimizer_offload: bool = option(False, help="Keep optimiser state in CPU memory.")
    mixed_precision: MixedPrecisionConfig = section(MixedPrecisionConfig, help="Mixed-precision dtypes.")


@dataclass
class ActorConfig(ConfigNode):
    """The policy update: PPO epochs over mini-batches of the step's samples."""

    strategy: Literal["fsdp", "fsdp2"] = option("fsdp", help="Training backend: fsdp or fsdp2.")
    ppo_mini_batch_size: int = option(16, help="Prompts per mini-batch (one optimiser step); the "
                                      "mini-batch holds this x rollout.n samples. Must divide data.train_batch_size.")
    ppo_micro_batch_size_per_gpu: int | None = option(None, help="Samples per forward/backward pass "
                                                      "on each rank (gradient accumulation); null = the "
                                                      "rank's whole share of the mini-batch. Ignored with use_dynamic_bsz.")
    use_dynamic_bsz: bool = option(False, help="Cut each rank's mini-batch into micro-batches by tokens "
                                   "(prompt + response) instead of rows: the fewest balanced micro-batches of "
                                   "at most ppo_max_token_len_per_gpu tokens (a longer sample alone), as many "
                                   "on every rank; ppo_micro_batch_size_per_gpu is then ignored. The gradient "
                                   "is the same; only memory and speed change.")
    ppo_max_token_len_per_gpu: int = option(16384, help="Token budget of one update micro-batch with "
                                            "use_dynamic_bsz (a few times max_prompt_length + max_response_length).")
    ppo_epochs: int = option(1, help="Passes over the step's samples.")
    shuffle: bool = option(False, help="Shuffle samples before splitting them into mini-batches.")
    clip_ratio: float = option(0.2, help="PPO clip range epsilon: the ratio is clipped to [1 - eps, 1 + eps].")
    clip_ratio_low: float | None = option(None, help="Lower clip epsilon; null = clip_ratio.")
    clip_ratio_high: float | None = option(None, help="Upper clip epsilon (DAPO clip-higher); null = clip_ratio.")
    clip_ratio_c: float = option(3.0, help="Dual-clip bound for negative advantages (Ye et al. "
                                 "2020); must be > 1.")
    loss_agg_mode: LossAggMode = option(
        "token-mean", help="How per-token losses become one number: token-mean over all tokens of the "
        "mini-batch, or a mean over sequences of per-sequence token sums/means.")
    entropy_coeff: float = option(0.0, help="Weight of the entropy bonus (0 = none).")
    use_kl_loss: bool = option(False, help="Add a KL(policy || reference) term to the loss (GRPO style).")
    kl_loss_coef: float = option(0.001, help="Weight of the KL loss term.")
    kl_loss_type: str = option("low_var_kl", help="KL estimator for the loss: k1 (kl), abs, k2 (mse), "
                               "k3 (low_var_kl).")
    mask_truncated_responses: bool = option(False, help="DAPO overlong filtering (Yu et al. 2025): "
                                            "responses cut off at data.max_response_length without EOS "
                                            "get response_mask 0 in the actor loss.")
    rollout_is_correction: bool = option(False, help="Multiply each token's policy loss by the "
                                         "truncated importance ratio min(pi_old / pi_rollout, "
                                         "rollout_is_threshold), detached (TIS, Yao et al. 2025); makes "
                                         "the rollout report its log-probs.")
    rollout_is_threshold: float = option(2.0, help="Cap C of the rollout importance ratio.")
    grad_clip: float = option(1.0, help="Clip the global gradient norm to this value.")
    policy_loss: PolicyLossConfig = section(PolicyLossConfig, help="Policy loss selection.")
    optim: OptimConfig = section(OptimConfig, help="Actor optimiser.")
    fsdp_config: FSDPConfig = section(FSDPConfig, help="Actor sharding.")


@dataclass
class RefConfig(ConfigNode):
    """The frozen reference policy (used for the KL penalty or KL loss)."""

    log_prob_micro_batch_size_per_gpu: int | None = option(None, help="Samples per forward pass "
                                                           "when computing reference log-probs; null = all at once. Ignored with "
                                                           "log_prob_use_dynamic_bsz.")
    log_prob_use_dynamic_bsz: bool | None = option(None, help="Cut reference log-prob passes by tokens "
                                                   "(at most log_prob_max_token_len_per_gpu each) instead of "
                                                   "log_prob_micro_batch_size_per_gpu rows; null = actor.use_dynamic_bsz.")
    log_prob_max_token_len_per_gpu: int | None = option(None, help="Token budget of one reference "
                                                        "log-prob pass; null = actor.ppo_max_token_len_per_gpu.")
    fsdp_config: FSDPConfig = section(FSDPConfig, help="Reference-model sharding.")


@dataclass
class ValKwargsConfig(ConfigNode):
    """Sampling used for validation."""

    n: int = option(1, help="Responses per validation prompt.")
    do_sample: bool = option(False, help="Sample (true) or decode greedily (false).")
    temperature: float = option(0.0, help="Sampling temperature.")
    top_k: int = option(-1, help="Keep the k most likely tokens; -1 = all.")
    top_p: float = option(1.0, help="Nucleus sampling mass; 1.0 = off.")


@dataclass
class RolloutConfig(ConfigNode):
    """Response generation."""

    name: str = option("hf", help="Rollout engine: hf (Hugging Face generate), native (verl's own KV-cache "
                       "decode loop: shared prefill of a prompt's samples, finished rows leave the batch; "
                       "same samples as hf), vllm, or dummy (tests).")
    n: int = option(8, help="Responses sampled per prompt (samples per prompt); group-baseline "
                    "estimators such as GRPO (the default) need 2 or more.")
    temperature: float = option(1.0, help="Sampling temperature.")
    top_k: int = option(-1, help="Keep the k most likely tokens; -1 = all.")
    top_p: float = option(1.0, help="Nucleus sampling mass; 1.0 = off.")
    do_sample: bool = option(True, help="Sample (true) or decode greedily (false).")
    dtype: str = option("auto", help="Weight dtype inside the vLLM engine: bfloat16, float16, float32, or "
                        "auto (bfloat16 on a GPU, the actor's dtype on a CPU).")
    gpu_memory_utilization: float = option(0.5, help="vLLM: fraction of GPU memory for weights and KV cache "
                                           "(on a CPU, of the machine's memory; the CPU build's KV cache is "
                                           "sized from max_num_seqs and max_model_len instead).")
    tensor_model_parallel_size: int = option(1, help="GPUs one vLLM model is split over.")
    max_num_seqs: int = option(256, help="vLLM: most sequences the engine decodes at once.")
    max_model_len: int | None = option(None, help="vLLM: longest sequence (prompt + response) the engine "
                                       "serves; null = data.max_prompt_length + data.max_response_length.")
    max_num_batched_tokens: int = option(8192, help="vLLM: most tokens one engine step processes.")
    enforce_eager: bool = option(True, help="vLLM: run the model eagerly (no CUDA graphs, no torch.compile): "
                                 "fast start-up; false trades start-up time for decode speed.")
    enable_chunked_prefill: bool = option(True, help="vLLM: split long prefills into chunks scheduled "
                                          "beside decodes.")
    enable_prefix_caching: bool = option(True, help="vLLM: reuse the KV cache of shared prompt prefixes "
                                         "(the n samples of a prompt); dropped at every weight sync.")
    free_cache_engine: bool = option(True, help="vLLM on a GPU: sleep between rollouts (weights offloaded, "
                                     "KV cache freed) so training has the memory; vLLM's CPU build has "
                                     "no sleep mode and keeps its cache.")
    engine_kwargs: dict = option({"vllm": {}}, help="Extra keyword arguments per engine, passed as they are "
                                 "(engine_kwargs.vllm: to vllm.LLM; they override the keys above).")
    generation_batch_size: int | None = option(None, help="Prompts per generate call; null = "
                                               "the whole step at once.")
    log_prob_micro_batch_size_per_gpu: int | None = option(None, help="Samples per forward pass "
                                                           "when recomputing old log-probs; null = all at once. Ignored with "
                                                           "log_prob_use_dynamic_bsz.")
    log_prob_use_dynamic_bsz: bool | None = option(None, help="Cut old-log-prob passes by tokens (at most "
                                                   "log_prob_max_token_len_per_gpu each) instead of "
                                                   "log_prob_micro_batch_size_per_gpu rows; null = actor.use_dynamic_bsz.")
    log_prob_max_token_len_per_gpu: int | None = option(None, help="Token budget of one old-log-prob "
                                                        "pass; null = actor.ppo_max_token_len_per_gpu.")
    calculate_log_probs: bool = option(False, help="The engine reports rollout_log_probs: each sampled "
                                       "token's log-prob under the distribution it was drawn from (after "
                                       "temperature, top-k, top-p). On by itself with actor.rollout_is_correction.")
    device: str | None = option(None, help="Device that receives rollout outputs; null = the actor's device.")
    val_kwargs: ValKwargsConfig = section(ValKwargsConfig, help="Sampling for validation.")


@dataclass
class ActorRolloutRefConfig(ConfigNode):
    """Policy model, its training, its reference copy and its generation."""

    hybrid_engine: bool = option(True, help="Actor and rollout share one copy of the weights in-process.")
    model: ModelConfig = section(ModelConfig, help="Policy model.")
    actor: ActorConfig = section(ActorConfig, help="Policy update.")
    ref: RefConfig = section(RefConfig, help="Reference policy.")
    rollout: RolloutConfig = section(RolloutConfig, help="Response generation.")
