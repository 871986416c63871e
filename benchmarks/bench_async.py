"""Synchronous RL against asynchronous (one step off, two steps off): the same run, side by side.

    python benchmarks/bench_async.py                          # the calculator demo, 30 steps each
    python benchmarks/bench_async.py --task addition --steps 20 --modes sync one_step_off
    python benchmarks/bench_async.py --learn                  # + the demo's held-out figures (60 steps)
    python benchmarks/bench_async.py --task spell --keys data.train_batch_size=4 \
        actor_rollout_ref.actor.ppo_mini_batch_size=4         # the long tail, generation-heavy

Each mode runs ``python -m verl.trainer.main_ppo`` on a built-in task's demo preset (the warm start is
trained once and cached), with validation off unless ``--learn``:

* ``sync``: one process, one torch thread: generation, then the update, every step;
* ``sync2``: the same with two threads (the cores the asynchronous runs use);
* ``one_step_off`` / ``two_steps_off``: ``async_training.enable=true`` with ``max_staleness`` 1 / 2:
  a rollout process and the trainer, one thread each, generating the next steps while the trainer updates;
* ``one_step_off_partial``: one step off with ``partial_rollout=true`` (weights taken mid-generation);
* ``two_steps_off_partial``: two steps off with partial rollouts: weights travel on their own, so the rows of
  the requests queued at the rollout share its decode batch (``async_training.continuous_batching``, on by
  default for the native engine); ``two_steps_off_partial_by_request``: the same, one request at a time;
* ``one_step_off_stream`` / ``two_steps_off_partial_stream``: those modes with ``stream_samples=true`` (a step
  takes the first prompts done; prompts that fall behind the bound are dropped and sent again);
* ``one_step_off_pool2``: one step off with a rollout pool of two processes (``rollout.n_gpus_per_node=2``),
  one thread each: three processes, so on two cores it measures the pool's cost more than its gain;
* ``one_step_off_trainer_reward``: one step off with the rewards scored by the trainer
  (``async_training.reward_placement=trainer``; by default the rollout scores them as it generates).
* ``one_step_off_rollout_validates``: one step off with the rollout validating while the trainer goes on
  (``async_training.use_trainer_do_validate=false``); compare it with ``one_step_off`` under ``--test-freq``.

``--reward-delay S`` makes every response's reward take S seconds more (a slow verifier), to measure
where scoring is best placed.
``--test-freq N`` validates before training and every N steps (the whole run's wall time, start-up
included, is the figure that shows where validation runs).

Printed per mode: seconds per step (median of the steps after the first), samples per second over those
steps, the trainer's and the rollout's idle fractions, the throughput against ``sync``, the staleness of
the samples' first and last tokens, the share of samples that spanned a weight swap and the prompts
dropped as too old (``stream_samples``); with
``--learn`` the held-out greedy and sampled accuracy before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MODES = {
    "sync": ([], 1),
    "sync2": ([], 2),
    "one_step_off": (["async_training.enable=true", "async_training.max_staleness=1"], 1),
    "two_steps_off": (["async_training.enable=true", "async_training.max_staleness=2"], 1),
    "one_step_off_partial": (["async_training.enable=true", "async_training.max_staleness=1",
                              "async_training.partial_rollout=true"], 1),
    "two_steps_off_partial": (["async_training.enable=true", "async_training.max_staleness=2",
                               "async_training.partial_rollout=true"], 1),
    "two_steps_off_partial_by_request": (["async_training.enable=true", "async_training.max_staleness=2",
                                          "async_training.partial_rollout=true",
                                          "async_training.continuous_batching=false"], 1),
    "one_step_off_stream": (["async_training.enable=true", "async_training.max_staleness=1",
                             "async_training.stream_samples=true"], 1),
    "two_steps_off_partial_stream": (["async_training.enable=true", "async_training.max_staleness=2",
                                      "async_training.partial_rollout=true", "async_training.stream_samples=true"], 1),
    "one_step_off_pool2": (["async_training.enable=true", "async_training.max_staleness=1",
                            "rollout.n_gpus_per_node=2"], 1),
    "one_step_off_trainer_reward": (["async_training.enable=true", "async_training.max_staleness=1",
                                     "async_training.reward_placement=trainer"], 1),
    "one_step_off_rollout_validates": (["async_training.enable=true", "async_training.max_staleness=1",
                                        "async_training.use_trainer_do_validate=false"], 1),
}
# --reward-delay: the built-in scorer, then a wait per response (a slow verifier: a sandbox, a judge).
SLOW_REWARD = """
import time

