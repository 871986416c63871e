"""Log-probs of preference pairs under the policy and the reference, and held-out pair statistics."""

from __future__ import annotations

import torch

from verl.algorithms import dpo_loss
from verl.data.offline import PreferenceDataset, collate_pairs
from verl.protocol import Batch
from verl.trainer.offline.runtime import sequence_logps

_FIELDS = ("input_ids", "attention_mask", "position_ids", "loss_mask")


def pair_logps(model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence log-probs ``([B], [B])`` of the chosen and rejected responses, in one forward pass
    over the ``[2B, T]`` stack of both halves (collate_pairs pads them to one width)."""
    both = Batch({f: torch.cat([batch[f"chosen_{f}"], batch[f"rejected_{f}"]]) for f in _FIELDS})
    logps = sequence_logps(model, both)
    return logps[:len(batch)], logps[len(batch):]


@torch.no_grad()
def pair_columns(policy_model, ref_model, batches) -> list[torch.Tensor]:
    """``[policy chosen, policy rejected, ref chosen, ref rejected]`` sequence log-probs of the pairs
    in ``batches``, each ``(batch, n)`` of which the first ``n`` pairs count."""
    parts = [[c[:n] for c in (*pair_logps(policy_model, batch), *pair_logps(ref_model, batch))]
             for batch, n in batches]
    return [torch.cat(column) for column in zip(*parts)]


def pair_statistics(columns: list[torch.Tensor], beta: float, loss_type: str = "sigmoid") -> dict[str, float]:
    """DPO's reward statistics (``rewards/accuracies``, ``rewards/margins``, ...) of the pairs of
    :func:`pair_columns`, with the implicit reward ``beta * (log pi - log pi_ref)``, and the ``loss``."""
    loss, metrics = dpo_loss(*columns, beta=beta, loss_type=loss_type)
    return {"loss": float(loss), **{k: float(v) for k, v in metrics.items()}}


def evaluate_pairs(trainer, rows: list[dict], *, prompt_key: str = "prompt", chosen_key: str = "chosen",
                   rejected_key: str = "rejected", batch_size: int = 64) -> dict[str, float]:
    """How the trainer's policy ranks preference pairs it may never have seen: rows with a prompt,
    a chosen and a rejected response, scored by the implicit reward against the trainer's reference.
    ``rewards/accuracies`` is the fraction of pairs whose chosen response gets the higher reward.
    Under torchrun every rank scores all the rows (call it on every rank)."""
    dataset = PreferenceDataset(rows, trainer.encoder, prompt_key=prompt_key, chosen_key=chosen_key,
                                rejected_key=rejected_key, source="evaluate_pairs(rows)")
    pad = trainer.tokenizer.pad_token_id
    chunks = [[dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
              for start in range(0, len(dataset), batch_size)]
    batches = ((collate_pairs(chunk, pad).to(trainer.device), len(chunk)) for chunk in chunks)
    model = trainer.policy.model
    was_training = model.training
    model.eval()
    try:
        return pair_statistics(pair_columns(model, trainer.ref_model, batches), trainer.config.algorithm.beta)
    finally:
        model.train(was_training)
