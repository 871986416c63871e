"""``python -m verl.trainer.main_kto [key=value ...]``: Kahneman-Tversky optimisation (KTO).

Trains on unpaired (prompt, completion, label) examples against a frozen reference (a copy of
the initial policy, or ref.path). With no model and no data it trains the built-in tiny model on
the built-in addition task (the sum labelled desirable, a wrong sum undesirable).

Data-parallel on N processes (one per GPU): torchrun --nproc_per_node=N -m verl.trainer.main_kto ...
"""

from __future__ import annotations

import sys

from verl.config.offline import KTOTrainerConfig
from verl.trainer.offline.cli import offline_main

# Used only with the built-in model and task (model.path and data.train_files null).
BUILTIN_PRESET = ["optim.lr=3e-3", "optim.weight_decay=0.0", "trainer.total_training_steps=150",
                  "trainer.test_freq=50"]


def build_trainer(config: KTOTrainerConfig):
    from verl.trainer.preference import KTOTrainer

    return KTOTrainer(config)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return offline_main(KTOTrainerConfig, build_trainer, args, __doc__, BUILTIN_PRESET)


if __name__ == "__main__":
    from verl.utils.command import run_command

    run_command(main)
