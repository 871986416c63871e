"""Multi-turn RL scales out like single-turn RL: on 2 torchrun ranks a run with tool calls gives the
per-step metrics and final weights of one process (on 2 Ray actors: test_ray_rl.py). Each rank runs
the loop (generation, tool calls, splicing) for its own rows, seeded per sample and turn, so the
trajectories do not depend on where they were made."""

import pytest

from agent_models import SCALE_OUT_KEYS, tool_task_args
from helpers import run_torchrun_module
from rl_compare import assert_same_metrics, assert_same_weights, step_metrics

pytestmark = pytest.mark.slow


def test_the_one_process_run_calls_the_tool_in_some_trajectories(tool_run):
    metrics = step_metrics(tool_run[2])
    assert 0 < metrics[1]["agent/tool_calls/mean"] < 1 and metrics[1]["critic/advantages/max"] > 0


def test_multi_turn_trains_on_two_torchrun_ranks_exactly_like_one_process(tool_run, tmp_path):
    model_dir, task, one = tool_run
    done = run_torchrun_module("verl.trainer.main_ppo", tool_task_args(model_dir, task, tmp_path / "out",
                                                                        *SCALE_OUT_KEYS))
    assert done.returncode == 0, done.stderr[-4000:]
    assert_same_metrics(step_metrics(one), step_metrics(tmp_path / "out"))
    assert_same_weights(one / "huggingface", tmp_path / "out" / "huggingface", model_dir)
