"""A value model for PPO's critic, built from any causal LM.

The language-model head (hidden -> vocabulary) is replaced by a value head (hidden -> 1), so
every architecture that ``AutoModelForCausalLM`` loads gets a critic without model-specific code.
"""

from __future__ import annotations

import torch
from torch import nn

from verl.models.logprob import Packing, check_packing
from verl.models.vision import forward_inputs, packed_forward_inputs


class ValueModel(nn.Module):
    """``values[b, t]`` = V(prefix up to token t). Wraps a causal LM whose head becomes scalar."""

    def __init__(self, causal_lm: nn.Module):
        super().__init__()
        lm_head = causal_lm.get_output_embeddings()
        head = nn.Linear(lm_head.in_features, 1, bias=True, dtype=lm_head.weight.dtype,
                         device=lm_head.weight.device)
        # Zero init: the critic starts by predicting 0 for every state, a neutral baseline.
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
        causal_lm.config.tie_word_embeddings = False
        causal_lm.set_output_embeddings(head)
        # What some families do to the head's output, meant for logits, would bend the values: Gemma 2 and 3
        # soft-cap it (30 tanh(x / 30): no value beyond 30, the large ones shrunk), Granite divides it, Cohere
        # multiplies it. The value is the head's output as it is.
        for key, plain in (("final_logit_softcapping", None), ("logits_scaling", 1.0)):
            if getattr(causal_lm.config, key, None) is not None:
                setattr(causal_lm.config, key, plain)
        if isinstance(getattr(causal_lm, "logit_scale", None), (int, float)):
            causal_lm.logit_scale = 1.0
        self.model = causal_lm
        self.config = causal_lm.config

    def forward(self, input_ids, attention_mask=None, position_ids=None, *, last_hidden: bool = False,
                **extra) -> torch.Tensor:
        """Values ``[B, T]``; with ``last_hidden`` the backbone's last hidden states ``[B, T, H]`` instead.
        ``extra``: more inputs of the backbone (a vision-language model's images)."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=False, output_hidden_states=last_hidden, **extra)
        if last_hidden:
            return out.hidden_states[-1].float()
        # clone: a view as the output of an FSDP-wrapped module would bypass its backward hook.
        return out.logits.squeeze(-1).float().clone()

    def response_values(self, input_ids, attention_mask, position_ids, response_length: int, *,
                        remove_padding: bool = False, media=None) -> torch.Tensor:
        """Values ``[B, T_resp]`` of the states from which each response token was chosen.

        With ``remove_padding`` the pass runs on the packed sequences (see
        :mod:`verl.models.logprob`) and padding positions get 0. ``media``: the rows'
        ``multi_modal_inputs`` (a vision-language backbone): the pass (padded or packed) with the images
        and the model's M-RoPE positions.
        """
        if remove_padding:
            packing = Packing(input_ids, attention_mask, position_ids, response_length)
            extra = packed_forward_inputs(media, input_ids, attention_mask, packing.position_ids, self.model)
            return packing.unpack(packing.responses(self(packing.input_ids, None, **extra)))
        extra = forward_inputs(media, input_ids, attention_mask, self.model)
        if extra:
            return self(input_ids, attention_mask, **extra)[:, -response_length - 1:-1]
        values = self(input_ids, attention_mask, position_ids)
        return values[:, -response_length - 1:-1]

    def use_lora(self, model_cfg, config_key: str = "critic.model") -> None:
        """LoRA adapters on the backbone (``model_cfg.lora_rank``, ``lora_alpha``, ``target_modules``,
        ``exclude_modules``): the base weights freeze, the adapters and the new value head train."""
        from verl.models.lora import apply_lora

        self.model = apply_lora(self.model, model_cfg, config_key=config_key)
        # PEFT froze every base parameter, the head too; the head is new and must learn.
        self.model.get_output_embeddings().requires_grad_(True)

    def check_packing(self, device, key: str) -> None:
        """Raise a VerlError naming ``key`` unless packed sequences stay apart in this model (checked on
        the hidden states: the zero-initialised head would hide any difference)."""
        check_packing(self, device, key, forward=lambda ids, pos: self(ids, None, pos, last_hidden=True))
