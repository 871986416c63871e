"""``DPOTrainer``: Direct Preference Optimization (Rafailov et al. 2023) and its IPO (Azar et al.
2023) and hinge (SLiC-HF, Zhao et al. 2023) variants, on (prompt, chosen, rejected) pairs.

Deviations from the papers and from TRL:

* The reference log-probs are computed at the start of each training step, micro-batch by
  micro-batch (the papers precompute them once; the numbers are the same, the reference is frozen).
* IPO uses summed sequence log-probs, as the paper writes it; TRL averages them over the tokens.
* No label smoothing (conservative DPO) and no extra SFT term.
* A pair whose chosen or rejected response was cut away entirely by ``data.truncation`` is left out
  (with a warning naming it): its sequence log-prob would be 0, a comparison with nothing.
"""

from __future__ import annotations

import torch

from verl.algorithms import dpo_loss
from verl.config.offline import DPOTrainerConfig
from verl.data.offline import PreferenceDataset, collate_pairs
from verl.protocol import Batch
from verl.trainer.offline import OfflineTrainer
from verl.trainer.offline.runtime import gather_examples, per_example
from verl.trainer.preference.common import evaluate_pairs, pair_columns, pair_logps, pair_statistics

# Every metric of a step is a mean over its pairs, reported by each micro-batch as its share.
ADDITIVE_METRICS = {"train/loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                    "logps/chosen", "logps/rejected"}


def pair_counts(mini: Batch) -> dict:
    return {"pairs": len(mini)}


class DPOTrainer(OfflineTrainer):
    """``DPOTrainer(config).fit()``; ``config`` is a :class:`DPOTrainerConfig` or its nested dict.

    ``step(batch)`` runs one optimiser step on a batch of :func:`~verl.data.offline.collate_pairs`
    (``chosen_*`` and ``rejected_*`` token fields) and returns ``train/loss``, ``rewards/chosen``,
    ``rewards/rejected``, ``rewards/margins``, ``rewards/accuracies``, ``logps/*``, ``train/lr``,
    ``train/grad_norm``.
    """

    kind = "preference"
    label = "DPO"

    def __init__(self, config: DPOTrainerConfig | dict | None = None):
        if not isinstance(config, DPOTrainerConfig):
            config = DPOTrainerConfig.from_dict(config or {})
        super().__init__(config, with_reference=True)

    def make_dataset(self, rows, source):
        data = self.config.data
        return PreferenceDataset(rows, self.encoder, prompt_key=data.prompt_key, chosen_key=data.chosen_key,
                                 rejected_key=data.rejected_key, source=source)

    def collate(self, items) -> Batch:
        return collate_pairs(items, self.tokenizer.pad_token_id)

    def update(self, batch: Batch) -> dict[str, float]:
        batch["ref_chosen_logps"], batch["ref_rejected_logps"] = per_example(
            lambda mb: pair_logps(self.ref_model, mb), batch, self.micro_batch_size, self.device)
        return self.policy.train_batch(batch, self.loss, counts_fn=pair_counts, additive=ADDITIVE_METRICS,
                                       micro_batch_size=self.micro_batch_size)

    def loss(self, model, mb: Batch, counts: dict) -> tuple[torch.Tensor, dict]:
        """The DPO loss of a micro-batch's pairs / the step's pairs on all ranks, so that the losses
        add up to the step's; its statistics (means over its pairs) weighted the same way."""
        algo = self.config.algorithm
        chosen, rejected = pair_logps(model, mb)
        loss, metrics = dpo_loss(chosen, rejected, mb["ref_chosen_logps"], mb["ref_rejected_logps"], algo.beta,
                                 algo.loss_type, num_pairs=counts["pairs"])
        share = len(mb) / counts["pairs"]
        return loss, {"train/loss": loss.detach(), **{k: v * share for k, v in metrics.items()}}

    def validate(self) -> dict[str, float]:
        """``val/loss`` (of the configured loss_type) and ``val/rewards/*`` over all validation pairs."""
        algo = self.config.algorithm
        columns = gather_examples(pair_columns(self.policy.model, self.ref_model, self.val_batches()))
        return {f"val/{k}": v for k, v in pair_statistics(columns, algo.beta, algo.loss_type).items()}

    def postfix(self, metrics: dict) -> str:
        return (f"loss={metrics['train/loss']:.4f} margin={metrics['rewards/margins']:.3f} "
                f"acc={metrics['rewards/accuracies']:.2f}")

    def evaluate_pairs(self, rows: list[dict], **keys) -> dict[str, float]:
        """Reward statistics of preference ``rows`` (prompt, chosen, rejected) under the current policy."""
        return evaluate_pairs(self, rows, **keys)
