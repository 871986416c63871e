"""Supervised fine-tuning loss: next-token cross-entropy on the response tokens only."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sft_loss(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over tokens where ``loss_mask`` is 1 (``loss_mask[t]`` marks token t)."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False).logits[:, :-1]
    targets = input_ids[:, 1:]
    mask = loss_mask[:, 1:].float()
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="none")
    return (nll.view_as(mask) * mask).sum() / mask.sum().clamp(min=1)
