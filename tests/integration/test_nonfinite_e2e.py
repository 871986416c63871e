"""NaN/inf updates end to end through ``main_ppo`` on the tiny model: skipped updates are counted in
metrics.jsonl, the run stops with exit code 2 and one ``error:`` line after
``trainer.max_nonfinite_steps`` steps in a row, no checkpoint holds non-finite weights; a reward of 1e30
trains with finite advantages; under FSDP (2 CPU ranks) a NaN on one rank's shard is skipped on both."""

import json
import math
import textwrap

import pytest

from tests.integration.helpers import echo_launch, run_torchrun, run_torchrun_module
from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow

PARITY_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    first = solution_str[:1]
    return float(ord(first) % 2) if first else 0.0
'''
HUGE_REWARD = PARITY_REWARD.replace("float(ord(first) % 2)", "1e30 * (ord(first) % 2)")
NAN_REWARD = PARITY_REWARD.replace("float(ord(first) % 2)", "float('nan')")


def _run(tiny_model_dir, tmp_path, reward, *overrides, steps=4):
    return main([*echo_launch(tiny_model_dir, tmp_path, reward, steps=steps), "algorithm.adv_estimator=grpo",
                 *overrides])


def _rows(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_a_diverging_learning_rate_stops_the_run_after_max_nonfinite_steps(tiny_model_dir, tmp_path, capsys):
    # lr=1e30: the first applied steps blow the weights up, and from then on every loss is NaN and skipped.
    assert _run(tiny_model_dir, tmp_path, PARITY_REWARD, "actor_rollout_ref.actor.optim.lr=1e30",
                "trainer.max_nonfinite_steps=1") == 2
    (error,) = _error_lines(capsys.readouterr().err)
    rows = _rows(tmp_path)
    skipped = [r["actor/num_nonfinite_skipped"] for r in rows]
    last = rows[-1]["step"]  # the failing step is logged too
    assert [r["step"] for r in rows] == list(range(1, last + 1)) and last < 4
    assert skipped[-2] > 0 and skipped[-1] == 2 and all(n == 0 for n in skipped[:-2])
    assert rows[-1]["actor/grad_norm"] is None  # NaN, written as null
    assert error.startswith(f"error: step {last}: update_actor skipped 2 optimiser steps because the loss or gradient "
                            f"norm was NaN or inf, 2 steps in a row (steps {last - 1}-{last}; "
                            f"trainer.max_nonfinite_steps=1)")
    assert "lower the learning rate (actor_rollout_ref.actor.optim.lr" in error
    assert not (tmp_path / "out" / "huggingface").exists()


def _model_with_a_nan_weight(tiny_model_dir, target):
    """The tiny model with NaN in one embedding row: weights an update cannot repair (a skipped update
    leaves them, an applied one keeps NaN), as a diverged update would leave them. (A learning rate
    alone rarely gets there any more: the first absurd step makes every later loss NaN, and those
    updates are skipped.)"""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_model_dir, target)
    state = load_file(target / "model.safetensors")
    state["model.embed_tokens.weight"][200] = float("nan")
    save_file(state, target / "model.safetensors", metadata={"format": "pt"})
    return target


def test_non_finite_weights_are_never_saved(tiny_model_dir, tmp_path, capsys):
    model = _model_with_a_nan_weight(tiny_model_dir, tmp_path / "nan-model")
    assert _run(model, tmp_path, PARITY_REWARD, "trainer.save_freq=1") == 2
    (error,) = _error_lines(capsys.readouterr().err)
    assert error.startswith("error: refusing to save the actor weights: ")
    assert "hold NaN or inf (first: model.embed_tokens.weight): an update diverged" in error
    assert [r["step"] for r in _rows(tmp_path)] == [1]
    assert not list((tmp_path / "out").glob("global_step_*")) and not list((tmp_path / "out").glob(".tmp-*"))


def test_max_nonfinite_steps_0_stops_at_the_first_skipped_update(tiny_model_dir, tmp_path, capsys):
    assert _run(tiny_model_dir, tmp_path, PARITY_REWARD, "actor_rollout_ref.actor.optim.lr=1e30",
                "trainer.max_nonfinite_steps=0") == 2
    (error,) = _error_lines(capsys.readouterr().err)
    rows = _rows(tmp_path)
    assert [r["actor/num_nonfinite_skipped"] > 0 for r in rows] == [False] * (len(rows) - 1) + [True]
    assert error.startswith(f"error: step {rows[-1]['step']}: update_actor skipped ")
    assert "1 step in a row" in error and "trainer.max_nonfinite_steps=0" in error


def test_a_nan_reward_is_refused_at_the_reward_stage(tiny_model_dir, tmp_path, capsys):
    # It never reaches an update: the reward function's result is checked first.
    assert _run(tiny_model_dir, tmp_path, NAN_REWARD) == 2
    (error,) = _error_lines(capsys.readouterr().err)
    assert error.startswith("error: reward function compute_score returned nan (float) for sample 0")


def test_a_reward_of_1e30_trains_with_finite_advantages(tiny_model_dir, tmp_path):
    assert _run(tiny_model_dir, tmp_path, HUGE_REWARD, steps=2) == 0
    rows = [r for r in _rows(tmp_path) if "actor/num_nonfinite_skipped" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["actor/num_nonfinite_skipped"] == 0 and math.isfinite(row["actor/grad_norm"])
        # Unbiased group std: with n=3, one 1e30 among zeros gives 2/sqrt(3) = 1.1547, a lone 0 among
        # 1e30s -1.1547, and so on; never more than that, never 0 for a mixed group as float32 would.
        assert row["critic/score/max"] in (0.0, pytest.approx(1e30, rel=1e-6))
        assert abs(row["critic/advantages/max"]) <= 2 / math.sqrt(3) + 1e-4
        assert abs(row["critic/advantages/min"]) <= 2 / math.sqrt(3) + 1e-4
    # A mixed group gets advantages of about +-0.58 or +-1.15 (float32 statistics would give 0 or NaN).
    assert any(row["critic/score/max"] > 1e29 and row["critic/advantages/max"] > 0.5 for row in rows)


RANK_SCRIPT = textwrap.dedent('''
    import sys
    import torch
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from verl.distributed.process_group import ensure_process_group
    from verl.workers.optim import clip_and_step

    ensure_process_group()
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = [p.full_tensor().clone() for p in model.parameters()]
    model(torch.ones(2, 4)).sum().backward()
    if rank == 1:  # only this rank's shard of the first weight's gradient
        next(model.parameters()).grad.to_local()[0, 0] = float("nan")
    norm = clip_and_step(model, optimizer, 1.0)
    changed = any(not torch.equal(a, p.full_tensor()) for a, p in zip(before, model.parameters()))
    open(f"{sys.argv[1]}.{rank}", "w").write(f"{norm} {changed}")
