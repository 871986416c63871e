"""``SFTTrainer``: supervised fine-tuning, next-token cross-entropy on the response tokens only.

The loss is the token mean over the *whole step* (every micro-batch on every rank divides its
token sum by the step's count of response tokens), so gradient accumulation over micro-batches
and data parallel over ranks give the gradient of one big batch, whatever the micro-batch size.
"""

from __future__ import annotations

import logging

import torch

from verl.algorithms import masked_sum
from verl.config.offline import SFTTrainerConfig
from verl.data.offline import SFTDataset, collate_sft
from verl.distributed.process_group import all_reduce_sum
from verl.protocol import Batch
from verl.trainer.offline import OfflineTrainer
from verl.trainer.offline.runtime import token_logps
from verl.trainer.sft_loss import sft_counts, sft_loss

logger = logging.getLogger(__name__)
# A validation loss that moved less than this (relative) by the first evaluation after step 0 has "not moved".
STALL_TOLERANCE = 0.03


class SFTTrainer(OfflineTrainer):
    """``SFTTrainer(config).fit()``; ``config`` is an :class:`SFTTrainerConfig` or its nested dict.

    ``step(batch)`` runs one optimiser step on a batch of :func:`~verl.data.offline.collate_sft`
    (``input_ids``, ``attention_mask``, ``position_ids``, ``loss_mask``).
    """

    kind = "sft"
    label = "SFT"

    def __init__(self, config: SFTTrainerConfig | dict | None = None):
        if not isinstance(config, SFTTrainerConfig):
            config = SFTTrainerConfig.from_dict(config or {})
        super().__init__(config)

    def make_dataset(self, rows, source):
        data = self.config.data
        # verl's data.multiturn.enable names the conversation column too; data.messages_key wins
        messages_key = data.messages_key or (data.multiturn.messages_key if data.multiturn.enable else None)
        tools_key = data.multiturn.tools_key if data.multiturn.enable and not data.messages_key else data.tools_key
        return SFTDataset(rows, self.encoder, prompt_key=data.prompt_key, response_key=data.response_key,
                          messages_key=messages_key, source=source, prompt_dict_keys=data.prompt_dict_keys,
                          response_dict_keys=data.response_dict_keys, tools_key=tools_key)

    def collate(self, items) -> Batch:
        return collate_sft(items, self.tokenizer.pad_token_id)

    def update(self, batch: Batch) -> dict[str, float]:
        metrics = self.policy.train_batch(batch, sft_loss, counts_fn=sft_counts, additive={"train/loss"},
                                          micro_batch_size=self.micro_batch_size)
        metrics["train/num_tokens"] = int(metrics["train/num_tokens"])
        return metrics

    def validate(self) -> dict[str, float]:
        """``val/loss``: mean cross-entropy per response token over the whole validation set."""
        nll_sum, tokens = 0.0, 0
        for batch, rows in self.val_batches():
            mask = batch["loss_mask"][:rows, 1:]
            nll_sum += float(masked_sum(-token_logps(self.policy.model, batch)[:rows], mask))
            tokens += int(mask.sum())
        totals = all_reduce_sum(torch.tensor([nll_sum, tokens], dtype=torch.float64, device=self.device))
        return {"val/loss": float(totals[0] / totals[1].clamp(min=1))}

    def log_validation(self) -> None:
        super().log_validation()
        warning = stalled_loss_warning(self.val_history, self.config.optim.lr)
        if warning and self.is_main:
            logger.warning(warning)


def stalled_loss_warning(history: list[tuple[int, dict]], lr: float) -> str | None:
    """The warning for a run whose validation loss has not moved: the first evaluation after training
    started, against the one before it (step 0). Only once, at that evaluation."""
    if len(history) != 2 or history[0][0] != 0:
        return None
    (_, before), (step, after) = history
    start, now = before["val/loss"], after["val/loss"]
    if abs(now - start) > STALL_TOLERANCE * abs(start):
        return None
    return (f"val/loss has not moved after {step} steps ({start:.4f} -> {now:.4f}): with optim.lr={lr:g} "
            f"the model barely changes. The defaults (optim.lr=1e-5) are meant for real pretrained models; the "
            f"built-in tiny model needs about optim.lr=1e-3 (what the demo uses). Raise optim.lr, or check that "
            f"the data's responses are what the model should learn")
