"""The memory plan: what one rank of an RL run will hold, from the config and the model's
config.json alone (parameters counted on the meta device; no weights are read).

Per rank and per role: the actor's weights, gradients and optimizer state (sharded over the ranks of its
fsdp_config.fsdp_size by FSDP), its activations for one micro-batch of the update (with or without gradient
checkpointing), the reference's weights, the rollout's KV cache (and its copy of the weights when
it has one), the critic's share when GAE needs one; with ``async_training.enable`` the rollout
apart (its own weights and a whole step's KV cache, all along, the weights in flight to it and, as a
process on a CPU, its runtime), counted in every phase since it generates while the trainer trains
(under torchrun only rank 0 holds it: an upper bound on the other ranks). The peak is the largest of
the phases:

- ``rollout``: weights + optimizer state + the KV cache of this rank's generation batch;
- ``log_prob``: weights + optimizer state + one no-grad forward of a log-prob micro-batch;
- ``update``: weights + gradients + optimizer state + the activations kept for the backward;
- ``optimizer_step``: weights + gradients + optimizer state + AdamW's temporary (the size of the
  trainable parameters), which tops the update when the activations are small.

Activations follow what a Hugging Face decoder layer keeps for its backward in training, per token
and layer (``c`` = bytes of the compute dtype, ``h`` hidden size, ``a`` = heads x head_dim, the
attention's width, which is not ``h`` for Qwen3 or Gemma 2, ``I`` MLP size): two RMSNorms (an fp32
copy of the input, the normalized and the scaled output: ``(4 + 2c) h`` each, four in a Gemma 2
layer; Qwen3's per-head q/k norms ``(4 + c)`` over the q and k widths), attention (q, the keys and
values repeated to every head, the output and the o_proj input: ``5 c a``; eager attention also keeps
the ``heads x T`` probabilities, softmax's fp32 output and its cast to the compute dtype: ``4 + c``
bytes each, 4 in fp32, and ``c`` more for Gemma 2's soft-capped scores; eager is the model's own
default where it has no sdpa, as Gemma 2) and a gated MLP (gate, up, SiLU, product: ``4 c I``;
a mixture of experts: ``I`` over its routed and shared experts, plus ``2 c h`` per routed copy; a plain MLP
``1``, ``2`` or ``5 c I`` by its activation, a LayerNorm ``2 c h``: ``model_shape.py``).
Logits: the ``[T, V]`` output in the compute dtype (twice for Gemma 2's soft-capped logits) plus fp32
copies of the response's part (three in the update, two in a no-grad forward, one more in 16-bit: the
cast; measured on a CPU with Qwen2.5's 151,936-token vocabulary). With gradient checkpointing only
every layer's input is kept, and one layer's activations live again during its backward, with their
gradients. Checked against measured peaks (docs/performance.md): within 15%.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import torch

from verl.config.cross_checks import log_prob_token_budget
from verl.models.loading import flash_attention_missing
from verl.models.lora import lora_requested
from verl.trainer.ppo import roles
from verl.trainer.ppo.model_shape import ModelShape

logger = logging.getLogger(__name__)

GiB = 1024**3
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}
# A CPU run's process holds about this much more than right after its imports (the rollout and data
# modules, tokenizer, dataset, the kernels' first-use buffers): measured with the tiny model (0.52 GiB
# peak RSS against 0.37 at planning time; benchmarks/bench_memory_plan.py).
CPU_RUN_OVERHEAD = int(0.15 * GiB)
# oneDNN multiplies bf16 weights on a CPU through copies it reorders for the matrix units and keeps: measured
# (benchmarks/bench_memory_plan.py, a 55M Qwen2 with its reference, ONEDNN_MAX_CPU_ISA set to each) about one
# more copy of every bf16 weight with AMX, half of one with AVX-512 BF16, none with AVX2 (another path).
ONEDNN_COPIES = {"AMX": 1.0, "AVX512_BF16": 0.5}


def onednn_isa() -> str:
    """The matrix instructions oneDNN uses for bf16 here: AMX, AVX512_BF16 or none (``ONEDNN_MAX_CPU_ISA`` /
    ``DNNL_MAX_CPU_ISA`` cap what the CPU has)."""
    if not torch.backends.mkldnn.is_available():
        return "none"
    flags = _cpu_flags()
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    uncapped = cap in ("ALL", "DEFAULT")
    if "amx_bf16" in flags and (uncapped or "AMX" in cap):
        return "AMX"
    if "avx512_bf16" in flags and (uncapped or "AMX" in cap or "BF16" in cap):
        return "AVX512_BF16"
    return "none"


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:  # not Linux: no flags known, no copies counted
        return set()


OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "sgd": 0, "rmsprop": 1, "adagrad": 1}


@dataclasses.dataclass
class MemoryPlan:
    """Bytes per rank by (role, part); ``phases`` the sum each phase holds; ``peak`` their maximum."""

    device: str
    ranks: int
    shape: ModelShape
    parts: dict[tuple[str, str], tuple[int, str]]
    phases: dict[str, int]
    available: int | None = None  # bytes this rank may use (GPU memory, or RAM over the ranks on this machine)

    @property
    def peak(self) -> int:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    @property
    def engine_problem(self) -> str | None:
        """Why a vLLM engine of this plan cannot start (its weights fill its share of the GPU), or None."""
        return next((note for (_, part), (_, note) in self.parts.items() if part == "vLLM" and "cannot start" in note),
                    None)

    def largest(self, n: int) -> list[tuple[tuple[str, str], tuple[int, str]]]:
        """The ``n`` largest parts, largest first."""
        return sorted(self.parts.items(), key=lambda item: -item[1][0])[:n]

    def fixes(self) -> list[str]:
        """What lowers the two largest parts (``FIXES``), in the order to try."""
        return list(dict.fromkeys(fix for (_, part), _ in self.largest(2) for fix in FIXES.get(part, ())))

    def table(self) -> str:
        lines = [f"Memory plan per rank ({self.device}, {self.ranks} rank{'s' * (self.ranks > 1)}, "
                 f"{self.shape.params / 1e6:,.1f}M parameters):"]
        for (role, part), (size, note) in self.parts.items():
            lines.append(f"  {role:<10} {part:<12} {size / GiB:8.2f} GiB  {note}")
        phases = ", ".join(f"{name} {size / GiB:.2f}" for name, size in self.phases.items())
        room = f" of {self.available / GiB:.1f} GiB available" if self.available else ""
        lines.append(f"  peak {self.peak / GiB:.2f} GiB in {self.peak_phase}{room} (phases, GiB: {phases})")
        return "\n".join(lines)


def _bytes(dtype: str) -> int:
    return DTYPE_BYTES.get(str(dtype).lower(), 4)  # auto / unknown: fp32, the larger


@dataclasses.dataclass(frozen=True)
class _Run:
    """What every part's size depends on: the model's shape, bytes per weight and per computed value,
    tokens per row, the ranks sharing the state, and where it runs."""

    shape: ModelShape
    weight: int
    compute: int
    row: int
    response: int
    ranks: int
    on_gpu: bool
    eager: bool
    shard: int = 1  # ranks one copy of the actor's state is sharded over (fsdp_config.fsdp_size; -1: all ranks)

    @property
    def fp32_cast(self) -> int:
        """Bytes per value of the fp32 copy a 16-bit compute dtype's logits get for the log-probs (0 in fp32)."""
        return 4 if self.compute != 4 else 0

    def weights(self, params: int, shard: int | None = None) -> int:
        return params * self.weight // (shard or self.shard)

    def note(self, shard: int | None = None) -> str:
        shard = shard or self.shard
        return {2: "16-bit", 4: "fp32"}[self.weight] + (f", 1/{shard} of the model (FSDP)" if shard > 1 else "")

    def kept(self, tokens: int, checkpointing: bool) -> int:
        """Activations a micro-batch of ``tokens`` keeps for its backward."""
        per_layer = self.shape.layer_activation_bytes(self.compute, self.row, self.eager)
        if checkpointing:  # every layer's input; during a layer's backward its activations and their gradients
            return tokens * (self.shape.layers * self.compute * self.shape.hidden + 2 * per_layer)
        return tokens * self.shape.layers * per_layer


