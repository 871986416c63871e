"""Supervised fine-tuning: ``SFTTrainer`` (the loop it shares with DPO and KTO is in
:mod:`verl.trainer.offline`)."""

from verl.trainer.sft.trainer import SFTTrainer

__all__ = ["SFTTrainer"]
