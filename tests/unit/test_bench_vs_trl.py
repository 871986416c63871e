"""benchmarks/bench_vs_trl.py without running anything: its arithmetic, arguments and our command line.

TRL is not needed (the benchmark installs it into its own virtualenv when it runs).
"""

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_vs_trl")


def test_cost_split_by_hand(bench):
    # 10 steps in 20 s, 30 steps in 50 s: 20 more steps cost 30 s -> 1.5 s a step, 20 - 15 = 5 s start-up.
    per_step, startup = bench.cost_split(20.0, 50.0, 10, 30)
    assert per_step == pytest.approx(1.5)
    assert startup == pytest.approx(5.0)
    # 1 step in 4.5 s, 3 steps in 5.3 s: 0.4 s a step, 4.1 s start-up.
    per_step, startup = bench.cost_split(4.5, 5.3, 1, 3)
    assert per_step == pytest.approx(0.4)
    assert startup == pytest.approx(4.1)
    with pytest.raises(ValueError):
        bench.cost_split(1.0, 2.0, 10, 10)


def test_summary_takes_medians_and_table_gives_ratios(bench):
    times = {"ours (hf)": [(20.0, 50.0), (22.0, 48.0)],  # (1.5, 5) and (1.3, 9) -> medians 1.4, 7
             "ours (native)": [(10.0, 24.0), (12.0, 26.0), (11.0, 30.0)],  # (0.7, 3), (0.7, 5), (0.95, 1.5)
             "TRL": [(30.0, 86.0), (34.0, 90.0)]}  # (2.8, 2) and (2.8, 6) -> 2.8, 4
    summary = bench.summarise(times, 10, 30)
    assert summary["ours (hf)"]["per_step"] == pytest.approx(1.4)
    assert summary["ours (hf)"]["startup"] == pytest.approx(7.0)
    assert summary["ours (native)"]["per_step"] == pytest.approx(0.7)
    assert summary["ours (native)"]["startup"] == pytest.approx(3.0)
    assert summary["TRL"]["per_step"] == pytest.approx(2.8)
    assert summary["TRL"]["startup"] == pytest.approx(4.0)
    # Fastest runs: t(10) = 20, t(30) = 48 -> 28 / 20 = 1.4 s a step, 20 - 14 = 6 s start-up.
    assert summary["ours (hf)"]["best"]["per_step"] == pytest.approx(1.4)
    assert summary["ours (hf)"]["best"]["startup"] == pytest.approx(6.0)
    table = bench.format_table(summary, "TRL").splitlines()
    hf = next(line for line in table if line.startswith("ours (hf)")).split()
    assert hf[-2:] == ["0.50x", "1.75x"]  # 1.4 / 2.8 and 7 / 4
    native = next(line for line in table if line.startswith("ours (native)")).split()
    assert native[-2:] == ["0.25x", "0.75x"]


def test_arguments(bench):
    args = bench.parse_args([])
    assert (args.steps, args.repeats, args.threads) == (10, 2, 1)
    assert args.trl_venv == Path("/tmp/verl-bench-trl")
    assert args.ours == ["hf", "native"]
    args = bench.parse_args(["--steps", "3", "--repeats", "4", "--ours", "native", "--trl-venv", "/x/v", "--no-trl"])
    assert (args.steps, args.repeats, args.ours, args.trl_venv, args.no_trl) == (3, 4, ["native"], Path("/x/v"), True)
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "0"])


def test_our_command_runs_only_rl_steps(bench, tmp_path):
    args = bench.parse_args([])
    keys = bench.ours_command(args, tmp_path / "model", tmp_path / "out", 30, "hf")[3:]
    got = dict(k.split("=", 1) for k in keys)
    assert got["actor_rollout_ref.model.path"] == str(tmp_path / "model")  # a folder: no demo preset
    assert got["sft_warmstart.enable"] == "false"
    assert got["trainer.val_before_train"] == "false" and got["trainer.test_freq"] == "-1"
    assert got["trainer.save_freq"] == "-1" and got["trainer.resume_mode"] == "disable"
    assert got["actor_rollout_ref.actor.use_kl_loss"] == "false" and got["algorithm.use_kl_in_reward"] == "false"
    assert got["trainer.total_training_steps"] == "30"
    assert (got["data.train_batch_size"], got["actor_rollout_ref.rollout.n"], got["data.max_response_length"]) == (
        "4", "8", "32")
    assert got["actor_rollout_ref.actor.ppo_mini_batch_size"] == got["data.train_batch_size"]