def plan_memory(config, hf_config=None, *, ranks: int | None = None, device: str = "cpu",
                available: int | None = None) -> MemoryPlan:
    """The plan of one rank of ``config`` (a TrainerConfig). ``hf_config``: the policy's model config
    (default: read from actor_rollout_ref.model.path); ``ranks``: the actor's data-parallel ranks
    (default trainer.nnodes x trainer.n_gpus_per_node)."""
    arr, data = config.actor_rollout_ref, config.data
    model_cfg, mixed = arr.model, arr.actor.fsdp_config.mixed_precision
    shape = ModelShape.of(hf_config if hf_config is not None else roles.policy_config(config))
    weight = _bytes(model_cfg.dtype)
    compute = weight if str(mixed.param_dtype).lower() in ("auto", "none") else _bytes(mixed.param_dtype)
    # Flash attention where it cannot run loads the model's default (resolve_attn_implementation).
    attention = None if flash_attention_missing(model_cfg.attn_implementation) else model_cfg.attn_implementation
    ranks = ranks or config.trainer.nnodes * config.trainer.n_gpus_per_node
    run = _Run(shape=shape, weight=weight, compute=compute, row=data.max_prompt_length + data.max_response_length,
               response=data.max_response_length, ranks=ranks, on_gpu=device.startswith("cuda"),
               eager=(attention or shape.default_attention) == "eager", shard=fsdp_shard(arr.actor.fsdp_config, ranks))
    uses_ref = roles.uses_reference(config) and not lora_requested(model_cfg)  # LoRA: the base weights score it
    parts = _actor_parts(config, run)
    if uses_ref:
        on_host = run.on_gpu and arr.ref.fsdp_config.param_offload
        shard = fsdp_shard(arr.ref.fsdp_config, run.ranks)
        parts["reference", "weights"] = (0 if on_host else run.weights(shape.params, shard),
                                         run.note(shard) + (" (in CPU memory: param_offload)" if on_host else ""))
    parts.update({**_log_prob_part(config, run, uses_ref), **_rollout_parts(config, run, available)})
    if config.critic_enabled():
        parts.update(_critic_parts(config, run))
    if config.async_training.enable:
        parts.update(_async_rollout_parts(config, run, available))
    phases = _phases(parts, adam=OPTIMIZER_STATES.get(str(arr.actor.optim.optimizer).lower(), 2) == 2,
                     engine_sleeps=run.on_gpu and arr.rollout.free_cache_engine)
    if not run.on_gpu:  # on a CPU the process itself (Python, torch, the tokenizer) is resident too
        from verl.utils.memory import peak_rss_bytes

        resident_here = peak_rss_bytes()
        parts["process", "runtime"] = (resident_here + CPU_RUN_OVERHEAD,
                                       "the process itself (Python, torch, libraries, tokenizer, data)")
        isa = onednn_isa() if run.compute == 2 and str(model_cfg.dtype).lower() in ("bf16", "bfloat16") else "none"
        copies = ONEDNN_COPIES.get(isa, 0.0)  # of the bf16 weights a CPU process multiplies, kept beside them
        if copies:
            multiplied = sum(size for (role, what), (size, _) in parts.items()
                             if what == "weights" and role in ("actor", "reference", "critic", "async"))
            parts["process", "oneDNN"] = (int(copies * multiplied), f"{copies:g} copy of the bf16 weights, reordered "
                                          f"for this CPU's matrix units ({isa})")
        if config.async_training.enable and config.async_training.rollout_placement != "thread":
            # The rollout process imports what this one does: about this process's footprint again.
            parts["async", "runtime"] = (resident_here, "the rollout process itself (the same imports)")
        extra = parts["process", "runtime"][0] + parts.get(("async", "runtime"), (0, ""))[0] + \
            parts.get(("process", "oneDNN"), (0, ""))[0]
        phases = {name: total + extra for name, total in phases.items()}
    return MemoryPlan(device=device, ranks=run.ranks, shape=shape, parts=parts, phases=phases, available=available)


