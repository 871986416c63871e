"""Supervised fine-tuning loss: next-token cross-entropy on the response tokens only.

Shared by the SFT trainer and the demo's warm start, as a loss function of
:meth:`verl.workers.engine.TrainingEngine.train_batch` with :func:`sft_counts` as its counts.
"""

from __future__ import annotations

import torch

from verl.algorithms import agg_loss
from verl.protocol import Batch
from verl.trainer.offline.runtime import token_logps


def sft_counts(mini: Batch) -> dict:
    """The tokens the loss is averaged over: ``loss_mask[t]`` marks token t as a target."""
    return {"tokens": mini["loss_mask"][:, 1:].sum()}


def sft_loss(model, mb: Batch, counts: dict) -> tuple[torch.Tensor, dict]:
    """Cross-entropy summed over the target tokens of ``mb`` (``input_ids``, ``attention_mask``,
    ``position_ids``, ``loss_mask``), divided by the step's target tokens on all ranks: summed
    over micro-batches and ranks this is the token mean of the whole step. Also reports the
    step's count, ``train/num_tokens``."""
    nll = -token_logps(model, mb)
    loss = agg_loss(nll, mb["loss_mask"][:, 1:], "token-mean", global_tokens=counts["tokens"].clamp(min=1))
    return loss, {"train/loss": loss.detach(), "train/num_tokens": counts["tokens"]}
