"""``KTOTrainer``: Kahneman-Tversky Optimization (Ethayarajh et al. 2024, "KTO: Model Alignment as
Prospect Theoretic Optimization") on unpaired (prompt, completion, label) examples.

Deviations from the paper and from TRL:

* The reference point z0 is estimated once per optimiser step, over the whole step batch on all
  data-parallel ranks (the paper and TRL estimate it per micro-batch / per device batch): every
  micro-batch of a step shares it, so gradient accumulation and data parallel equal one big batch.
* Its mismatched pairs join each row's prompt with the completion of the next row in the batch
  whose prompt differs (TRL shifts by one row regardless), so that two rows of one prompt never
  pair with each other; a pair longer than data.max_length is cut (see collate_kto).
* The reference log-probs are computed at the start of each training step, not once up front.
"""

from __future__ import annotations

import torch

from verl.algorithms import kto_loss, kto_reference_point
from verl.config.offline import KTOTrainerConfig
from verl.data.offline import KTODataset, collate_kto
from verl.protocol import Batch
from verl.trainer.offline import OfflineTrainer
from verl.trainer.offline.runtime import gather_examples, per_example, sequence_logps
from verl.trainer.preference.common import evaluate_pairs

# Shares of the step's value that add up over micro-batches and ranks; ``kl`` (z0) is one number.
ADDITIVE_METRICS = {"train/loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen",
                    "logps/rejected", "count/chosen", "count/rejected"}


def kto_counts(mini: Batch) -> dict:
    """Examples, desirable (``chosen``) and undesirable (``rejected``) ones, and the sum of the
    mismatched pairs' log-ratios (``kl_sum``) from which the reference point z0 is estimated."""
    desirable = mini["label"].bool()
    return {"examples": len(mini), "chosen": desirable.sum(), "rejected": (~desirable).sum(),
            "kl_sum": mini["kl_logratios"].sum()}


def step_shares(metrics: dict, counts: dict) -> dict:
    """``kto_loss``'s statistics of one micro-batch (means over its desirable or undesirable
    examples) as its share of the step's: weighted by its count of them over the step's count."""
    chosen = metrics["count/chosen"] / counts["chosen"].clamp(min=1)
    rejected = metrics["count/rejected"] / counts["rejected"].clamp(min=1)
    shares = {"rewards/chosen": metrics["rewards/chosen"] * chosen,
              "rewards/rejected": metrics["rewards/rejected"] * rejected,
              "logps/chosen": metrics["logps/chosen"] * chosen, "logps/rejected": metrics["logps/rejected"] * rejected,
              "count/chosen": metrics["count/chosen"], "count/rejected": metrics["count/rejected"],
              "kl": metrics["kl"]}
    shares["rewards/margins"] = shares["rewards/chosen"] - shares["rewards/rejected"]
    return shares


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

    def _columns(self, batch: Batch, micro_batch_size: int | None) -> list[torch.Tensor]:
        """Per example: reference log-probs, and the policy's and the reference's of the mismatched pair."""
        def columns(mb):
            return (sequence_logps(self.ref_model, mb), sequence_logps(self.policy.model, mb, "kl_"),
                    sequence_logps(self.ref_model, mb, "kl_"))

        return per_example(columns, batch, micro_batch_size, self.device)

    def update(self, batch: Batch) -> dict[str, float]:
        batch["ref_logps"], policy_kl, ref_kl = self._columns(batch, self.micro_batch_size)
        batch["kl_logratios"] = policy_kl - ref_kl
        return self.policy.train_batch(batch, self.loss, counts_fn=kto_counts, additive=ADDITIVE_METRICS,
                                       micro_batch_size=self.micro_batch_size)

    def loss(self, model, mb: Batch, counts: dict) -> tuple[torch.Tensor, dict]:
        """The KTO loss of a micro-batch's examples / the step's examples on all ranks, against the
        step's reference point (that of :func:`~verl.algorithms.kto_reference_point` over the whole step)."""
        z0 = (counts["kl_sum"] / counts["examples"]).clamp(min=0)
        loss, metrics = self._loss(sequence_logps(model, mb), mb["ref_logps"], mb["label"], z0,
                                   num_examples=counts["examples"])
        return loss, {"train/loss": loss.detach(), **step_shares(metrics, counts)}

    def validate(self) -> dict[str, float]:
        """``val/loss``, ``val/rewards/*`` and ``val/kl`` over the validation set (one reference point)."""
        parts = []
        for batch, n in self.val_batches():
            columns = [sequence_logps(self.policy.model, batch), *self._columns(batch, None), batch["label"]]
            parts.append([c[:n] for c in columns])
        policy, ref, policy_kl, ref_kl, label = gather_examples([torch.cat(c) for c in zip(*parts)])
        loss, metrics = self._loss(policy, ref, label, kto_reference_point(policy_kl, ref_kl))
        return {"val/loss": float(loss), **{f"val/{k}": float(v) for k, v in metrics.items()}}

    def postfix(self, metrics: dict) -> str:
        return (f"loss={metrics['train/loss']:.4f} margin={metrics['rewards/margins']:.3f} "
                f"kl={metrics['kl']:.3f}")

    def evaluate_pairs(self, rows: list[dict], **keys) -> dict[str, float]:
        """Reward statistics of preference ``rows`` (prompt, chosen, rejected) under the current policy:
        ``rewards/accuracies`` is the fraction where the implicit reward prefers the chosen response."""
        return evaluate_pairs(self, rows, **keys)
