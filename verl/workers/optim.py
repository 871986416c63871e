"""Optimiser, learning-rate schedule and the micro-batch loop shared by the actor and critic."""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from verl.distributed.fsdp import parallelize_optimizer
from verl.protocol import Batch


def build_optimizer(params, optim_cfg) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps,
                             weight_decay=optim_cfg.weight_decay)


def build_training(model, optim_cfg, fsdp_config, total_steps: int | None, seed: int):
    """What a trained role (actor or critic) steps with: optimiser (sharded like the model), LR
    schedule, and the generator that shuffles its mini-batches."""
    optimizer = parallelize_optimizer(build_optimizer(model.parameters(), optim_cfg), fsdp_config)
    return optimizer, build_lr_scheduler(optimizer, optim_cfg, total_steps), torch.Generator().manual_seed(seed)


def build_lr_scheduler(optimizer, optim_cfg, total_steps: int | None):
    """Linear warm-up, then constant or cosine decay to ``min_lr_ratio``; one step per RL step."""
    total = optim_cfg.total_training_steps or total_steps or 1
    warmup = optim_cfg.lr_warmup_steps if optim_cfg.lr_warmup_steps >= 0 else \
        int(optim_cfg.lr_warmup_steps_ratio * total)
    floor = optim_cfg.min_lr_ratio

    def factor(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if optim_cfg.warmup_style == "cosine":
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def mini_batches(batch: Batch, samples_per_mini_batch: int, *, shuffle: bool, generator: torch.Generator):
    """Split a step's samples into mini-batches (optionally after a shuffle)."""
    if shuffle:
        batch = batch.shuffle(generator)
    return batch.split(samples_per_mini_batch)


def micro_batches(batch: Batch, micro_batch_size: int | None) -> list[Batch]:
    return batch.split(micro_batch_size) if micro_batch_size else [batch]


class MetricAccumulator:
    """Collects per-micro-batch metrics and reports their means."""

    def __init__(self):
        self.values: dict[str, list[float]] = defaultdict(list)

    def add(self, metrics: dict) -> None:
        for key, value in metrics.items():
            self.values[key].append(float(value))

    def means(self) -> dict[str, float]:
        return {k: sum(v) / len(v) for k, v in self.values.items()}


def clip_and_step(model, optimizer, grad_clip: float) -> float:
    """Clip gradients, step unless the norm is not finite (then skip the update); return the norm."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    if torch.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm)


def training_state(role) -> dict:
    """Everything a trained role (actor or critic) needs to resume exactly."""
    return {"model": role.model.state_dict(), "optimizer": role.optimizer.state_dict(),
            "lr_scheduler": role.lr_scheduler.state_dict(), "generator": role.generator.get_state()}


def load_training_state(role, state: dict) -> None:
    role.model.load_state_dict(state["model"])
    role.optimizer.load_state_dict(state["optimizer"])
    role.lr_scheduler.load_state_dict(state["lr_scheduler"])
    role.generator.set_state(state["generator"])
