"""The ``verl`` command: ``verl train key=value ...`` (same keys as ``python -m verl.trainer.main_ppo``)."""

from __future__ import annotations

import importlib
import sys

TRAINERS = {"train": "verl.trainer.main_ppo", "sft": "verl.trainer.main_sft", "dpo": "verl.trainer.main_dpo",
            "kto": "verl.trainer.main_kto"}
# After training (docs/after_training.md): the module, and the arguments put before the user's.
AFTER = {"merge": ("verl.model_merger.__main__", ["merge"]), "generate": ("verl.trainer.main_generation", []),
         "eval": ("verl.trainer.main_eval", [])}

USAGE = """usage: verl <command> [key=value ...]

commands:
  train     PPO / GRPO training (python -m verl.trainer.main_ppo); no keys = the built-in demo
  sft       supervised fine-tuning (python -m verl.trainer.main_sft)
  dpo       direct preference optimisation (python -m verl.trainer.main_dpo)
  kto       Kahneman-Tversky optimisation (python -m verl.trainer.main_kto)
  merge     a checkpoint as a Hugging Face folder (python -m verl.model_merger merge --local_dir ... --target_dir ...)
  generate  n responses per prompt of a parquet file (python -m verl.trainer.main_generation)
  eval      pass@k and mean score per data source of generated responses (python -m verl.trainer.main_eval)
  report    plots and a self-contained HTML page of a run folder's metrics.jsonl (verl report RUN_DIR)
  runs      several runs side by side: one table, one overlay plot (verl runs DIR1 DIR2 ...)
  config    print the default PPO configuration as YAML, one comment per key
  doctor    check this machine: versions, GPUs, engines, disk, memory, hub, one PPO step (--json, --skip-step)
  version   print the verl version

`verl <command> --help` lists every key of that command."""


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the `verl` console script: a reader that stops early ends it quietly
        from verl.utils.command import quiet_broken_pipe

        return quiet_broken_pipe(lambda: _main(sys.argv[1:], console=True))
    return _main(argv, console=False)


def _main(args: list[str], *, console: bool) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    from verl.utils.command import freeze_heap_at_exit

    freeze_heap_at_exit()  # a quicker exit after the command's work (see verl.utils.command)
    if command in TRAINERS:
        module = importlib.import_module(TRAINERS[command])
        _imported(console)
        return module.main(rest)
    if command in AFTER:
        module, first = AFTER[command]
        module = importlib.import_module(module)
        _imported(console)
        return module.main([*first, *rest])
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
    if command in ("version", "--version", "-V"):
        from verl import __version__

        print(__version__)
        return 0
    print(f"verl: unknown command {command!r}{_hint(command)}\n\n{USAGE}", file=sys.stderr)
    return 2


def _imported(console: bool) -> None:
    """The command's modules are imported: in the ``verl`` console script (``main()`` reading
    ``sys.argv``), freeze them out of the garbage collector's scans (see :mod:`verl.utils.command`);
    a program that calls ``main([...])`` and goes on is left as it is."""
    if console:
        import gc

        gc.freeze()


# Names people reach for that are one of the commands under another name.
_MEANT = {"ppo": "train", "grpo": "train", "rl": "train", "rlhf": "train", "dapo": "train", "main_ppo": "train",
          "main_sft": "sft", "main_dpo": "dpo", "main_kto": "kto", "check": "doctor", "env": "doctor",
          "model_merger": "merge", "merger": "merge", "main_generation": "generate", "generation": "generate",
          "main_eval": "eval", "evaluate": "eval", "evaluation": "eval"}


def _hint(command: str) -> str:
    """``; did you mean ...?`` for a typo or another name of a command ('' when nothing is close)."""
    from verl.errors import closest_name

    name = command.lower().lstrip("-")
    commands = [*TRAINERS, *AFTER, "report", "runs", "config", "doctor", "version"]
    meant = _MEANT.get(name) or closest_name(name, commands)
    if meant is None:
        return ""
    why = f" ({command} runs as verl train with its algorithm keys, e.g. algorithm.adv_estimator=grpo)" \
        if meant == "train" and name in ("grpo", "dapo") else ""
    return f"; did you mean verl {meant}?{why}"


if __name__ == "__main__":
    from verl.utils.command import run_command

    run_command(main)
