"""``torchrun --nproc_per_node=2 -m verl.trainer.main_ppo`` equals plain ``python -m verl.trainer.main_ppo``.

The same seed and data give the same per-step metrics and the same final weights on 1 process and
on 2 CPU ranks (gloo), for GRPO and for PPO with a critic: samples are seeded per prompt, each
rank trains on its part of every mini-batch, and losses are normalised by counts over all ranks.
The ranks really hold different prompts (their data-flow logs say which rows), only rank 0
writes, and a checkpoint written at one world size resumes at the other.
"""

import json
import re
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from helpers import REPO, run_torchrun_module
from verl.data import write_parquet

pytestmark = pytest.mark.slow

REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # Graded, so that advantages are not all zero: the share of distinct characters.
    return len(set(solution_str)) / (1 + len(solution_str))
'''
# Metrics that are measurements of this run rather than results of the computation.
NOT_COMPARED = ("timing_s/", "perf/")


def _rows(n):
    return [{"prompt": [{"role": "user", "content": f"say {i % 10}:"}], "data_source": "echo",
             "reward_model": {"style": "rule", "ground_truth": str(i % 10)}} for i in range(n)]


def _args(tiny_model_dir, data_dir, out_dir, *extra):
    return [f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={data_dir / 'train.parquet'}",
            f"data.val_files={data_dir / 'val.parquet'}", f"custom_reward_function.path={data_dir / 'reward.py'}",
            "data.train_batch_size=4", "data.max_prompt_length=16", "data.max_response_length=6",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.actor.optim.lr=1e-2",
            "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.entropy_coeff=0.01",
            "trainer.total_training_steps=3", "trainer.val_sampled=true", "trainer.test_freq=3",
            f"trainer.default_local_dir={out_dir}", "trainer.progress_bar=false", *extra]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("torchrun-data")
    write_parquet(_rows(16), folder / "train.parquet")
    write_parquet(_rows(6), folder / "val.parquet")
    (folder / "reward.py").write_text(REWARD_FILE)
    return folder


def _plain(args, env=None) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**__import__("os").environ, "PYTHONPATH": str(REPO),
                                                       "OMP_NUM_THREADS": "1", **(env or {})})
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _two_ranks(args, env=None) -> subprocess.CompletedProcess:
    done = run_torchrun_module("verl.trainer.main_ppo", args, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _metrics(out_dir) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    by_step: dict[int, dict] = {}
    for row in rows:
        by_step.setdefault(row["step"], {}).update(row)
    return by_step


def _assert_same_metrics(a: dict[int, dict], b: dict[int, dict]) -> None:
    assert sorted(a) == sorted(b)
    for step in a:
        keys = {k for k in a[step] if not k.startswith(NOT_COMPARED)}
        assert keys == {k for k in b[step] if not k.startswith(NOT_COMPARED)}, step
        for key in keys:
            if a[step][key] is None:
                assert b[step][key] is None, (step, key)
                continue
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-4, abs=1e-5), (step, key)


def _assert_same_weights(dir_a, dir_b, initial_dir) -> None:
    """Equal up to float summation order: Adam turns rounding noise in near-zero gradients (a key
    bias's gradient is zero in exact arithmetic) into steps of up to ~1e-5 here, while training
    moved the weights by ~5e-2."""
    a, b = load_file(dir_a / "model.safetensors"), load_file(dir_b / "model.safetensors")
    initial = load_file(initial_dir / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=1e-4, rtol=0, msg=name)
    assert max((a[name] - initial[name]).abs().max() for name in a) > 1e-2  # the runs did train


GRPO, PPO = ["algorithm.adv_estimator=grpo"], ["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=1",
                                                "critic.optim.lr=1e-2"]


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
def test_two_ranks_train_exactly_like_one_process(tiny_model_dir, data_dir, tmp_path, algorithm, two_ranks_only):
    one, two = tmp_path / "one", tmp_path / "two"
    _plain(_args(tiny_model_dir, data_dir, one, *algorithm))
    done = _two_ranks(_args(tiny_model_dir, data_dir, two, *algorithm, *two_ranks_only),
                      env={"VERL_LOG_LEVEL": "INFO"})

    metrics = _metrics(one)
    assert metrics[1]["critic/advantages/max"] > 0 and metrics[1]["actor/ppo_kl"] != 0  # a real signal to compare
    _assert_same_metrics(metrics, _metrics(two))
    _assert_same_weights(one / "huggingface", two / "huggingface", tiny_model_dir)
    # Each rank generated its own half of every step's 4 prompts and trained on its half of each
    # mini-batch (2 prompts x 2 samples = 4 rows, rows 0-1 to rank 0 and 2-3 to rank 1).
    log = done.stderr
    assert re.search(r"rank 0/2 rows \[0-1\] actor_rollout_ref\.generate_sequences", log)
    assert re.search(r"rank 1/2 rows \[2-3\] actor_rollout_ref\.generate_sequences", log)
    assert re.search(r"rank 1/2 rows \[2-3, 6-7\] actor_rollout_ref\.update_actor", log)
    # Rank 0 alone logs: one metrics row per step and validation, no second writer.
    assert len((two / "metrics.jsonl").read_text().splitlines()) == len((one / "metrics.jsonl").read_text().splitlines())


def test_a_checkpoint_resumes_at_another_world_size(tiny_model_dir, data_dir, tmp_path):
    """Saved at 2 ranks after step 2, resumed at 1 (and the reverse): step 3 and the final weights
    equal those of an uninterrupted run."""
    reference = tmp_path / "reference"
    _plain(_args(tiny_model_dir, data_dir, reference, "trainer.save_freq=2"))
    for first, then, name in ((_two_ranks, _plain, "two_then_one"), (_plain, _two_ranks, "one_then_two")):
        out = tmp_path / name
        first(_args(tiny_model_dir, data_dir, out, "trainer.save_freq=2", "trainer.total_training_steps=2"))
        assert (out / "global_step_2" / "state.pt").exists()
        shutil.rmtree(out / "huggingface")
        done = then(_args(tiny_model_dir, data_dir, out, "trainer.save_freq=2"))
        assert "Resumed from" in done.stdout and done.stdout.count("Resumed from") == 1  # printed by rank 0 only
        _assert_same_metrics({3: _metrics(reference)[3]}, {3: _metrics(out)[3]})
        _assert_same_weights(reference / "huggingface", out / "huggingface", tiny_model_dir)