from verl.rewards import default_compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep({delay})
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
"""


def run_mode(mode: str, task: str, steps: int, learn: bool, out: Path, keys_given: list[str],
             reward_delay: float = 0.0, test_freq: int = 0) -> dict:
    keys, threads = MODES[mode]
    # The task's demo preset applies (built-in model, built-in task); these keys sit above it.
    args = [f"data.builtin_task={task}", f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={out}",
            "trainer.progress_bar=false", "trainer.write_report=false", *keys, *keys_given]
    if "async_training.enable=true" in keys:
        args.append("async_training.rollout_threads=1")
    if reward_delay:
        reward = out.parent / "slow_reward.py"
        reward.write_text(SLOW_REWARD.format(delay=reward_delay))
        args.append(f"custom_reward_function.path={reward}")
    if test_freq:
        args += [f"trainer.test_freq={test_freq}", "trainer.val_before_train=true"]
    elif not learn:
        args += ["trainer.test_freq=-1", "trainer.val_before_train=false"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=REPO, env=env,
                          capture_output=True, text=True)
    run_s = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step_rows = [r for r in rows if "timing_s/step" in r]
    later = step_rows[1:]
    import yaml

    config = yaml.safe_load((out / "config.yaml").read_text())
    samples = len(later) * config["data"]["train_batch_size"] * config["actor_rollout_ref"]["rollout"]["n"]
    seconds = sum(r["timing_s/step"] for r in later)
    result = {"mode": mode, "s_per_step": statistics.median(r["timing_s/step"] for r in later),
              "seconds": seconds, "steps": len(later),
              "trainer_idle": statistics.mean(r.get("async/trainer_idle_frac", 0.0) for r in later),
              "rollout_idle": statistics.mean(r.get("async/rollout_idle_frac", 0.0) for r in later),
              "staleness": statistics.mean(r.get("async/staleness_mean", 0.0) for r in later),
              "staleness_last": statistics.mean(r.get("async/staleness_last_mean", 0.0) for r in later),
              "partial": statistics.mean(r.get("async/partial_frac", 0.0) for r in later),
              "dropped": sum(r.get("async/dropped", 0.0) for r in later)}
    result["samples"] = samples
    result["run_s"] = round(run_s, 1)
    result["wall_s"] = round(sum(r["timing_s/step"] for r in step_rows), 2)
    if learn:
        vals = [r for r in rows if any(k.startswith("val-core/") for k in r)]
        greedy = next(k for k in vals[0] if k.startswith("val-core/"))
        sampled = next((k for k in vals[0] if "sampled_mean" in k), None)
        result["held_out"] = [(v["step"], v[greedy], v.get(sampled)) for v in vals]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="calculator", choices=["calculator", "addition", "spell"])
    parser.add_argument("--keys", nargs="*", default=[], help="more key=value settings for every mode")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--learn", action="store_true", help="validate as the demo does (60 steps unless --steps)")
    parser.add_argument("--reward-delay", type=float, default=0.0, help="seconds added to every response's reward")
    parser.add_argument("--test-freq", type=int, default=0, help="validate before training and every N steps")
    args = parser.parse_args()
    steps = 60 if args.learn and args.steps == 30 else args.steps
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            results.append(run_mode(mode, args.task, steps, args.learn, Path(tmp) / mode, args.keys,
                                    args.reward_delay, args.test_freq))
            print(json.dumps(results[-1]), flush=True)
    base = next((r for r in results if r["mode"] == "sync"), results[0])
    delay = f", reward +{args.reward_delay} s a response" if args.reward_delay else ""
    print(f"\n{args.task} {' '.join(args.keys)}{delay}, {steps} steps (figures over steps 2..{steps})")
    print(f"{'mode':<32} {'s/step':>7} {'samples/s':>10} {'vs sync':>8} {'trainer idle':>13} {'rollout idle':>13} "
          f"{'staleness':>10} {'last':>6} {'partial':>8} {'dropped':>8} {'run s':>7}")
    for r in results:
        rate, base_rate = r["samples"] / r["seconds"], base["samples"] / base["seconds"]
        print(f"{r['mode']:<32} {r['s_per_step']:>7.2f} {rate:>10.1f} {rate / base_rate:>7.2f}x "
              f"{r['trainer_idle']:>13.2f} {r['rollout_idle']:>13.2f} {r['staleness']:>10.2f} "
              f"{r['staleness_last']:>6.2f} {r['partial']:>8.2f} {r['dropped']:>8.0f} {r['run_s']:>7.1f}")
        if "held_out" in r:
            print(f"{'':<32} held-out (step, greedy, sampled): {r['held_out']}")


if __name__ == "__main__":
    main()
