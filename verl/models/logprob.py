"""Per-token log-probabilities and entropies of responses under a causal LM.

Sequences are laid out as in :mod:`verl.protocol`: a left-padded prompt followed by a
right-padded response. The logits at position t predict token t+1, so the response's
log-probs come from the T_resp positions that end one before the last.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from verl.algorithms import entropy_from_logits


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] for each position: ``[..., V]``, ``[...]`` -> ``[...]``."""
    # cross_entropy fuses log_softmax and gather without materialising a second [.., V] tensor.
    flat = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), reduction="none")
    return -flat.view(labels.shape)


def response_logits(model, input_ids, attention_mask, position_ids, response_length: int):
    """Logits ``[B, T_resp, V]`` that predict each response token."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    return out.logits[:, -response_length - 1:-1, :]


def compute_response_logprobs(model, input_ids, attention_mask, position_ids, responses, *,
                              temperature: float = 1.0, with_entropy: bool = False):
    """Log-probs ``[B, T_resp]`` of ``responses`` (and entropies when asked) under ``model``.

    Logits are divided by the sampling temperature so the numbers describe the distribution the
    rollout actually sampled from (for greedy decoding pass 1.0).
    """
    logits = response_logits(model, input_ids, attention_mask, position_ids, responses.shape[1])
    if temperature != 1.0 and temperature > 0:
        logits = logits / temperature
    log_probs = logprobs_from_logits(logits, responses)
    entropy = entropy_from_logits(logits.float()) if with_entropy else None
    return log_probs, entropy
