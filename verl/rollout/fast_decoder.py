"""A lean decode path for Llama-family causal LMs, for the ``native`` rollout: the same math as the
Hugging Face forward, in a fraction of the tensor operations.

At rollout sizes on a CPU (a few million parameters, batch 64) a decode step of the Hugging Face
forward spends most of its time outside the weight matmuls: mask building, cache bookkeeping,
module calls and many small ops. :class:`FastDecoder` runs the same blocks as a flat loop of about
twenty tensor ops per layer:

- the weights are read from the Hugging Face module when the decoder is built (once per
  ``generate`` call, so the hybrid engine's freshly gathered weights are always the ones used);
  q/k/v and gate/up are concatenated into one matrix each (Phi-3 has them fused already);
- the KV cache is preallocated, ``[batch * kv_heads, head_dim, capacity]`` for keys (stored
  transposed, so ``q @ k`` needs no copy) and ``[batch * kv_heads, capacity, head_dim]`` for values;
  every row writes decode step ``t`` into the same column, as the prompts are left-padded;
- RoPE comes from a cos/sin table built once from the model's own ``inv_freq``;
- decode attention is two batched matmuls over the kv-head groups (the ``G`` query heads of a kv
  head act as ``G`` query rows, so keys and values are never repeated), with an additive mask that
  hides the prompt's left padding (in fp32 for 16-bit models on a CPU, where 16-bit ``bmm`` keeps
  state for every new shape); the prefill uses ``scaled_dot_product_attention``;
- RMSNorm is ``torch.nn.functional.rms_norm``; residual adds are folded into ``addmm``.

Supported: ``model_type`` qwen2, qwen3 (with its per-head q/k norms), llama, mistral and phi3 with
their own Hugging Face classes, SiLU MLPs, RoPE over the whole head with fixed frequencies (types
"default", "linear", Llama 3.x's "llama3", "yarn"), biases on any projection (Qwen2's q/k/v, Llama's
``attention_bias`` / ``mlp_bias``), tied or untied LM head, a sliding window only when the whole
sequence fits in it. :func:`unsupported_reason` says why a model is not supported, and the engine
then runs the Hugging Face forward instead. ``tests/unit/test_fast_decoder.py`` checks the logits
against the Hugging Face forward (fp32, 1e-5) for the prefill and for decode steps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# model_type -> class-name prefix of its Hugging Face modules
FAMILIES = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama", "mistral": "Mistral", "phi3": "Phi3"}
ATTENTION_IMPLEMENTATIONS = (None, "eager", "sdpa", "flash_attention_2", "flash_attention_3")
# RoPE types whose frequencies are fixed when the model is built (the rotary module's inv_freq, and for yarn a
# constant factor on cos and sin): Llama 3.x's "llama3", "linear", Qwen's long-context "yarn". "dynamic" and
# "longrope" (Phi-3-128k, Phi-3.5) recompute them from the sequence length: the Hugging Face forward runs those.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _sliding_window(config) -> int | None:
    """The attention window the Hugging Face model applies, or None for full attention."""
    window = getattr(config, "sliding_window", None)
    if config.model_type in ("qwen2", "qwen3"):
        layer_types = getattr(config, "layer_types", None) or []
        return window if "sliding_attention" in layer_types else None
    return window if config.model_type in ("mistral", "phi3") else None


def _has_hooks(model: nn.Module) -> bool:
    from torch.nn.modules import module as module_globals

    if module_globals._global_forward_hooks or module_globals._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def unsupported_reason(model: nn.Module, total_length: int | None = None) -> str | None:
    """Why :class:`FastDecoder` cannot run ``model`` (for sequences of ``total_length`` positions),
    or None when it can. The checks are those of the math it implements: anything else runs the
    Hugging Face forward."""
    config = getattr(model, "config", None)
    family = FAMILIES.get(getattr(config, "model_type", None))
    if family is None:
        return f"model_type {getattr(config, 'model_type', None)!r} is not one of {sorted(FAMILIES)}"
    if type(model).__name__ != f"{family}ForCausalLM":
        return f"{type(model).__name__} is not {family}ForCausalLM"
    if _has_hooks(model):
        return "the model has forward hooks, which a fused decoder would skip"
    if getattr(config, "hidden_act", None) not in ("silu", "swish"):
        return f"hidden_act {getattr(config, 'hidden_act', None)!r} is not silu"
    if getattr(config, "_attn_implementation", None) not in ATTENTION_IMPLEMENTATIONS:
        return f"attention implementation {config._attn_implementation!r}"
    window = _sliding_window(config)
    if window is not None and (total_length is None or total_length > window):
        return f"sliding window {window} shorter than the sequence ({total_length})"
    body = getattr(model, "model", None)
    if body is None or type(body).__name__ != f"{family}Model":
        return "no Hugging Face decoder body at model.model"
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(body, name):
            return f"model.model has no {name}"
    if type(body.embed_tokens) is not nn.Embedding or type(getattr(model, "lm_head", None)) is not nn.Linear:
        return "embedding or LM head is not a plain nn.Embedding / nn.Linear"
    if len(body.layers) != config.num_hidden_layers:
        return "the number of layers differs from config.num_hidden_layers"
    rotary = body.rotary_emb
    if getattr(rotary, "rope_type", None) not in STATIC_ROPE_TYPES \
            or not isinstance(getattr(rotary, "attention_scaling", None), (int, float)):
        return (f"RoPE type {getattr(rotary, 'rope_type', None)!r} (implemented: {', '.join(STATIC_ROPE_TYPES)}; "
                f"the others change their frequencies with the sequence length)")
    norms = [body.norm]
    for layer in body.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if type(layer).__name__ != f"{family}DecoderLayer" or type(attn).__name__ != f"{family}Attention" \
                or type(mlp).__name__ != f"{family}MLP":
            return f"layer {type(layer).__name__} is not a plain {family}DecoderLayer"
        projections = ["o_proj"] + (["qkv_proj"] if family == "Phi3" else ["q_proj", "k_proj", "v_proj"])
        if any(type(getattr(attn, p, None)) is not nn.Linear for p in projections):
            return f"attention projections are not plain nn.Linear ({type(attn).__name__})"
        mlp_projections = ["down_proj"] + (["gate_up_proj"] if family == "Phi3" else ["gate_proj", "up_proj"])
        if any(type(getattr(mlp, p, None)) is not nn.Linear for p in mlp_projections):
            return f"MLP projections are not plain nn.Linear ({type(mlp).__name__})"
        if 2 * rotary.inv_freq.numel() != attn.head_dim or attn.scaling != attn.head_dim ** -0.5:
            return "partial rotary or non-standard attention scaling"
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
        if family == "Qwen3":  # RMSNorm over each head's queries and keys, before RoPE
            norms += [getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)]
            if getattr(norms[-2], "variance_epsilon", None) != getattr(norms[-1], "variance_epsilon", None):
                return "q_norm and k_norm with different epsilons"
    if any(type(n).__name__ != f"{family}RMSNorm" for n in norms):
        return "a norm is not the family's RMSNorm"
    params = list(model.parameters())
    if any(p.is_meta or type(p.data) is not torch.Tensor for p in params):
        return "parameters are not plain tensors (meta, sharded or wrapped)"
    if len({(p.device, p.dtype) for p in params}) != 1:
        return "parameters on several devices or of several dtypes"
    return None


# Fusing q/k/v and gate/up copies those weights at every call; above this many bytes of parameters
# (a large model, where the few saved ops do not matter) each projection runs on its own.
PACK_LIMIT_BYTES = 1 << 30


def _parts(projections: list[nn.Linear], rows: torch.Tensor | None, pack: bool) -> list[tuple]:
    """``[(W^T, bias)]`` computing the concatenated outputs of ``projections``, output features
    reordered by ``rows`` (an index over the concatenation; None: as they are). Packed: one matmul."""
    if not pack:
        return [(p.weight.t(), p.bias) for p in projections]
    weight = torch.cat([p.weight for p in projections]) if len(projections) > 1 else projections[0].weight
    bias = None
    if any(p.bias is not None for p in projections):
        bias = torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.out_features)
                          for p in projections])
    if rows is not None:
        weight, bias = weight[rows], None if bias is None else bias[rows]
    return [(weight.t(), bias)]


def _project(x: torch.Tensor, parts: list[tuple]) -> torch.Tensor:
    outs = [torch.mm(x, w) if b is None else torch.addmm(b, x, w) for w, b in parts]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


def _project_residual(residual: torch.Tensor, x: torch.Tensor, part: tuple) -> torch.Tensor:
    """``residual + x @ W^T (+ b)``, the add folded into the matmul."""
    out = torch.addmm(residual, x, part[0])
    return out if part[1] is None else out.add_(part[1])


class _Layer:
    """One decoder layer's weights, read from the Hugging Face layer (views, or packed copies)."""

    __slots__ = ("norm1", "eps1", "qkv", "o", "norm2", "eps2", "gate_up", "down", "qk_norm", "qk_eps")

    def __init__(self, layer: nn.Module, pack: bool, qk_rows: torch.Tensor | None, heads: int, kv_heads: int,
                 head_order: torch.Tensor | None):
        attn, mlp = layer.self_attn, layer.mlp
        # Qwen3's per-head q/k norms, as one weight [heads + kv_heads, head_dim] in the q/k layout used
        # (``head_order``: the pair-interleaved order of the complex RoPE; an RMS is order-blind).
        self.qk_norm = self.qk_eps = None
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm.weight, attn.k_norm.weight
            if head_order is not None:
                q, k = q[head_order], k[head_order]
            self.qk_norm = torch.cat([q.expand(heads, -1), k.expand(kv_heads, -1)])
            self.qk_eps = attn.q_norm.variance_epsilon
        qkv = [attn.qkv_proj] if hasattr(attn, "qkv_proj") else [attn.q_proj, attn.k_proj, attn.v_proj]
        gate_up = [mlp.gate_up_proj] if hasattr(mlp, "gate_up_proj") else [mlp.gate_proj, mlp.up_proj]
        self.norm1, self.eps1 = layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon
        self.norm2, self.eps2 = layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon
        self.qkv = _parts(qkv, qk_rows, pack)
        self.o = _parts([attn.o_proj], None, False)[0]
        self.gate_up = _parts(gate_up, None, pack)
        self.down = _parts([mlp.down_proj], None, False)[0]


