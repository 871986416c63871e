"""``python -m verl.experimental.fully_async_policy.fully_async_main [key=value ...]``: verl's fully-async
mode, run by this project's asynchronous RL (docs/async.md).

verl's fully-async trainer updates on ``require_batches x ppo_mini_batch_size`` prompts at a time and
syncs the rollout's weights every ``trigger_parameter_sync_step`` updates; its rollout streams sample by
sample, at most ``(1 + staleness_threshold)`` syncs' worth ahead. Here, each said at start:

* a step is one sync's worth: ``data.train_batch_size = require_batches x ppo_mini_batch_size x
  trigger_parameter_sync_step`` prompts, trained in mini-batches of ``ppo_mini_batch_size`` (the same
  updates), the weights synced after every step; as in verl, a step takes the first prompts whose
  samples are done, whichever step's request they came with (``async_training.stream_samples``);
* the rollout runs ahead as verl's ``staleness_threshold`` says, counted in these steps: its whole part in
  whole steps, its fractional part as the first prompts of the next step (verl's 0.1: the first tenth
  of each step's prompts is generated one version early), unless ``max_staleness`` is given;
* ``rollout.total_rollout_steps`` prompts make ``trainer.total_training_steps`` (unless that is given),
  ``rollout.total_epochs`` and ``rollout.test_freq`` make ``trainer.total_epochs`` and ``trainer.test_freq``;
* verl's ``data.train_batch_size=0`` and ``data.gen_batch_size`` (its streaming sizes) are not read;
* ``async_training.partial_rollout``: verl's default (true): weights published while a step is being
  generated are taken mid-generation (:mod:`verl.rollout.partial`).
* ``async_training.use_trainer_do_validate``: verl's default (false): the rollout validates, with the
  trainer's weights; the trainer holds no engine of its own.

The defaults are those of verl's fully_async_ppo_trainer.yaml; any key given wins.
"""

from __future__ import annotations

import sys

FULLY_ASYNC_KEYS = [
    "async_training.enable=true",
    "async_training.staleness_threshold=0.1",
    "async_training.trigger_parameter_sync_step=4",
    "async_training.partial_rollout=true",
    "async_training.stream_samples=true",
    "async_training.use_trainer_do_validate=false",
    "actor_rollout_ref.rollout.calculate_log_probs=true",
]
STREAMING_SIZES = ("data.train_batch_size", "data.gen_batch_size")


def load_fully_async_config(args: list[str]):
    """The TrainerConfig of a fully-async command line, with verl's sizes made whole steps (module
    docstring), and the lines that say what was made of them."""
    from verl.trainer.main_ppo import load_config

    dropped = [a for a in args if a.lstrip("+").split("=", 1)[0] in STREAMING_SIZES]
    config = load_config([*FULLY_ASYNC_KEYS, *[a for a in args if a not in dropped]])
    a, pool, trainer = config.async_training, config.rollout, config.trainer
    mini = config.actor_rollout_ref.actor.ppo_mini_batch_size
    prompts = a.require_batches * mini * a.trigger_parameter_sync_step
    said = [f"Fully async (verl's keys): a step is one weight sync's worth, "
            f"require_batches={a.require_batches} x ppo_mini_batch_size={mini} x trigger_parameter_sync_step="
            f"{a.trigger_parameter_sync_step} = {prompts} prompts (data.train_batch_size), trained in mini-batches "
            f"of {mini}; the weights go to the rollout after every step"]
    if dropped:
        said.append(f"not read: {' '.join(dropped)} (verl's streaming sizes; the prompts here go to the rollout a "
                    f"step's worth at a time)")
    config.data.train_batch_size = prompts
    a.require_batches, a.trigger_parameter_sync_step = 1, 1
    if a.max_staleness is None:
        whole, part = a.staleness_split()
        said.append(f"async_training.staleness_threshold={a.staleness_threshold}: the rollout runs at most "
                    f"{whole} step(s) ahead" + (f" and generates the first {part:.0%} of the next step's prompts "
                                               f"one version early" if part else ""))
    if pool.total_rollout_steps is not None:
        if trainer.total_training_steps is None:
            trainer.total_training_steps = max(1, pool.total_rollout_steps // prompts)
            said.append(f"rollout.total_rollout_steps={pool.total_rollout_steps} prompts: "
                        f"trainer.total_training_steps={trainer.total_training_steps}")
        else:
            said.append(f"rollout.total_rollout_steps not read: trainer.total_training_steps="
                        f"{trainer.total_training_steps} is given")
    if pool.total_epochs is not None:
        trainer.total_epochs = pool.total_epochs
    if pool.test_freq is not None:
        trainer.test_freq = pool.test_freq
    return config, said


def main(argv: list[str] | None = None) -> int:
    from verl.distributed.process_group import is_main_process
    from verl.trainer import main_ppo
    from verl.trainer.entry import run_entry

    args = sys.argv[1:] if argv is None else argv

    def job():
        config, said = load_fully_async_config(args)
        if is_main_process():
            print("\n".join(said), flush=True)
        main_ppo.run(config)

    return run_entry(job, args, __doc__)


if __name__ == "__main__":
    from verl.utils.command import run_command

    run_command(main)
