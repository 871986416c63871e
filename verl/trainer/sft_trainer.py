"""``python -m verl.trainer.sft_trainer [key=value ...]``: verl's newer SFT entry point, here the same
run as ``python -m verl.trainer.main_sft`` (see docs/offline.md for verl's SFT keys)."""

from __future__ import annotations

from verl.trainer.main_sft import main

if __name__ == "__main__":
    from verl.utils.command import run_command

    run_command(main)
