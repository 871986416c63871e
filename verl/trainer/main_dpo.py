"""``python -m verl.trainer.main_dpo [key=value ...]``: direct preference optimisation.

Trains on (prompt, chosen, rejected) pairs against a frozen reference (a copy of the initial
policy, or ref.path); algorithm.loss_type = sigmoid (DPO), ipo or hinge (SLiC-HF). With no model
and no data it trains the built-in tiny model on preference pairs of the built-in addition task
(chosen = the sum, rejected = the sum with its digits reversed).

Data-parallel on N processes (one per GPU): torchrun --nproc_per_node=N -m verl.trainer.main_dpo ...
"""

from __future__ import annotations

import sys

from verl.config.offline import DPOTrainerConfig
from verl.trainer.offline.cli import offline_main

# Used only with the built-in model and task (model.path and data.train_files null).
BUILTIN_PRESET = ["optim.lr=3e-3", "optim.weight_decay=0.0", "trainer.total_training_steps=150",
                  "trainer.test_freq=50"]


def build_trainer(config: DPOTrainerConfig):
    from verl.trainer.preference import DPOTrainer

    return DPOTrainer(config)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return offline_main(DPOTrainerConfig, build_trainer, args, __doc__, BUILTIN_PRESET)


if __name__ == "__main__":
    from verl.utils.command import run_command

    run_command(main)
