"""What the tests of several placements share: a small RL run (graded reward, 3 steps), its
command-line keys, and the comparisons of metrics and weights between two runs."""

import json
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from zygote import run_module
from verl.data import write_parquet

REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # Graded, so that advantages are not all zero: the share of distinct characters.
    return len(set(solution_str)) / (1 + len(solution_str))
'''
# Metrics that are measurements of this run rather than results of the computation.
NOT_COMPARED = ("timing_s/", "perf/")


def prompt_rows(n):
    return [{"prompt": [{"role": "user", "content": f"say {i % 10}:"}], "data_source": "echo",
             "reward_model": {"style": "rule", "ground_truth": str(i % 10)}} for i in range(n)]


def run_args(tiny_model_dir, data_dir, out_dir, *extra):
    return [f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={data_dir / 'train.parquet'}",
            f"data.val_files={data_dir / 'val.parquet'}", f"custom_reward_function.path={data_dir / 'reward.py'}",
            "data.train_batch_size=4", "data.max_prompt_length=16", "data.max_response_length=6",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.actor.optim.lr=1e-2",
            "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.entropy_coeff=0.01",
            "trainer.total_training_steps=3", "trainer.val_sampled=true", "trainer.test_freq=3",
            "trainer.save_freq=2",  # the checkpoint the resume tests start from
            f"trainer.default_local_dir={out_dir}", "trainer.progress_bar=false", "trainer.write_report=false", *extra]


def runs_once_per_keys(launch, tiny_model_dir, data_dir, tmp_path_factory, name):
    """``run(*keys)``: ``(output folder, stderr)`` of the small RL run with ``keys``, started by
    ``launch(args)`` (which returns the finished process), once for each set of keys."""
    done = {}

    def run(*keys):
        if keys not in done:
            out = tmp_path_factory.mktemp(name)
            done[keys] = out, launch(run_args(tiny_model_dir, data_dir, out, *keys)).stderr
        return done[keys]
    return run


def make_data_dir(folder):
    write_parquet(prompt_rows(16), folder / "train.parquet")
    write_parquet(prompt_rows(6), folder / "val.parquet")
    (folder / "reward.py").write_text(REWARD_FILE)
    return folder


def run_plain(args, env=None) -> subprocess.CompletedProcess:
    done = run_module("verl.trainer.main_ppo", args, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def step_metrics(out_dir) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    by_step: dict[int, dict] = {}
    for row in rows:
        by_step.setdefault(row["step"], {}).update(row)
    return by_step


# Measurements of the run's timing and traffic, not results of the computation (a resumed run has no
# weights to send for the batches its checkpoint holds).
MEASURED = ("async/rollout_idle_frac", "async/rollout_gen_s", "async/rollout_reward_s", "async/weight_sync_s",
            "async/trainer_wait_s",
            "async/trainer_idle_frac", "async/queue_depth", "async/in_flight", "async/weight_sync_bytes")


def computed(out) -> dict[int, dict]:
    """An asynchronous run's step metrics without the measured ones (:data:`MEASURED`)."""
    return {step: {k: v for k, v in m.items() if k not in MEASURED} for step, m in step_metrics(out).items()}


def without_async(metrics: dict[int, dict]) -> dict[int, dict]:
    """Step metrics without the ``async/`` ones: an asynchronous run's, to compare with a synchronous run."""
    return {step: {k: v for k, v in m.items() if not k.startswith("async/")} for step, m in metrics.items()}


def assert_same_metrics(a: dict[int, dict], b: dict[int, dict]) -> None:
    assert sorted(a) == sorted(b)
    for step in a:
        keys = {k for k in a[step] if not k.startswith(NOT_COMPARED)}
        assert keys == {k for k in b[step] if not k.startswith(NOT_COMPARED)}, step
        for key in keys:
            if a[step][key] is None:
                assert b[step][key] is None, (step, key)
                continue
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-4, abs=1e-5), (step, key)


def assert_same_weights(dir_a, dir_b, initial_dir) -> None:
    """Equal up to float summation order: Adam turns rounding noise in near-zero gradients (a key
    bias's gradient is zero in exact arithmetic) into steps of up to ~1e-5 here, while training
    moved the weights by ~5e-2."""
    a, b = load_file(dir_a / "model.safetensors"), load_file(dir_b / "model.safetensors")
    initial = load_file(initial_dir / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=1e-4, rtol=0, msg=name)
    assert max((a[name] - initial[name]).abs().max() for name in a) > 1e-2  # the runs did train


# An asynchronous run (docs/async.md): at bound 0, one step off, and with rollout ranks of a torchrun job.
ASYNC = ("async_training.enable=true",)
LOG_PROBS = ("actor_rollout_ref.rollout.calculate_log_probs=true",)
ONE_STEP_OFF = (*ASYNC, "async_training.max_staleness=1")
RANKS = ("async_training.rollout_placement=ranks",)
GRPO, PPO = ["algorithm.adv_estimator=grpo"], ["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=1",
                                                "critic.optim.lr=1e-2"]


def assert_resumes_across(tiny_model_dir, data_dir, tmp_path, reference, pairs) -> None:
    """For each ``(saved, then, name)``: ``then`` resumes from the step-2 checkpoint of the finished
    run in folder ``saved`` (run_args save at step 2) and runs step 3; step 3's metrics and the final
    weights equal those of ``reference`` (an uninterrupted run)."""
    for saved, then, name in pairs:
        out = tmp_path / name
        assert (saved / "global_step_2" / "state.pt").exists()
        shutil.copytree(saved / "global_step_2", out / "global_step_2")  # that checkpoint alone
        done = then(run_args(tiny_model_dir, data_dir, out))
        assert done.stdout.count("Resumed from") == 1  # printed once (by rank 0 alone under torchrun)
        assert_same_metrics({3: step_metrics(reference)[3]}, {3: step_metrics(out)[3]})
        assert_same_weights(reference / "huggingface", out / "huggingface", tiny_model_dir)
