"""``torchrun --nproc_per_node=2 -m verl.trainer.main_ppo`` equals plain ``python -m verl.trainer.main_ppo``.

The same seed and data give the same per-step metrics and the same final weights on 1 process and
on 2 CPU ranks (gloo), for GRPO and for PPO with a critic: samples are seeded per prompt, each
rank trains on its part of every mini-batch, and losses are normalised by counts over all ranks.
The ranks really hold different prompts (their data-flow logs say which rows), only rank 0
writes, and a checkpoint written at one world size resumes at the other.
"""

import re
import subprocess

import pytest

from helpers import run_torchrun_module
from rl_compare import (GRPO, PPO, assert_resumes_across, assert_same_metrics, assert_same_weights,
                        run_plain, runs_once_per_keys, step_metrics)

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def tiny_model_dir(rl_inputs):
    return rl_inputs[0]


@pytest.fixture(scope="module")
def data_dir(rl_inputs):
    return rl_inputs[1]


@pytest.fixture(scope="module")
def two_ranks_run(tiny_model_dir, data_dir, tmp_path_factory):
    """``two_ranks_run(*keys)``: ``(output folder, the ranks' stderr)`` of the small RL run on 2 torchrun
    ranks with ``keys``, run once for the module (the comparisons and the resume test share them)."""
    return runs_once_per_keys(lambda args: _two_ranks(args, env={"VERL_LOG_LEVEL": "INFO"}), tiny_model_dir,
                              data_dir, tmp_path_factory, "two")


def _two_ranks(args, env=None) -> subprocess.CompletedProcess:
    done = run_torchrun_module("verl.trainer.main_ppo", args, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.mark.parametrize("algorithm,two_ranks_only", [
    (GRPO, []),
    (PPO, []),
    # fsdp_size=1 on 2 ranks: each rank holds a whole replica (a 2-D replicate x shard mesh)
    (GRPO, ["actor_rollout_ref.actor.fsdp_config.fsdp_size=1", "actor_rollout_ref.ref.fsdp_config.fsdp_size=1"]),
    # micro-batches cut by tokens and packed sequences change the speed, not the result
    (PPO, ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30",
           "critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=30",
           "actor_rollout_ref.model.use_remove_padding=true", "critic.model.use_remove_padding=true"]),
    # the native engine draws the samples hf draws (same seeds), under FSDP on gathered weights
    (GRPO, ["actor_rollout_ref.rollout.name=native"]),
], ids=["grpo", "ppo_with_critic", "grpo_replicated", "ppo_dynamic_bsz_packed", "grpo_native_rollout"])
def test_two_ranks_train_exactly_like_one_process(tiny_model_dir, plain_run, two_ranks_run, algorithm, two_ranks_only):
    one, (two, log) = plain_run(*algorithm), two_ranks_run(*algorithm, *two_ranks_only)

    metrics = step_metrics(one)
    assert metrics[1]["critic/advantages/max"] > 0 and metrics[1]["actor/ppo_kl"] != 0  # a real signal to compare
    assert_same_metrics(metrics, step_metrics(two))
    assert_same_weights(one / "huggingface", two / "huggingface", tiny_model_dir)
    # Each rank generated its own half of every step's 4 prompts and trained on its half of each
    # mini-batch (2 prompts x 2 samples = 4 rows, rows 0-1 to rank 0 and 2-3 to rank 1).
    assert re.search(r"rank 0/2 rows \[0-1\] actor_rollout_ref\.generate_sequences", log)
    assert re.search(r"rank 1/2 rows \[2-3\] actor_rollout_ref\.generate_sequences", log)
    assert re.search(r"rank 1/2 rows \[2-3, 6-7\] actor_rollout_ref\.update_actor", log)
    # Rank 0 alone logs: one metrics row per step and validation, no second writer.
    assert len((two / "metrics.jsonl").read_text().splitlines()) == len((one / "metrics.jsonl").read_text().splitlines())


def test_a_checkpoint_resumes_at_another_world_size(tiny_model_dir, data_dir, tmp_path, plain_run, two_ranks_run):
    """Saved at 2 ranks after step 2, resumed at 1 (and the reverse): step 3 and the final weights
    equal those of an uninterrupted run."""
    reference = plain_run(*GRPO)
    assert_resumes_across(tiny_model_dir, data_dir, tmp_path, reference,
                          [(two_ranks_run(*GRPO)[0], run_plain, "two_then_one"), (reference, _two_ranks, "one_then_two")])
