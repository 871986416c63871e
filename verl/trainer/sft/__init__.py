"""Supervised fine-tuning (``SFTTrainer``) and the loop every offline trainer shares (``OfflineTrainer``)."""

from verl.trainer.sft.loop import OfflineTrainer
from verl.trainer.sft.trainer import SFTTrainer

__all__ = ["OfflineTrainer", "SFTTrainer"]
