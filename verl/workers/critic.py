"""The critic: a value model trained on GAE returns with a clipped value loss."""

from __future__ import annotations

import torch

from verl.algorithms import compute_value_loss
from verl.distributed.fsdp import parallelize
from verl.protocol import Batch
from verl.workers.optim import (MetricAccumulator, build_training, check_same_schedule, clip_and_step,
                                finish_update, load_training_state, micro_batches, mini_batch_counts, mini_batches,
                                training_state)

ADDITIVE_METRICS = {"critic/vf_loss"}


class Critic:
    def __init__(self, value_model, config, device, *, samples_per_mini_batch: int, ppo_epochs: int,
                 total_steps: int | None, seed: int = 0, norm_len: int | None = None):
        self.model = parallelize(value_model, config.fsdp_config, device=device)
        self.norm_len = norm_len  # seq-mean-token-sum-norm's constant length (the maximum response length)
        self.config = config
        self.device = device
        self.samples_per_mini_batch = samples_per_mini_batch
        self.ppo_epochs = ppo_epochs
        self.optimizer, self.lr_scheduler, self.generator = build_training(
            self.model, config.optim, config.fsdp_config, total_steps, seed)

    def _values(self, mb: Batch) -> torch.Tensor:
        return self.model.response_values(mb["input_ids"].to(self.device), mb["attention_mask"].to(self.device),
                                           mb["position_ids"].to(self.device), mb["responses"].shape[1])

    @torch.no_grad()
    def compute_values(self, batch: Batch, *, micro_batch_size: int | None = None) -> torch.Tensor:
        """Values ``[B, T_resp]``, zero on padding."""
        self.model.eval()
        values = torch.cat([self._values(mb) for mb in micro_batches(batch, micro_batch_size)])
        self.model.train()
        return values.to(batch["responses"].device) * batch["response_mask"]

    def update(self, batch: Batch, *, micro_batch_size: int | None = None, mini_batch_size: int | None = None,
               epochs: int | None = None) -> dict[str, float]:
        """Epochs of clipped value-loss regression onto ``returns``; needs ``values`` (old), ``returns``.

        ``mini_batch_size`` (samples) and ``epochs`` override the configured values for this call.
        Losses are normalised by counts over all data-parallel ranks, as in :meth:`Actor.update`.
        """
        self.model.train()
        samples_per_mini_batch = mini_batch_size or self.samples_per_mini_batch
        check_same_schedule(len(batch), samples_per_mini_batch, micro_batch_size)
        acc = MetricAccumulator()
        for _ in range(epochs or self.ppo_epochs):
            for mini in mini_batches(batch, samples_per_mini_batch, shuffle=self.config.shuffle,
                                     generator=self.generator):
                counts = mini_batch_counts(mini, self.device, self.norm_len)
                vf_loss_sum = 0.0
                for mb in micro_batches(mini, micro_batch_size):
                    mask = mb["response_mask"].to(self.device)
                    vpreds = self._values(mb)
                    loss, metrics = compute_value_loss(
                        vpreds, mb["values"].to(self.device), mb["returns"].to(self.device), mask,
                        cliprange_value=self.config.cliprange_value, loss_agg_mode=self.config.loss_agg_mode,
                        **counts)
                    loss.backward()
                    vf_loss_sum += float(loss.detach())
                    metrics["critic/vpred_mean"] = (vpreds.detach() * mask).sum() / mask.sum().clamp(min=1)
                    acc.add(metrics)
                acc.add({"critic/vf_loss": vf_loss_sum,
                         "critic/grad_norm": clip_and_step(self.model, self.optimizer, self.config.grad_clip)})
        return finish_update(self, acc, "critic", ADDITIVE_METRICS)

    def state_dict(self) -> dict:
        return training_state(self)

    def load_state_dict(self, state: dict) -> None:
        load_training_state(self, state)
