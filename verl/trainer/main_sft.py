"""``python -m verl.trainer.main_sft [key=value ...]``: supervised fine-tuning (SFT).

Trains on prompt/response columns (data.prompt_key / data.response_key) or chat conversations
(data.messages_key), loss on the response (assistant) tokens only. With no model and no data it
fine-tunes the built-in tiny model on the built-in addition task.

Data-parallel on N processes (one per GPU): torchrun --nproc_per_node=N -m verl.trainer.main_sft ...
"""

from __future__ import annotations

import sys

from verl.config.offline import SFTTrainerConfig
from verl.trainer.offline.cli import offline_main

# Used only with the built-in model and task (model.path and data.train_files null).
BUILTIN_PRESET = ["optim.lr=1e-3", "optim.weight_decay=0.0", "data.train_batch_size=64",
                  "trainer.total_training_steps=300", "trainer.test_freq=100"]


def build_trainer(config: SFTTrainerConfig):
    from verl.trainer.sft import SFTTrainer

    return SFTTrainer(config)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return offline_main(SFTTrainerConfig, build_trainer, args, __doc__, BUILTIN_PRESET)


if __name__ == "__main__":
    from verl.utils.command import run_command

    run_command(main)
