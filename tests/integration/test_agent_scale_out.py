"""Multi-turn RL scales out like single-turn RL: on 2 torchrun ranks and on 2 Ray actors, a run with
tool calls gives the per-step metrics and final weights of one process. Each rank runs the loop
(generation, tool calls, splicing) for its own rows, seeded per sample and turn, so the
trajectories do not depend on where they were made."""

import pytest

from agent_models import TOOL_CONVERSATION, memorize, tool_task_args, write_tool_task
from helpers import run_torchrun_module
from rl_compare import assert_same_metrics, assert_same_weights, run_plain, step_metrics

pytestmark = pytest.mark.slow
# Sampled at temperature 1 the memorized model calls the tool in some trajectories and not in
# others: rewards differ within a group, and the update has something to learn.
KEYS = ["actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "trainer.total_training_steps=2"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    _, _, model_dir = memorize(tmp_path_factory, "tool-model", [TOOL_CONVERSATION])
    task = tmp_path_factory.mktemp("tool-task")
    write_tool_task(task)
    out = task / "one"
    run_plain(tool_task_args(model_dir, task, out, *KEYS))
    metrics = step_metrics(out)
    assert 0 < metrics[1]["agent/tool_calls/mean"] < 1 and metrics[1]["critic/advantages/max"] > 0
    return model_dir, task, out


def _torchrun(args):
    done = run_torchrun_module("verl.trainer.main_ppo", args)
    assert done.returncode == 0, done.stderr[-4000:]


def _ray(args):
    pytest.importorskip("ray", reason="the ray extra (bash scripts/setup.sh --test installs it)")
    from test_ray_rl import RAY2, RAY_ENV

    run_plain([*args, *RAY2], env=RAY_ENV)


@pytest.mark.parametrize("launch", [_torchrun, _ray], ids=["torchrun", "ray"])
def test_multi_turn_trains_on_two_ranks_exactly_like_one_process(one_process, tmp_path, launch):
    model_dir, task, one = one_process
    launch(tool_task_args(model_dir, task, tmp_path / "out", *KEYS))
    assert_same_metrics(step_metrics(one), step_metrics(tmp_path / "out"))
    assert_same_weights(one / "huggingface", tmp_path / "out" / "huggingface", model_dir)