Parts = dict[tuple[str, str], tuple[int, str]]


def fsdp_shard(fsdp_config, ranks: int) -> int:
    """Ranks one copy of a role's state is sharded over: ``fsdp_size`` (-1: all ``ranks``; a smaller size
    replicates the shards across groups, HSDP), refused now, before any weight loads, when it does not
    divide ``ranks`` (as :func:`verl.distributed.fsdp.resolve_fsdp_size` would once the model is built)."""
    from verl.distributed.fsdp import resolve_fsdp_size

    return resolve_fsdp_size(fsdp_config.fsdp_size, max(ranks, 1), fsdp_config._path("fsdp_size"))


def _actor_parts(config, run: _Run) -> Parts:
    arr = config.actor_rollout_ref
    actor, model_cfg = arr.actor, arr.model
    trainable = lora_params(run.shape, model_cfg.lora_rank) if model_cfg.lora_rank else run.shape.params
    states = OPTIMIZER_STATES.get(str(actor.optim.optimizer).lower(), 2)
    on_host = run.on_gpu and actor.fsdp_config.param_offload  # parameters, and so gradients and the step
    optimizer_on_host = on_host or (run.on_gpu and actor.fsdp_config.optimizer_offload)
    if actor.use_dynamic_bsz:
        tokens = actor.ppo_max_token_len_per_gpu
        rows, note = max(1, tokens // run.row), f"{tokens} tokens (dynamic batch size)"
    else:
        rows = actor.ppo_micro_batch_size_per_gpu or max(1, actor.ppo_mini_batch_size * arr.rollout.n // run.ranks)
        tokens, note = rows * run.row, f"micro-batch {rows} x {run.row} tokens"
    # the [T, V] logits in the compute dtype (twice when soft-capped: the tanh's output is kept too), fp32 copies of
    # the response's (one more in 16-bit: the cast itself, a no-op in fp32)
    logits = rows * run.shape.vocab * ((1 + run.shape.logit_softcap) * run.row * run.compute
                                       + (12 + run.fp32_cast) * run.response)
    checkpointing = model_cfg.enable_gradient_checkpointing
    return {
        ("actor", "weights"): (0 if on_host else run.weights(run.shape.params),
                               run.note() + (" (in CPU memory: param_offload)" if on_host else "")),
        ("actor", "gradients"): (0 if on_host else run.weights(trainable),
                                 "LoRA adapters only" if model_cfg.lora_rank else run.note()),
        ("actor", "optimizer"): (0 if optimizer_on_host else states * run.weights(trainable),
                                 f"{actor.optim.optimizer}: {states} state{'s' * (states != 1)} per trainable parameter"),
        ("actor", "activations"): (run.kept(tokens, checkpointing) + logits,
                                   note + (", gradient checkpointing" if checkpointing else "")),
    }


def _log_prob_part(config, run: _Run, uses_ref: bool) -> Parts:
    """The largest no-grad forward: the old log-probs' or the reference's micro-batch (null: the whole batch)."""
    arr = config.actor_rollout_ref
    batch = config.data.train_batch_size * arr.rollout.n // run.ranks
    rows = max(arr.rollout.log_prob_micro_batch_size_per_gpu or batch,
               (arr.ref.log_prob_micro_batch_size_per_gpu or batch) if uses_ref else 0)
    note = f"micro-batch {rows} x {run.row} tokens, no gradients"
    budget = max(log_prob_token_budget(arr, "rollout") or 0, (log_prob_token_budget(arr, "ref") or 0) * uses_ref)
    if budget:
        rows, note = max(1, budget // run.row), f"{budget} tokens (dynamic batch size), no gradients"
    forward = rows * (run.row * run.shape.forward_bytes(run.compute)
                      + run.shape.vocab * ((1 + run.shape.logit_softcap) * run.row * run.compute
                                           + (8 + run.fp32_cast) * run.response))
    return {("log-prob", "forward"): (forward, note)}


def _rollout_parts(config, run: _Run, available: int | None) -> Parts:
    """vLLM's share of the GPU, or the KV cache of this rank's generation batch; the rollout's own
    weights when it holds a copy (vLLM, no hybrid engine) or gathers them (hybrid engine over ranks)."""
    arr = config.actor_rollout_ref
    rollout = arr.rollout
    if not roles.trainer_generates(config):  # an asynchronous run whose rollout validates: no engine here
        return {}
    if rollout.name == "vllm" and run.on_gpu and available:
        asleep = ", asleep between rollouts (free_cache_engine)" if rollout.free_cache_engine else ""
        share, weights, problem = _vllm_share(rollout, run, available)
        note = f"gpu_memory_utilization x the GPU's memory: weights and KV cache{asleep}"
        return {("rollout", "vLLM"): (max(share, weights), problem or note)}
    if rollout.name == "dummy":
        return {}
    shape = run.shape
    rows = _generation_rows(config, run.ranks)
    parts = {("rollout", "KV cache"): (_kv_cache_bytes(run, rows), f"{rows} rows x {run.row} tokens")}
    if not arr.hybrid_engine or rollout.name == "vllm":
        parts["rollout", "weights"] = (shape.params * run.weight, "its own copy, held all along")
    elif run.shard > 1:
        parts["rollout", "gathered"] = (shape.params * run.weight, "the actor's full weights, for each rollout")
    return parts


# vLLM's dtype names (rollout.dtype) in bytes; auto is bfloat16 on a GPU (verl.rollout.vllm.resolve_dtype)
VLLM_DTYPE_BYTES = {"auto": 2, "half": 2, "float": 4, **DTYPE_BYTES}


def _vllm_share(rollout, run: _Run, available: int) -> tuple[int, int, str | None]:
    """vLLM's share of a GPU (``gpu_memory_utilization`` x its memory), the engine's weights on each of its
    ``tensor_model_parallel_size`` GPUs, and why it cannot start when they leave its share no room for a KV cache
    (vLLM refuses to start then: Qwen2.5-32B's 61 GiB in bf16 on one GPU against 0.5 x 80 GiB)."""
    share = int(rollout.gpu_memory_utilization * available)
    tp = rollout.tensor_model_parallel_size
    weights = run.shape.params * VLLM_DTYPE_BYTES.get(str(rollout.dtype).lower(), 2) // tp
    if weights < share:
        return share, weights, None
    return share, weights, (f"its weights alone, {weights / GiB:.1f} GiB per GPU at tensor_model_parallel_size={tp}, "
                            f"fill its share ({rollout.gpu_memory_utilization} x {available / GiB:.0f} GiB = "
                            f"{share / GiB:.1f} GiB): vLLM cannot start, with no room for its KV cache")


def _generation_rows(config, ranks: int) -> int:
    """Rows one generate call of a rank holds: its share of the step's samples, at most
    ``rollout.generation_batch_size`` prompts' worth and ``rollout.max_num_seqs`` rows."""
    rollout = config.actor_rollout_ref.rollout
    rows = min(config.data.train_batch_size * rollout.n // ranks, rollout.max_num_seqs)
    return min(rows, rollout.generation_batch_size * rollout.n) if rollout.generation_batch_size else rows


def _kv_cache_bytes(run: _Run, rows: int) -> int:
    """Keys and values of every layer for ``rows`` rows of ``run.row`` tokens."""
    shape = run.shape
    return rows * run.row * shape.layers * 2 * shape.kv_heads * shape.head_dim * run.weight


def _async_rollout_parts(config, run: _Run, available: int | None) -> Parts:
    """``async_training.enable``: the rollout apart holds its own copy of the weights and the KV cache of
    a whole step's generation, all along (it generates while the trainer trains), and one more copy
    of the weights is on its way to it after every sync (shared memory or a file's pages). Rollout ranks
    on GPUs (``rollout_placement=ranks``) hold theirs on devices of their own: nothing on this rank's."""
    if run.on_gpu and config.async_training.rollout_placement == "ranks":
        return {}
    rollout = config.actor_rollout_ref.rollout
    if rollout.name == "vllm" and run.on_gpu and available:
        share, weights, problem = _vllm_share(rollout, run, available)
        return {("async", "vLLM"): (max(share, weights), problem or "the rollout process's engine: "
                                                                   "gpu_memory_utilization x the GPU's memory")}
    shape = run.shape
    rows = _generation_rows(config, ranks=1)  # one rollout generates every step's rows
    parts = {("async", "weights"): (shape.params * run.weight, "the rollout process's own copy of the weights"),
             ("async", "KV cache"): (_kv_cache_bytes(run, rows), f"the rollout process's: {rows} rows x {run.row} "
                                                                 f"tokens")}
    if not run.on_gpu:  # on a GPU the copy in flight is in host memory
        parts["async", "sync copy"] = (shape.params * run.weight, "the weights on their way to the rollout process")
    return parts


def _critic_parts(config, run: _Run) -> Parts:
    """GAE's value model: weights, gradients, optimizer state (the adapters' and the value head's alone under
    LoRA), activations. Its shape is ``critic.model.path``'s (the policy's when unset), its LM head replaced by
    the value head."""
    critic = config.critic
    if critic.model.path and str(critic.model.path) != roles.policy_path(config):
        run = dataclasses.replace(run, shape=ModelShape.of(roles.critic_config(config)))
        whose = "critic.model.path's model"
    else:
        whose = "the policy's shape"
    shape = run.shape
    states = OPTIMIZER_STATES.get(str(critic.optim.optimizer).lower(), 2)
    arr = config.actor_rollout_ref
    mini = critic.ppo_mini_batch_size or arr.actor.ppo_mini_batch_size
    rows = critic.ppo_micro_batch_size_per_gpu or max(1, mini * arr.rollout.n // run.ranks)
    shard = fsdp_shard(critic.fsdp_config, run.ranks)
    params = shape.value_model_params()
    trainable = lora_params(shape, critic.model.lora_rank) + shape.hidden + 1 if critic.model.lora_rank else params
    adapters = f", LoRA rank {critic.model.lora_rank}" if critic.model.lora_rank else ""
    return {("critic", "state"): (run.weights(params, shard) + (1 + states) * run.weights(trainable, shard),
                                  f"weights, gradients and optimizer ({whose}, a value head for the LM head"
                                  f"{adapters})"),
            ("critic", "activations"): (run.kept(rows * run.row, critic.model.enable_gradient_checkpointing),
                                        f"micro-batch {rows} x {run.row} tokens")}


def _phases(parts: Parts, *, adam: bool, engine_sleeps: bool = False) -> dict[str, int]:
    """``engine_sleeps``: the trainer's vLLM engine sleeps between rollouts (``free_cache_engine`` on a GPU: its
    weights offloaded, its KV cache freed), so its share of the GPU counts in the rollout phase only."""
    size = lambda *keys: sum(parts.get(key, (0, ""))[0] for key in keys)
    engine = size(("rollout", "vLLM"))
    resident = size(("actor", "weights"), ("actor", "optimizer"), ("reference", "weights"), ("critic", "state"),
                    ("rollout", "weights"), ("async", "vLLM"), ("async", "weights"),
                    ("async", "KV cache"), ("async", "sync copy")) + (0 if engine_sleeps else engine)
    gradients = size(("actor", "gradients"))
    return {
        "rollout": resident + size(("rollout", "KV cache"), ("rollout", "gathered")) + (engine if engine_sleeps else 0),
        "log_prob": resident + size(("log-prob", "forward")),
        "update": resident + gradients + size(("actor", "activations"), ("critic", "activations")),
        # torch's AdamW (foreach) holds one temporary the size of the trainable parameters while it steps
        "optimizer_step": resident + gradients * (2 if adam else 1),
    }


def lora_params(shape: ModelShape, rank: int) -> int:
    """Adapter parameters of rank ``rank`` on every linear layer of a decoder (q, k, v, o, gate, up, down)."""
    kv = shape.kv_heads * shape.head_dim
    q = shape.heads * shape.head_dim
    per_layer = ((shape.hidden + q) + 2 * (shape.hidden + kv) + (q + shape.hidden)
                 + 2 * (shape.hidden + shape.intermediate) + (shape.intermediate + shape.hidden))
    return rank * per_layer * shape.layers


# What lowers each part, in the order to try.
_ARR = "actor_rollout_ref"
FIXES = {
    "activations": (f"a smaller {_ARR}.actor.ppo_micro_batch_size_per_gpu (or {_ARR}.actor.use_dynamic_bsz=true with a "
                    f"smaller ppo_max_token_len_per_gpu)", f"{_ARR}.model.enable_gradient_checkpointing=true"),
    "forward": (f"a smaller {_ARR}.rollout.log_prob_micro_batch_size_per_gpu and {_ARR}.ref."
                f"log_prob_micro_batch_size_per_gpu (null means the whole batch in one pass)",),
    "KV cache": (f"a smaller {_ARR}.rollout.max_num_seqs (sequences decoded at once)",
                 f"{_ARR}.rollout.generation_batch_size (prompts per generate call)",
                 "a shorter data.max_response_length or a smaller data.train_batch_size"),
    "weights": (f"{_ARR}.actor.fsdp_config.param_offload=true (on a GPU)", f"LoRA ({_ARR}.model.lora_rank=16)",
                "more ranks (trainer.n_gpus_per_node / trainer.nnodes): FSDP shards weights, gradients and optimizer"),
    "gradients": (f"LoRA ({_ARR}.model.lora_rank=16)", "more ranks (trainer.n_gpus_per_node / trainer.nnodes)"),
    "optimizer": (f"{_ARR}.actor.fsdp_config.optimizer_offload=true (on a GPU)", f"LoRA ({_ARR}.model.lora_rank=16)",
                  "more ranks (trainer.n_gpus_per_node / trainer.nnodes)"),
    "state": ("critic.fsdp_config.param_offload=true / optimizer_offload=true (on a GPU)",
              "more ranks (trainer.n_gpus_per_node / trainer.nnodes)"),
    "vLLM": (f"a smaller {_ARR}.rollout.gpu_memory_utilization",),
    "vLLM engine": (f"a larger {_ARR}.rollout.tensor_model_parallel_size (the model split over that many GPUs)",
                    f"a larger {_ARR}.rollout.gpu_memory_utilization, with the actor's state offloaded "
                    f"({_ARR}.actor.fsdp_config.param_offload=true, optimizer_offload=true)"),
    "runtime": ("close other programs",),
}
