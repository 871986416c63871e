"""The critic: a value model trained on GAE returns with a clipped value loss."""

from __future__ import annotations

import torch

from verl.algorithms import compute_value_loss
from verl.models.vision import media_of
from verl.protocol import Batch
from verl.workers.engine import TrainingEngine, agg_counts, micro_batch_groups, restore_order, token_counts

ADDITIVE_METRICS = {"critic/vf_loss"}


class Critic:
    def __init__(self, value_model, config, device, *, samples_per_mini_batch: int, ppo_epochs: int,
                 total_steps: int | None, seed: int = 0, norm_len: int | None = None,
                 micro_batch_size: int | None = None):
        """``config`` is the ``critic`` section: with ``use_dynamic_bsz`` the updates cut micro-batches
        by ``ppo_max_token_len_per_gpu`` tokens and value passes by ``forward_max_token_len_per_gpu``;
        ``model.use_remove_padding`` runs both on packed sequences (checked to be exact first)."""
        self.model = value_model  # ready: placed and sharded by whoever built it
        self.norm_len = norm_len  # seq-mean-token-sum-norm's constant length (the maximum response length)
        self.config = config
        self.device = device
        self.samples_per_mini_batch = samples_per_mini_batch
        self.micro_batch_size = micro_batch_size  # rows per forward/backward unless a call says otherwise
        self.ppo_epochs = ppo_epochs
        self.max_token_len = config.ppo_max_token_len_per_gpu if config.use_dynamic_bsz else None
        self.forward_max_token_len = ((config.forward_max_token_len_per_gpu or config.ppo_max_token_len_per_gpu)
                                      if config.use_dynamic_bsz else None)
        self.remove_padding = config.model.use_remove_padding
        if self.remove_padding:
            value_model.check_packing(device, "critic.model.use_remove_padding")
        self.engine = TrainingEngine(self.model, config.optim, config.fsdp_config, device, grad_clip=config.grad_clip,
                                     total_steps=total_steps, seed=seed, metric_prefix="critic")

    def _values(self, mb: Batch) -> torch.Tensor:
        return self.model.response_values(mb["input_ids"].to(self.device), mb["attention_mask"].to(self.device),
                                           mb["position_ids"].to(self.device), mb["responses"].shape[1],
                                           remove_padding=self.remove_padding, media=media_of(mb))

    @torch.no_grad()
    def compute_values(self, batch: Batch, *, micro_batch_size: int | None = None) -> torch.Tensor:
        """Values ``[B, T_resp]``, zero on padding; micro-batches of ``micro_batch_size`` rows, or of
        at most ``forward_max_token_len_per_gpu`` tokens with ``use_dynamic_bsz``."""
        self.model.eval()
        groups = micro_batch_groups(batch, micro_batch_size or self.micro_batch_size, self.forward_max_token_len,
                                    data_parallel=True)
        # An empty group (another rank needs more passes) still runs one, for FSDP's collectives.
        outputs = [(rows, self._values(batch.index(rows or [0]))) for rows in groups]
        values = restore_order(groups, [v for rows, v in outputs if rows])
        self.model.train()
        return values.to(batch["responses"].device) * batch["response_mask"]

    def update(self, batch: Batch, *, micro_batch_size: int | None = None, mini_batch_size: int | None = None,
               epochs: int | None = None) -> dict[str, float]:
        """Epochs of clipped value-loss regression onto ``returns``; needs ``values`` (old), ``returns``.

        ``mini_batch_size`` (samples) and ``epochs`` override the configured values for this call.
        Losses are normalised by counts over all data-parallel ranks, as in :meth:`Actor.update`.
        With ``use_dynamic_bsz`` the micro-batches are cut by tokens and ``micro_batch_size`` is ignored.
        """
        return self.engine.train_batch(
            batch, self.value_loss, counts_fn=token_counts, additive=ADDITIVE_METRICS,
            micro_batch_size=micro_batch_size or self.micro_batch_size,
            mini_batch_size=mini_batch_size or self.samples_per_mini_batch,
            epochs=epochs or self.ppo_epochs, shuffle=self.config.shuffle, max_token_len=self.max_token_len)

    def value_loss(self, model, mb: Batch, counts: dict):
        """The clipped value loss of one micro-batch (on the device), normalised by the global counts."""
        mask = mb["response_mask"]
        vpreds = model.response_values(mb["input_ids"], mb["attention_mask"], mb["position_ids"],
                                       mb["responses"].shape[1], remove_padding=self.remove_padding,
                                       media=media_of(mb))
        loss, metrics = compute_value_loss(vpreds, mb["values"], mb["returns"], mask,
                                           cliprange_value=self.config.cliprange_value,
                                           loss_agg_mode=self.config.loss_agg_mode, **agg_counts(counts, self.norm_len))
        metrics["critic/vf_loss"] = loss.detach()
        metrics["critic/vpred_mean"] = (vpreds.detach() * mask).sum() / mask.sum().clamp(min=1)
        return loss, metrics

    def state_dict(self) -> dict:
        return self.engine.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.engine.load_state_dict(state)
