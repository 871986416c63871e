"""What ``main_sft``, ``main_dpo`` and ``main_kto`` share: help, the built-in preset, the summary.

Under torchrun every rank runs the same command; only rank 0 prints the summary.
"""

from __future__ import annotations

from collections.abc import Callable

from verl.distributed.process_group import is_main_process
from verl.trainer.entry import print_config_request, run_entry

SUMMARY_KEYS = ("val/loss", "val/rewards/accuracies", "val/rewards/margins")


def is_builtin(config) -> bool:
    """The built-in model on the built-in task: where a demo preset applies."""
    return config.model.path is None and config.data.train_files is None


def load_config(config_cls, args: list[str], preset: list[str]):
    config = config_cls.from_cli(args)
    if is_builtin(config):
        # The preset sits under the user's own keys: anything given on the command line wins.
        config = config_cls.from_cli(args, base=config_cls.from_overrides(preset))
    return config


def format_summary(label: str, result: dict) -> str:
    lines = [f"{label}: {result['steps']} steps"]
    history = result["validation"]
    if history:
        (first_step, first), (last_step, last) = history[0], history[-1]
        keys = [k for k in SUMMARY_KEYS if k in last]
        width = max(len(k) for k in keys) if keys else 8
        lines.append(f"{'held-out':<{width}}  {'step ' + str(first_step):>9}  {'step ' + str(last_step):>9}")
        lines += [f"{k:<{width}}  {first.get(k, float('nan')):>9.3f}  {last[k]:>9.3f}" for k in keys]
    lines.append(f"Trained policy: {result['out_dir']}/huggingface  (AutoModelForCausalLM.from_pretrained)")
    lines.append(f"Metrics:        {result['out_dir']}/metrics.jsonl")
    return "\n".join(lines)


def offline_main(config_cls, build_trainer: Callable, args: list[str], doc: str | None, preset: list[str]) -> int:
    """Parse ``key=value`` arguments into ``config_cls``, train, print a summary; exit code 2 with
    one message on bad input (see :func:`verl.trainer.entry.run_entry`)."""
    if any(a in ("-h", "--help") for a in args):
        print((doc or "").strip() + "\n\nKeys (key=value):\n" + config_cls.format_help())
        return 0

    rest = print_config_request(args)
    if rest is not None:  # Hydra's --cfg job: the config the run would use, as YAML; nothing trained
        return run_entry(lambda: print(load_config(config_cls, rest, preset).to_yaml(), end=""), rest, doc)

    def job() -> None:
        trainer = build_trainer(load_config(config_cls, args, preset))
        result = trainer.fit()
        if is_main_process():
            print(format_summary(trainer.label, result), flush=True)

    return run_entry(job, args, doc)
