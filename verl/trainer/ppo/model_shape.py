"""The sizes a memory plan (:mod:`verl.trainer.ppo.memory_plan`) depends on, read from a model's config: the
parameters counted on the meta device, the widths a decoder layer's activations follow (the attention's
heads x head_dim, per-head q/k norms, the hidden-wide norms of a layer, the MLP width a token runs through:
a mixture of experts' ``num_experts_per_tok`` experts and its shared one), the attention transformers picks by
default, and whether scores and logits are soft-capped."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class ModelShape:
    params: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    qk_norm_width: int = 0  # q and k widths under per-head norms (Qwen3), 0 without
    default_attention: str | None = None  # the attention transformers picks for this model when none is asked for
    norms_per_layer: int = 2  # hidden-wide norms in a decoder layer (Gemma 2: 4)
    score_softcap: bool = False  # attention scores soft-capped (Gemma 2's attn_logit_softcapping): one more copy
    logit_softcap: bool = False  # logits soft-capped (Gemma 2's final_logit_softcapping): one more [T, V]
    routed: int = 0  # a mixture of experts: the experts each token runs through (input and output copied for each)
    layer_norm: bool = False  # LayerNorm (one fused op: OPT, GPT-2, Falcon, GPT-NeoX, StableLM), not RMSNorm
    mlp_tensors: int = 4  # I-wide tensors the MLP keeps per token: gated 4; plain 1 (ReLU), 2 (GELU), 5 (gelu_new)
    head_params: int = 0  # the LM head's parameters not shared with the input embeddings (0 when tied)

    def value_model_params(self) -> int:
        """The critic's parameters: the value head (hidden -> 1, with a bias) replaces the LM head
        (:class:`verl.models.value_model.ValueModel`; a tied head leaves the embeddings in place)."""
        return self.params - self.head_params + self.hidden + 1

    @classmethod
    def of(cls, hf_config) -> "ModelShape":
        """Counts parameters on the meta device (nothing is allocated) and reads the sizes the
        activations depend on, under the names the common architectures use."""
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        from verl.models.vision import is_vision_model

        # A vision-language model: its parameters count whole, its sizes are its language model's (the
        # vision tower's activations are not in the plan).
        auto = AutoModelForImageTextToText if is_vision_model(hf_config) else AutoModelForCausalLM
        with torch.device("meta"):
            model = auto.from_config(hf_config)
        params = sum(p.numel() for p in model.parameters())
        head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
        head_params = 0 if head is None or (embeddings is not None and head.weight is embeddings.weight) \
            else sum(p.numel() for p in head.parameters())
        hf_config = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
        get = lambda *names, default=None: next((getattr(hf_config, n) for n in names
                                                  if getattr(hf_config, n, None) is not None), default)
        hidden = get("hidden_size", "d_model", "n_embd")
        heads = get("num_attention_heads", "n_head", default=1)
        layer, qk_norm_width, norms, layer_norm, gated = _first_decoder_layer(model), 0, 0, False, True
        if layer is not None:
            # Per-head q/k norms (Qwen3, OLMo 2) norm as wide as q and k; the layer's hidden-wide norms (Gemma 2: 4).
            attention = getattr(layer, "self_attn", None)
            if all(hasattr(attention, name) for name in ("q_norm", "k_norm", "q_proj", "k_proj")):
                qk_norm_width = attention.q_proj.out_features + attention.k_proj.out_features
            wide = [m for m in layer.modules() if type(m).__name__.endswith("Norm")
                    and tuple(getattr(getattr(m, "weight", None), "shape", ())) == (hidden,)]
            norms, layer_norm = len(wide), bool(wide) and all(isinstance(m, torch.nn.LayerNorm) for m in wide)
            gated = any("gate_proj" in name or "gate_up_proj" in name for name, _ in layer.named_parameters())
        default_attention = getattr(model.config, "_attn_implementation", None)
        intermediate = get("intermediate_size", "ffn_dim", "n_inner", default=4 * hidden)
        routed = get("num_experts_per_tok", "experts_per_token", default=0)
        if not get("num_local_experts", "num_experts", "n_routed_experts", default=0):
            routed = 0
        if routed:  # the MLP a token runs through: its routed experts side by side, and the shared expert(s)
            expert = get("moe_intermediate_size", default=intermediate)
            shared = get("shared_expert_intermediate_size", default=get("n_shared_experts", default=0) * expert)
            intermediate = routed * expert + shared
        activation = str(get("hidden_act", "activation_function", "hidden_activation", "activation", default=""))
        mlp_tensors = 4 if gated or routed else PLAIN_MLP_TENSORS.get(activation, 4)
        return cls(params=params, layers=get("num_hidden_layers", "n_layer", default=1), hidden=hidden,
                   intermediate=intermediate, heads=heads,
                   kv_heads=get("num_key_value_heads", default=heads),
                   head_dim=get("head_dim", default=hidden // heads), vocab=get("vocab_size"),
                   qk_norm_width=qk_norm_width, default_attention=default_attention, norms_per_layer=norms or 2,
                   score_softcap=bool(get("attn_logit_softcapping")), logit_softcap=bool(get("final_logit_softcapping")),
                   routed=routed, layer_norm=layer_norm, mlp_tensors=mlp_tensors, head_params=head_params)

    def layer_activation_bytes(self, compute: int, tokens_per_row: int, eager: bool) -> int:
        """Bytes one decoder layer keeps for its backward, per token."""
        # An RMSNorm keeps an fp32 copy of its input, the normalized and the scaled output; a LayerNorm (one op) its
        # input and output
        norm = 2 * compute if self.layer_norm else 4 + 2 * compute
        norms = norm * self.norms_per_layer * self.hidden + (4 + compute) * self.qk_norm_width
        # softmax's fp32 output and its cast (none in fp32); soft-capped scores keep their tanh too
        probabilities = 4 + (compute if compute != 4 else 0) + (compute if self.score_softcap else 0)
        attention = 5 * compute * self.heads * self.head_dim + (
            probabilities * self.heads * tokens_per_row if eager else 0)
        # A gated MLP (gate, up, activation, product), or a plain one (see PLAIN_MLP_TENSORS); a mixture of
        # experts also keeps each routed copy of the token's input and of its expert's output.
        return (norms + attention + self.mlp_tensors * compute * self.intermediate
                + 2 * compute * self.routed * self.hidden)

    def forward_bytes(self, compute: int) -> int:
        """Bytes a no-grad forward holds at once per token (one layer's widest tensors)."""
        return compute * (4 * self.hidden + 2 * self.intermediate)


# I-wide tensors a plain (not gated) MLP keeps per token for its backward, by activation (measured with
# autograd's saved tensors): ReLU its output (which is also the down projection's input), a one-op GELU its input
# and output, GPT-2's and Phi's gelu_new (a Python formula) 5. Any other: 4, as a gated MLP (a model whose gate
# projection has another name than gate_proj, InternLM2's w1 and w3, is not counted short).
PLAIN_MLP_TENSORS = {"relu": 1, "gelu": 2, "gelu_pytorch_tanh": 2, "gelu_new": 5}


def _first_decoder_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    """The first layer of the language model's stack (``...layers.0``, GPT-2's and Falcon's ``...h.0``; a
    vision-language model's, not its vision tower's), or None."""
    layers = [(name, m) for name, m in model.named_modules() if name.endswith(("layers.0", ".h.0"))]
    layers.sort(key=lambda item: "language_model" not in item[0])
    return layers[0][1] if layers else None
