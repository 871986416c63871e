"""``SFTTrainer``: supervised fine-tuning, next-token cross-entropy on the response tokens only.

The loss is the token mean over the *whole step* (every micro-batch divides its token sum by
the step's count of response tokens), so gradient accumulation over micro-batches gives the
gradient of one big batch, whatever the micro-batch size.
"""

from __future__ import annotations

from verl.algorithms import agg_loss, masked_sum
from verl.config.offline import SFTTrainerConfig
from verl.data.offline import SFTDataset, collate_sft
from verl.protocol import Batch
from verl.trainer.sft.loop import OfflineTrainer
from verl.trainer.sft.runtime import token_logps


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
        return SFTDataset(rows, self.encoder, prompt_key=data.prompt_key, response_key=data.response_key,
                          messages_key=data.messages_key, source=source)

    def collate(self, items) -> Batch:
        return collate_sft(items, self.tokenizer.pad_token_id)

    def update(self, batch: Batch) -> dict[str, float]:
        global_tokens = batch["loss_mask"][:, 1:].sum().clamp(min=1).to(self.device)
        loss_sum = 0.0
        for mb in self.micro_batches(batch):
            nll = -token_logps(self.policy.model, mb)
            loss = agg_loss(nll, mb["loss_mask"][:, 1:], "token-mean", global_tokens=global_tokens)
            loss.backward()
            loss_sum += loss.item()
        metrics = {"train/loss": loss_sum, **self.policy.optimizer_step()}
        metrics["train/num_tokens"] = int(global_tokens)
        return metrics

    def validate(self) -> dict[str, float]:
        """``val/loss``: mean cross-entropy per response token over the whole validation set."""
        nll_sum, tokens = 0.0, 0
        for batch in self.val_batches():
            mask = batch["loss_mask"][:, 1:]
            nll_sum += float(masked_sum(-token_logps(self.policy.model, batch), mask))
            tokens += int(mask.sum())
        return {"val/loss": nll_sum / max(tokens, 1)}
