"""``KTOTrainer``: Kahneman-Tversky Optimization (Ethayarajh et al. 2024, "KTO: Model Alignment as
Prospect Theoretic Optimization") on unpaired (prompt, completion, label) examples.

Deviations from the paper and from TRL:

* The reference point z0 is estimated once per optimiser step, over the whole step batch (the
  paper and TRL estimate it per micro-batch / per device batch): every micro-batch of a step
  shares it, so gradient accumulation equals one big batch.
* Its mismatched pairs join each row's prompt with the completion of the next row in the batch
  whose prompt differs (TRL shifts by one row regardless), so that two rows of one prompt never
  pair with each other; a pair longer than data.max_length is cut (see collate_kto).
* The reference log-probs are computed in the training step, not precomputed.
"""

from __future__ import annotations

import torch

from verl.algorithms import kto_loss, kto_reference_point
from verl.config.offline import KTOTrainerConfig
from verl.data.offline import KTODataset, collate_kto
from verl.protocol import Batch
from verl.trainer.preference.common import evaluate_pairs
from verl.trainer.sft.loop import OfflineTrainer
from verl.trainer.sft.runtime import sequence_logps


class KTOTrainer(OfflineTrainer):
    """``KTOTrainer(config).fit()``; ``config`` is a :class:`KTOTrainerConfig` or its nested dict.

    ``step(batch)`` runs one optimiser step on a batch of :func:`~verl.data.offline.collate_kto`
    and returns ``train/loss``, ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``,
    ``kl`` (the reference point), ``logps/*``, ``count/*``, ``train/lr``, ``train/grad_norm``.
    """

    kind = "kto"
    label = "KTO"

    def __init__(self, config: KTOTrainerConfig | dict | None = None):
        if not isinstance(config, KTOTrainerConfig):
            config = KTOTrainerConfig.from_dict(config or {})
        super().__init__(config, with_reference=True)

    def make_dataset(self, rows, source):
        data = self.config.data
        return KTODataset(rows, self.encoder, prompt_key=data.prompt_key, completion_key=data.completion_key,
                          label_key=data.label_key, source=source)

    def collate(self, items) -> Batch:
        return collate_kto(items, self.tokenizer.pad_token_id, self.encoder)

    def _loss(self, policy_logps, ref_logps, desirable, z0, num_examples=None):
        algo = self.config.algorithm
        return kto_loss(policy_logps, ref_logps, desirable, z0, algo.beta, algo.desirable_weight,
                        algo.undesirable_weight, num_examples=num_examples)

    @torch.no_grad()
    def _reference_point(self, micro_batches: list[Batch]) -> torch.Tensor:
        policy = torch.cat([sequence_logps(self.policy.model, mb, "kl_") for mb in micro_batches])
        ref = torch.cat([sequence_logps(self.ref_model, mb, "kl_") for mb in micro_batches])
        return kto_reference_point(policy, ref)

    def update(self, batch: Batch) -> dict[str, float]:
        micro_batches = self.micro_batches(batch)
        z0 = self._reference_point(micro_batches)
        parts: list[tuple[torch.Tensor, ...]] = []
        for mb in micro_batches:
            with torch.no_grad():
                ref_logps = sequence_logps(self.ref_model, mb)
            logps = sequence_logps(self.policy.model, mb)
            loss, _ = self._loss(logps, ref_logps, mb["label"], z0, num_examples=len(batch))
            loss.backward()
            parts.append((logps.detach(), ref_logps, mb["label"]))
        loss, metrics = self._loss(*(torch.cat(c) for c in zip(*parts)), z0)
        return {"train/loss": float(loss), **{k: float(v) for k, v in metrics.items()},
                **self.policy.optimizer_step()}

    def validate(self) -> dict[str, float]:
        """``val/loss``, ``val/rewards/*`` and ``val/kl`` over the validation set (one reference point)."""
        batches = list(self.val_batches())
        z0 = self._reference_point(batches)
        parts = [(sequence_logps(self.policy.model, b), sequence_logps(self.ref_model, b), b["label"])
                 for b in batches]
        loss, metrics = self._loss(*(torch.cat(c) for c in zip(*parts)), z0)
        return {"val/loss": float(loss), **{f"val/{k}": float(v) for k, v in metrics.items()}}

    def postfix(self, metrics: dict) -> str:
        return (f"loss={metrics['train/loss']:.4f} margin={metrics['rewards/margins']:.3f} "
                f"kl={metrics['kl']:.3f}")

    def evaluate_pairs(self, rows: list[dict], **keys) -> dict[str, float]:
        """Reward statistics of preference ``rows`` (prompt, chosen, rejected) under the current policy:
        ``rewards/accuracies`` is the fraction where the implicit reward prefers the chosen response."""
        return evaluate_pairs(self, rows, **keys)