''')


def test_under_fsdp_a_nan_on_one_ranks_shard_is_skipped_on_every_rank(tmp_path):
    out = tmp_path / "report"
    run_torchrun(RANK_SCRIPT, out, tmp_path=tmp_path)
    assert [(tmp_path / f"report.{rank}").read_text() for rank in (0, 1)] == ["nan False", "nan False"]


@pytest.mark.parametrize("save_freq, expected", [
    (-1, "update_actor skipped 2 optimiser steps because the loss or gradient norm was NaN or inf, 2 steps in a row"),
    (1, "refusing to save the actor weights: ")], ids=["skipped updates", "non-finite weights"])
def test_under_torchrun_every_rank_stops_alike(tiny_model_dir, tmp_path, save_freq, expected):
    model = tiny_model_dir if save_freq < 0 else _model_with_a_nan_weight(tiny_model_dir, tmp_path / "nan-model")
    lr = "1e30" if save_freq < 0 else "1e-3"
    args = [*echo_launch(model, tmp_path, PARITY_REWARD, steps=4, lr=lr), "algorithm.adv_estimator=grpo",
            "trainer.max_nonfinite_steps=1", f"trainer.save_freq={save_freq}"]
    done = run_torchrun_module("verl.trainer.main_ppo", args, timeout=300)
    errors = _error_lines(done.stderr)
    # The ranks stop on the same step with the same message (the first to exit makes torchrun stop the
    # other, which may word it as "rank 1 failed during stage ...: VerlError: <the same>"), and nothing hangs.
    assert done.returncode != 0 and errors and all(expected in e for e in errors), done.stderr[-3000:]
    assert not list((tmp_path / "out").glob("global_step_*"))