class FastDecoder:
    """Prefill and decode with a preallocated KV cache: the logits of a model that
    :func:`unsupported_reason` accepts. Build one per ``generate`` call (it reads the weights then).

    ``prefill(ids, mask, positions, capacity)`` -> last-position logits of left-padded prompts;
    ``select(index)`` gathers cache rows (hand a prompt's cache to its samples, drop finished rows);
    ``decode(tokens, positions)`` -> logits of one more token per row.

    Packed (parameters up to :data:`PACK_LIMIT_BYTES`): q/k/v and gate/up run as one matmul each.
    Packed in fp32/fp64, RoPE is one complex multiply: the q and k weight rows of each head are
    reordered so that the pairs RoPE rotates together (``i`` and ``i + head_dim / 2``) sit side by
    side, which leaves every q.k product unchanged, and the rotated keys are written straight into
    the cache. Otherwise RoPE is ``x * cos + swap_halves(x) * sin`` on the model's own layout.
    """

    def __init__(self, model: nn.Module):
        body, config = model.model, model.config
        attn = body.layers[0].self_attn
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = attn.head_dim
        self.groups = self.heads // self.kv_heads
        self.scale = attn.scaling
        self.embed = body.embed_tokens.weight
        self.dtype, self.device = self.embed.dtype, self.embed.device
        pack = sum(p.numel() * p.element_size() for p in model.parameters()) <= PACK_LIMIT_BYTES
        self.complex = pack and self.dtype in (torch.float32, torch.float64)
        # 16-bit on a CPU: decode attention in fp32. oneDNN, which runs 16-bit bmm there, keeps state
        # for every new shape (about 0.7 MB each), and decode attention has a new shape every step
        # (the filled cache grows, finished rows leave): a process's memory grew by ~3 MB per decode
        # step and kept growing across calls (docs/performance.md). fp32 bmm keeps nothing.
        self.attention_fp32 = self.device.type == "cpu" and self.dtype in (torch.bfloat16, torch.float16)
        qk_rows = pairs = None
        if self.complex:
            half, dim = self.head_dim // 2, self.head_dim
            pairs = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()
            qk_heads = self.heads + self.kv_heads
            qk_rows = (torch.arange(qk_heads)[:, None] * dim + pairs).flatten()
            qk_rows = torch.cat([qk_rows, torch.arange(qk_heads * dim, (qk_heads + self.kv_heads) * dim)])
            qk_rows = qk_rows.to(self.device)
        head_order = None if pairs is None else pairs.to(self.device)
        self.layers = [_Layer(layer, pack, qk_rows, self.heads, self.kv_heads, head_order) for layer in body.layers]
        self.norm, self.norm_eps = body.norm.weight, body.norm.variance_epsilon
        self.lm = _parts([model.lm_head], None, False)
        self.inv_freq = body.rotary_emb.inv_freq
        self.rope_scaling = float(body.rotary_emb.attention_scaling)  # yarn's factor on cos and sin; else 1
        self.length = 0

    # --------------------------------------------------------------------------- shared pieces
    def _rope_tables(self, positions: int) -> None:
        """RoPE factors for ``positions`` positions, computed as the Hugging Face rotary embedding
        computes them (fp32 frequencies, then the model's dtype). Complex: ``cos + i sin`` per pair.
        Else ``cos`` and a signed ``sin`` (``-sin`` in its first half), so that rotating ``x`` is
        ``x * cos + swap_halves(x) * sin``: exactly ``rotate_half``, which negates the second half."""
        freqs = torch.arange(positions, device=self.device).float()[:, None] * self.inv_freq.float().to(self.device)
        cos, sin = freqs.cos(), freqs.sin()
        if self.rope_scaling != 1.0:
            cos, sin = cos * self.rope_scaling, sin * self.rope_scaling
        cos, sin = cos.to(self.dtype), sin.to(self.dtype)
        if self.complex:
            self.rot = torch.complex(cos, sin)
        else:
            self.cos = torch.cat([cos, cos], dim=-1)
            self.sin = torch.cat([-sin, sin], dim=-1)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``x [rows, (seq,) heads, head_dim]`` rotated for ``positions [rows (, seq)]`` (a new tensor)."""
        if self.complex:
            rot = self.rot[positions].unsqueeze(-2)
            pairs = torch.view_as_complex(x.unflatten(-1, (self.head_dim // 2, 2)))
            return torch.view_as_real(pairs * rot).flatten(-2)
        cos, sin = self.cos[positions].unsqueeze(-2), self.sin[positions].unsqueeze(-2)
        swapped = x.unflatten(-1, (2, self.head_dim // 2)).flip(-2).flatten(-2)
        return torch.addcmul(x * cos, swapped, sin)

    @staticmethod
    def _qk_norm(qk: torch.Tensor, layer: _Layer) -> torch.Tensor:
        """``qk [..., heads + kv_heads, head_dim]`` through the layer's per-head norms (Qwen3), else as is."""
        if layer.qk_norm is None:
            return qk
        return F.rms_norm(qk, qk.shape[-1:], None, layer.qk_eps).mul_(layer.qk_norm)

    def _mlp(self, x: torch.Tensor, layer: _Layer) -> torch.Tensor:
        h = F.rms_norm(x, layer.norm2.shape, layer.norm2, layer.eps2)
        gate_up = _project(h, layer.gate_up)
        inner = gate_up.shape[-1] // 2
        return _project_residual(x, F.silu(gate_up[:, :inner]).mul_(gate_up[:, inner:]), layer.down)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return _project(F.rms_norm(x, self.norm.shape, self.norm, self.norm_eps), self.lm).float()

    # --------------------------------------------------------------------------- prefill
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor,
                capacity: int) -> torch.Tensor:
        """Float32 logits ``[U, V]`` of the last position of each left-padded prompt; fills the cache
        (``capacity`` positions: prompt + new tokens)."""
        rows, length = input_ids.shape
        self._rope_tables(max(capacity, int(positions.max()) + 1))
        self.keys, self.values = [], []

        def store(k: torch.Tensor, v: torch.Tensor) -> None:
            for cache, new in ((self.keys, k), (self.values, v)):
                buffer = torch.empty(rows, self.kv_heads, capacity, self.head_dim, dtype=self.dtype, device=self.device)
                buffer[:, :, :length] = new
                cache.append(buffer.view(rows * self.kv_heads, capacity, self.head_dim))

        logits, valid = self._prompts(input_ids, attention_mask, positions, store)
        # Additive decode mask over the cache: 0 on real prompt keys and on every decode column.
        bias = torch.zeros(rows, self.kv_heads, 1, capacity, dtype=self.dtype, device=self.device)
        bias[:, :, 0, :length].masked_fill_(~valid[:, None, :], float("-inf"))
        self.bias = bias.view(rows * self.kv_heads, 1, capacity)
        self.start = torch.zeros(rows, dtype=torch.long, device=self.device)  # each row's first column
        self.length = length
        return logits

    def refill(self, slots: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               positions: torch.Tensor, samples: torch.Tensor, max_new: int) -> torch.Tensor:
        """Continuous batching: new rows take the cache rows ``slots`` (rows that finished), in place. The
        distinct left-padded prompts are prefilled once; slot ``i`` gets prompt ``samples[i]``, placed so
        that it ends at the last filled column, every column before it masked, and it decodes on with
        the other rows from the next column. When the cache lacks room for ``max_new`` more columns, it
        is rebuilt without the columns no row reads any more, with room to spare; prompts longer than
        the filled columns move every row right (the new columns masked). Returns each slot's
        logits ``[len(slots), V]``."""
        length = input_ids.shape[1]
        filled, kv = self.length, self.kv_heads
        offset = filled - length  # the new prompts' first column (prompts share their padded length)
        shift = max(0, -offset)  # prompts longer than the filled columns: every row moves right, masked before
        self.start[slots] = max(offset, 0)
        capacity = self.keys[0].shape[1]
        if shift or filled + max_new > capacity:
            first = int(self.start.min())  # columns before it are masked for every row
            kept = filled - first
            capacity = kept + shift + 2 * max_new  # room for a few refills before the next rebuild

            def rebuilt(buffer: torch.Tensor) -> torch.Tensor:
                out = buffer.new_empty(buffer.shape[0], capacity, *buffer.shape[2:])
                out[:, :shift] = 0  # masked, but read: uninitialised memory may hold NaN, which a mask does not hide
                out[:, shift:shift + kept] = buffer[:, first:filled]
                return out

            self.keys, self.values = [rebuilt(k) for k in self.keys], [rebuilt(v) for v in self.values]
            bias = self.bias.new_zeros(self.bias.shape[0], 1, capacity)  # 0 on every decode column
            bias[:, :, :shift] = float("-inf")
            bias[:, :, shift:shift + kept] = self.bias[:, :, first:filled]
            self.bias = bias
            self.start += shift - first
            if shift:
                self.start[slots] = 0
            filled = self.length = kept + shift
            offset = filled - length
        table = len(self.rot if self.complex else self.cos)
        if table < int(positions.max()) + 1 + max_new:
            self._rope_tables(int(positions.max()) + 1 + max_new)
        layer = iter(range(len(self.layers)))

        def store(k: torch.Tensor, v: torch.Tensor) -> None:  # each sample's prompt into its slot
            i = next(layer)
            for cache, new in ((self.keys, k), (self.values, v)):
                cache[i].view(-1, kv, capacity, self.head_dim)[slots, :, offset:filled] = new[samples]

        logits, valid = self._prompts(input_ids, attention_mask, positions, store)
        bias = self.bias.view(-1, kv, capacity)
        rows = bias[slots]
        rows[:, :, :offset] = float("-inf")
        rows[:, :, offset:] = 0
        rows[:, :, offset:filled].masked_fill_(~valid[samples][:, None, :], float("-inf"))
        bias[slots] = rows
        return logits[samples]

    def _prompts(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor, store):
        """The forward of left-padded prompts: last-position logits and the mask of real positions ``[U, P]``;
        each layer's rotated keys and values ``[U, kv, P, dim]`` go to ``store(keys, values)`` in layer order."""
        rows, length = input_ids.shape
        heads, kv, dim = self.heads, self.kv_heads, self.head_dim
        valid = attention_mask.bool()
        causal = torch.ones(length, length, dtype=torch.bool, device=self.device).tril()
        # A real query sees the real keys up to itself; a pad query only itself (no all-masked row).
        allowed = (causal & valid[:, None, :]) | torch.eye(length, dtype=torch.bool, device=self.device)
        allowed = allowed.unsqueeze(1)  # [U, 1, P, P]
        x = F.embedding(input_ids, self.embed).view(rows * length, -1)
        for layer in self.layers:
            h = F.rms_norm(x, layer.norm1.shape, layer.norm1, layer.eps1)
            qkv = _project(h, layer.qkv).view(rows, length, heads + 2 * kv, dim)
            qk = self._rope(self._qk_norm(qkv[:, :, :heads + kv], layer), positions)
            q, k, v = qk[:, :, :heads].transpose(1, 2), qk[:, :, heads:].transpose(1, 2), qkv[:, :, heads + kv:]
            store(k, v.transpose(1, 2))
            out = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), attn_mask=allowed, scale=self.scale,
                                                 enable_gqa=self.groups > 1)
            x = _project_residual(x, out.transpose(1, 2).reshape(rows * length, heads * dim), layer.o)
            x = self._mlp(x, layer)
        return self._logits(x.view(rows, length, -1)[:, -1]), valid

    # --------------------------------------------------------------------------- batch changes
    def select(self, index: torch.Tensor) -> None:
        """Keep (or repeat) cache rows: row ``i`` of the new batch is row ``index[i]`` of the old."""
        kv = self.kv_heads
        gather = (index[:, None] * kv + torch.arange(kv, device=index.device)).flatten()
        end = self.length

        def moved(buffer: torch.Tensor) -> torch.Tensor:  # only the filled columns are copied
            out = buffer.new_empty((len(gather),) + buffer.shape[1:])
            out[:, :end] = buffer[gather, :end]
            return out

        self.keys, self.values = [moved(k) for k in self.keys], [moved(v) for v in self.values]
        self.bias = self.bias[gather]
        self.start = self.start[index]

    # --------------------------------------------------------------------------- decode
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[b, V]`` after feeding one token per row at its RoPE position ``positions [b]``."""
        b = tokens.shape[0]
        heads, kv, dim, groups = self.heads, self.kv_heads, self.head_dim, self.groups
        col = self.length
        end = col + 1
        nqk, rows, half = (heads + kv) * dim, b * kv, dim // 2
        bias = self.bias[:, :, :end]
        if self.complex:
            rot = self.rot.index_select(0, positions).unsqueeze(1)  # [b, 1, half]
        else:
            cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # [b, 1, dim]
        x = F.embedding(tokens, self.embed)
        for layer, keys, values in zip(self.layers, self.keys, self.values):
            h = F.rms_norm(x, layer.norm1.shape, layer.norm1, layer.eps1)
            qkv = _project(h, layer.qkv)
            qk = self._qk_norm(qkv[:, :nqk].view(b, heads + kv, dim), layer)
            if self.complex:  # rotate q; rotate k straight into its cache column
                pairs = torch.view_as_complex(qk.view(b, heads + kv, half, 2))
                q = torch.view_as_real(pairs[:, :heads] * rot).view(rows, groups, dim)
                key_slot = torch.view_as_complex(keys.view(b, kv, -1, half, 2)[:, :, col])
                torch.mul(pairs[:, heads:], rot, out=key_slot)
            else:
                qk = torch.addcmul(qk * cos, qk.view(b, heads + kv, 2, half).flip(-2).view(b, heads + kv, dim), sin)
                keys.view(b, kv, -1, dim)[:, :, col] = qk[:, heads:]
                q = qk[:, :heads].reshape(rows, groups, dim)
            values.view(b, kv, -1, dim)[:, :, col] = qkv[:, nqk:].view(b, kv, dim)
            if self.attention_fp32:
                scores = torch.baddbmm(bias.float(), q.float(), keys[:, :end].transpose(1, 2).float(),
                                       alpha=self.scale)
                out = torch.bmm(torch.softmax(scores, dim=-1), values[:, :end].float()).to(self.dtype)
            else:
                scores = torch.baddbmm(bias, q, keys[:, :end].transpose(1, 2), alpha=self.scale)
                out = torch.bmm(torch.softmax(scores, dim=-1), values[:, :end])  # [b * kv, groups, dim]
            x = _project_residual(x, out.view(b, heads * dim), layer.o)
            x = self._mlp(x, layer)
        self.length = end
        return self._logits(x)
