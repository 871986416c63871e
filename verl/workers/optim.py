"""Optimiser, learning-rate schedule and the clipped step of a trained model.

The loop that uses them, and the global loss counts that make data parallel equal one big batch,
are in :mod:`verl.workers.engine`.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from verl.distributed.fsdp import parallelize_optimizer
from verl.errors import VerlError


def build_optimizer(params, optim_cfg) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps,
                             weight_decay=optim_cfg.weight_decay)


def build_training(model, optim_cfg, fsdp_config, total_steps: int | None, seed: int):
    """What a :class:`~verl.workers.engine.TrainingEngine` steps with: optimiser (sharded like the
    model), LR schedule, and the generator that shuffles its mini-batches."""
    # Frozen weights (the base of a LoRA model) get no optimiser state.
    trainable = [p for p in model.parameters() if p.requires_grad]
    if any(p.dtype == torch.float16 for p in trainable):
        # AdamW keeps its state in the weights' dtype: in float16 the squared gradients and eps (1e-8) round to 0,
        # and the first update divides by zero (NaN weights after one step, which no later setting undoes).
        raise VerlError("the weights to train are float16 (model.dtype=fp16, or auto on a float16 checkpoint): "
                        "AdamW cannot update float16 weights (its state rounds to 0 and the first step writes NaN); "
                        "train float32 weights (model.dtype=fp32, the default) and compute in 16 bits with "
                        "fsdp_config.mixed_precision.param_dtype=fp16 (or bf16)")
    optimizer = parallelize_optimizer(build_optimizer(trainable, optim_cfg), fsdp_config)
    return optimizer, build_lr_scheduler(optimizer, optim_cfg, total_steps), torch.Generator().manual_seed(seed)


def build_lr_scheduler(optimizer, optim_cfg, total_steps: int | None) -> ScheduledLR:
    """Linear warm-up, then constant or cosine decay to ``min_lr_ratio``; one step per training step."""
    total = optim_cfg.total_training_steps or total_steps or 1
    warmup = optim_cfg.lr_warmup_steps if optim_cfg.lr_warmup_steps >= 0 else \
        int(optim_cfg.lr_warmup_steps_ratio * total)
    return ScheduledLR(optimizer, LRSchedule(optim_cfg.warmup_style, warmup, total, optim_cfg.min_lr_ratio))


@dataclasses.dataclass
class LRSchedule:
    """The factor of the base learning rate at each step: linear warm-up over ``warmup`` steps, then
    constant (``style="constant"``) or a cosine decay that reaches ``floor`` at step ``total``."""
    style: str
    warmup: int
    total: int
    floor: float

    def factor(self, step: int) -> float:
        if self.warmup > 0 and step < self.warmup:
            return (step + 1) / self.warmup
        if self.style == "cosine":
            progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
            return self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    def __str__(self) -> str:
        decay = f"cosine to {self.floor:g} x lr at step {self.total}" if self.style == "cosine" else "constant"
        return f"{self.warmup} warm-up steps, then {decay}"


class ScheduledLR(torch.optim.lr_scheduler.LambdaLR):
    """A LambdaLR of an :class:`LRSchedule`, which its state names, so that a run resumed under other schedule
    settings (``trainer.total_training_steps`` raised to train longer, another ``warmup_style``) continues
    where the checkpoint stopped: see :meth:`resume`."""

    def __init__(self, optimizer, schedule: LRSchedule):
        self.schedule = schedule
        super().__init__(optimizer, lambda step: self.schedule.factor(step))

    def state_dict(self) -> dict:
        return {**super().state_dict(), "schedule": dataclasses.asdict(self.schedule)}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        state.pop("schedule", None)
        super().load_state_dict(state)

    def resume(self, state: dict) -> str | None:
        """Load ``state`` (of :meth:`state_dict`) and continue at its step under this run's schedule. A warm-up the
        checkpoint had finished is not done again (its length is kept: a warm-up given as a ratio of a raised
        ``total_training_steps`` would otherwise start again); where the learning rate of the next step then
        differs from the checkpoint's schedule, it is set to the new one and what changed is returned (None when
        nothing did, or for a checkpoint that does not name its schedule). The base learning rate is the
        checkpoint's."""
        self.load_state_dict(state)
        if "schedule" not in state:
            return None
        saved, step = LRSchedule(**state["schedule"]), self.last_epoch
        if step >= saved.warmup:
            self.schedule = dataclasses.replace(self.schedule, warmup=saved.warmup)
        before, now = saved.factor(step), self.schedule.factor(step)
        if math.isclose(before, now, rel_tol=1e-12, abs_tol=1e-15):
            return None
        self._last_lr = [base * now for base in self.base_lrs]
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr
        return (f"the learning-rate schedule is not the checkpoint's ({saved}) but {self.schedule}: the next step, "
                f"{step + 1}, trains at lr {self._last_lr[0]:.4g} where the checkpoint's schedule gives "
                f"{self.base_lrs[0] * before:.4g}, and the schedule goes on from there; resume with the saved "
                f"settings (trainer.total_training_steps, optim.*) to keep the checkpoint's schedule")


def clip_and_step(model, optimizer, grad_clip: float) -> float:
    """Clip gradients, step unless the norm is not finite (then skip the update); return the norm.

    A NaN or inf loss makes the norm NaN or inf, so this one check covers both. Under FSDP the norm
    is reduced over all ranks' shards before it is returned, so every rank makes the same decision
    (tested with a NaN on one rank's shard alone). The caller counts the skips
    (``*/num_nonfinite_skipped``); the trainer stops after ``trainer.max_nonfinite_steps`` steps in a row.
    """
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    if torch.isfinite(grad_norm):
        try:
            optimizer.step()
        except RuntimeError as e:
            if "overflow" not in str(e):
                raise
            # AdamW multiplies in float32: a learning rate near 3.4e38 overflows before any guard sees it.
            lr = optimizer.param_groups[0]["lr"]
            raise VerlError(f"the optimiser step overflowed with learning rate {lr:g} ({e}); that is far beyond any "
                            f"usable value: set optim.lr (actor_rollout_ref.actor.optim.lr, critic.optim.lr) to "
                            f"something like 1e-6 for real models or 1e-3 for the built-in tiny one") from None
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm)
