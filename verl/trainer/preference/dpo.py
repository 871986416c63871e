"""``DPOTrainer``: Direct Preference Optimization (Rafailov et al. 2023) and its IPO (Azar et al.
2023) and hinge (SLiC-HF, Zhao et al. 2023) variants, on (prompt, chosen, rejected) pairs.

Deviations from the papers and from TRL:

* The reference log-probs are computed in the training step, micro-batch by micro-batch (the
  papers precompute them once; the numbers are the same, the reference is frozen).
* IPO uses summed sequence log-probs, as the paper writes it; TRL averages them over the tokens.
* No label smoothing (conservative DPO) and no extra SFT term.
* A pair whose response was cut away entirely by ``data.truncation`` still counts, with a
  sequence log-prob of 0.
"""

from __future__ import annotations

import torch

from verl.algorithms import dpo_loss
from verl.config.offline import DPOTrainerConfig
from verl.data.offline import PreferenceDataset, collate_pairs
from verl.protocol import Batch
from verl.trainer.preference.common import evaluate_pairs, pair_logps, pair_statistics
from verl.trainer.sft.loop import OfflineTrainer


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
        algo = self.config.algorithm
        logps: list[tuple[torch.Tensor, ...]] = []
        for mb in self.micro_batches(batch):
            with torch.no_grad():
                ref_chosen, ref_rejected = pair_logps(self.ref_model, mb)
            chosen, rejected = pair_logps(self.policy.model, mb)
            # Divided by the step's pair count: the micro-batch losses add up to the step's loss.
            loss, _ = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, algo.beta, algo.loss_type,
                               num_pairs=len(batch))
            loss.backward()
            logps.append((chosen.detach(), rejected.detach(), ref_chosen, ref_rejected))
        loss, metrics = dpo_loss(*(torch.cat(c) for c in zip(*logps)), algo.beta, algo.loss_type)
        return {"train/loss": float(loss), **{k: float(v) for k, v in metrics.items()},
                **self.policy.optimizer_step()}

    def validate(self) -> dict[str, float]:
        """``val/loss`` (of the configured loss_type) and ``val/rewards/*`` over all validation pairs."""
        algo = self.config.algorithm
        stats = pair_statistics(self.policy.model, self.ref_model, self.val_batches(), algo.beta, algo.loss_type)
        return {f"val/{k}": v for k, v in stats.items()}

    def postfix(self, metrics: dict) -> str:
        return (f"loss={metrics['train/loss']:.4f} margin={metrics['rewards/margins']:.3f} "
                f"acc={metrics['rewards/accuracies']:.2f}")

    def evaluate_pairs(self, rows: list[dict], **keys) -> dict[str, float]:
        """Reward statistics of preference ``rows`` (prompt, chosen, rejected) under the current policy."""
        return evaluate_pairs(self, rows, **keys)
