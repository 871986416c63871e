"""PPO-family training: ``PPOTrainer`` (single updates on your batches) and ``RLTrainer`` (the full loop)."""

from verl.trainer.ppo.ppo_trainer import PPOStepConfig, PPOTrainer
from verl.trainer.ppo.rl_trainer import RLTrainer

__all__ = ["PPOStepConfig", "PPOTrainer", "RLTrainer"]
