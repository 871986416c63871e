"""``python -m verl.trainer.main_ppo [key=value ...] [--plan | --cfg job]``: PPO / GRPO training.

With no arguments it runs the embedded demo (see :mod:`verl.trainer.demo`). ``--plan`` prints the
memory plan (each rank's peak memory by role and part, from the config alone) and exits. ``--cfg job``
(Hydra's flag, as verl's scripts use it; also ``-c job``) prints the config the run would use, as
YAML, and exits.
"""

from __future__ import annotations

import sys

from verl.config import TrainerConfig
from verl.distributed.process_group import (barrier, ensure_process_group, is_main_process, launched_distributed,
                                           launched_world_size)
from verl.trainer.demo import demo_preset, is_demo
from verl.trainer.entry import print_config_request, run_entry


def load_config(args: list[str]) -> TrainerConfig:
    config = TrainerConfig.from_cli(args)
    preset = demo_preset(config)
    if preset is not None:
        # The preset sits under the user's own keys: anything given on the command line wins.
        config = TrainerConfig.from_cli(args, base=TrainerConfig.from_overrides(preset))
    return config


def run(config: TrainerConfig) -> dict:
    from verl.distributed.rollout_ranks import serve_rank, split_job, uses_ranks
    from verl.models.loading import resolve_device
    from verl.tracking.report import write_run_report
    from verl.tracking.summary import format_summary
    from verl.trainer.ppo.build import build_rl_trainer, check_algorithm_names, prepare_async, prepare_vision
    from verl.trainer.ppo.memory_check import check_memory_plan
    from verl.trainer.ppo.roles import policy_config, resolve_rollout_engine
    from verl.trainer.ppo.v1_modes import apply_v1_mode
    from verl.trainer.warmstart import warm_start

    apply_v1_mode(config)  # verl's trainer.v1.trainer_mode: onto async_training, said once
    if uses_ranks(config) and config.trainer.backend != "ray":  # the torchrun job's last ranks serve the rollout
        index = split_job(config)
        if index is not None:
            serve_rank(index, config.trainer.dist_timeout_s)
            return {}
    check_algorithm_names(config)  # before the warm start trains anything
    if config.async_training.enable:
        prepare_async(config)  # its refusals too
    device = resolve_device(config.trainer.device)  # trainer.device=cuda without CUDA: one line, before anything starts
    model_config = policy_config(config)  # config.json alone, read once for both
    prepare_vision(config, model_config)  # a vision-language policy: what it takes, checked now
    resolve_rollout_engine(config, model_config)  # rollout.name=auto: which engine, said now
    # The config's checks (batch sizes over the ranks, ...) before the memory plan and the warm start: a run they
    # refuse stops now, not after minutes of warm start (build_rl_trainer checks again; each warning is said once).
    config.validate(dp_size=launched_world_size() if launched_distributed() else None)
    check_memory_plan(config, device, model_config)  # prints the plan; a run that cannot fit stops here
    warm = None
    if is_demo(config) and config.sft_warmstart.enable:
        # Under torchrun rank 0 trains and caches the warm start; the other ranks then load it.
        if is_main_process():
            warm = warm_start(config, progress=config.trainer.progress_bar)
        if launched_distributed():
            ensure_process_group(timeout_s=config.trainer.dist_timeout_s)
            barrier()
        if warm is None:
            warm = warm_start(config, progress=False)
        config.actor_rollout_ref.model.path = str(warm.path)
    trainer = build_rl_trainer(config)
    try:
        result = trainer.fit()
    finally:
        trainer.close()  # under trainer.backend=ray: the actors and their resource pools
    if is_main_process():
        # a failed plot warns; it never fails the run
        report = write_run_report(trainer.out_dir) if config.trainer.write_report else None
        print(format_summary(result, warm_start=warm, out_dir=trainer.out_dir)
              + (f"\nReport:         {report}" if report else ""), flush=True)
    return result


def print_plan(config: TrainerConfig) -> None:
    from verl.trainer.ppo.memory_check import plan_ahead

    plan = plan_ahead(config)
    print(plan.table())
    if plan.available is None and plan.device.startswith("cuda"):
        print(f"  no GPU here: compare the peak with the memory of one of the {plan.ranks} GPU{'s' * (plan.ranks > 1)} "
              f"(gpu_memory_utilization's share for vLLM is planned as its KV cache and weights)")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--plan" in args:
        rest = [a for a in args if a != "--plan"]
        return run_entry(lambda: print_plan(load_config(rest)), rest, __doc__)
    rest = print_config_request(args)
    if rest is not None:
        return run_entry(lambda: print(load_config(rest).to_yaml(), end=""), rest, __doc__)
    return run_entry(lambda: run(load_config(args)), args, __doc__)


if __name__ == "__main__":
    from verl.utils.command import run_command

    run_command(main)
