"""The ``verl`` command: ``verl train key=value ...`` (same keys as ``python -m verl.trainer.main_ppo``)."""

from __future__ import annotations

import importlib
import sys

TRAINERS = {"train": "verl.trainer.main_ppo", "sft": "verl.trainer.main_sft", "dpo": "verl.trainer.main_dpo",
            "kto": "verl.trainer.main_kto"}

USAGE = """usage: verl <command> [key=value ...]

commands:
  train     PPO / GRPO training (python -m verl.trainer.main_ppo); no keys = the built-in demo
  sft       supervised fine-tuning (python -m verl.trainer.main_sft)
  dpo       direct preference optimisation (python -m verl.trainer.main_dpo)
  kto       Kahneman-Tversky optimisation (python -m verl.trainer.main_kto)
  report    plots and a self-contained HTML page of a run folder's metrics.jsonl (verl report RUN_DIR)
  runs      several runs side by side: one table, one overlay plot (verl runs DIR1 DIR2 ...)
  config    print the default PPO configuration as YAML, one comment per key
  doctor    check this machine: versions, GPUs, engines, disk, memory, hub, one PPO step (--json, --skip-step)
  version   print the verl version

`verl <command> --help` lists every key of that command."""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command in TRAINERS:
        return importlib.import_module(TRAINERS[command]).main(rest)
    if command in ("report", "runs"):
        from verl.tracking.report import main as report_main

        return report_main(rest, prog=f"verl {command}")
    if command == "config":
        from verl.config import render_default_yaml

        print(render_default_yaml(), end="")
        return 0
    if command == "doctor":
        from verl.doctor import main as doctor

        return doctor(rest)
    if command == "version":
        from verl import __version__

        print(__version__)
        return 0
    print(f"verl: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
