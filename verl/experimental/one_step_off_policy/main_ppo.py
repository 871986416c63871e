"""``python -m verl.experimental.one_step_off_policy.main_ppo [key=value ...]``: verl's one-step-off-policy RL.

The run of ``python -m verl.trainer.main_ppo`` with the rollout in a process of its own, generating
step s + 1 while the trainer trains on step s: every sample is one policy version behind the
trainer's weights (``async_training.max_staleness=1``), and the rollout's log-probs are pi_old of
the PPO ratio (verl's ``algorithm.rollout_correction.bypass_mode``, as its one-step-off config sets).
verl's keys of this mode are taken: ``rollout.nnodes`` / ``rollout.n_gpus_per_node`` (one rollout
process here) and ``actor_rollout_ref.hybrid_engine=False``. Any key given wins over these; with no
model and no data it runs the embedded demo this way. See docs/async.md.
"""

from __future__ import annotations

import sys

# verl's one_step_off_ppo_trainer.yaml, in this project's keys.
ONE_STEP_OFF_KEYS = [
    "async_training.enable=true",
    "async_training.max_staleness=1",
    "actor_rollout_ref.rollout.calculate_log_probs=true",
    "algorithm.rollout_correction.bypass_mode=true",
]


def main(argv: list[str] | None = None) -> int:
    from verl.trainer import main_ppo

    args = sys.argv[1:] if argv is None else argv
    return main_ppo.main([*ONE_STEP_OFF_KEYS, *args])


if __name__ == "__main__":
    from verl.utils.command import run_command

    run_command(main)
