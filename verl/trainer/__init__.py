"""Trainers: ``BaseTrainer`` (extend it), ``verl.trainer.ppo`` (PPO / GRPO) and the entry points."""

from verl.trainer.base import BaseTrainer

__all__ = ["BaseTrainer"]
