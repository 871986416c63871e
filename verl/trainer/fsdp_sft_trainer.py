"""``python -m verl.trainer.fsdp_sft_trainer [key=value ...]``: verl's SFT entry point, here the same
run as ``python -m verl.trainer.main_sft`` (with verl's SFT keys: ``model.partial_pretrain``,
``data.prompt_dict_keys``, ``data.micro_batch_size``, ``trainer.default_hdfs_dir``, ...; see
docs/offline.md). Under torchrun as verl launches it:
``torchrun --nproc_per_node=N -m verl.trainer.fsdp_sft_trainer ...``.
"""

from __future__ import annotations

from verl.trainer.main_sft import main

if __name__ == "__main__":
    from verl.utils.command import run_command

    run_command(main)
