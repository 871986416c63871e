"""A value model for PPO's critic, built from any causal LM.

The language-model head (hidden -> vocabulary) is replaced by a value head (hidden -> 1), so
every architecture that ``AutoModelForCausalLM`` loads gets a critic without model-specific code.
"""

from __future__ import annotations

import torch
from torch import nn


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
        self.model = causal_lm
        self.config = causal_lm.config

    def forward(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=False)
        # clone: a view as the output of an FSDP-wrapped module would bypass its backward hook.
        return out.logits.squeeze(-1).float().clone()

    def response_values(self, input_ids, attention_mask, position_ids, response_length: int) -> torch.Tensor:
        """Values ``[B, T_resp]`` of the states from which each response token was chosen."""
        values = self(input_ids, attention_mask, position_ids)
        return values[:, -response_length - 1:-1]
