"""Offline preference optimisation: ``DPOTrainer`` (sigmoid / ipo / hinge) and ``KTOTrainer``."""

from verl.trainer.preference.dpo import DPOTrainer
from verl.trainer.preference.kto import KTOTrainer

__all__ = ["DPOTrainer", "KTOTrainer"]
