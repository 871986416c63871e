"""GDPO end to end through ``main_ppo`` on the tiny model: the reward function's dict components
reach the estimator and the policy trains; a component it never returns stops the first step
with a message naming the keys it does return."""

import json

import pytest

from tests.integration.helpers import echo_launch
from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow

# Two components a random model earns unevenly: the parity of the first character, and whether it
# is a letter. "score" is their sum, which GDPO does not read.
REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    first = solution_str[:1]
    accuracy = float(ord(first) % 2) if first else 0.0
    fmt = float(first.isalpha())
    return {"score": accuracy + fmt, "accuracy_reward": accuracy, "format_reward": fmt}
'''


def _args(tiny_model_dir, tmp_path, *overrides):
    return [*echo_launch(tiny_model_dir, tmp_path, REWARD_FILE), "algorithm.adv_estimator=gdpo", *overrides]


def test_gdpo_trains_on_the_reward_functions_components(tiny_model_dir, tmp_path):
    keys = '+algorithm.gdpo_reward_keys=["accuracy_reward", "format_reward"]'  # as verl's example writes it
    assert main(_args(tiny_model_dir, tmp_path, keys, "reward_model.reward_manager=gdpo")) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "critic/score/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        assert {"gdpo/accuracy_reward/mean", "gdpo/format_reward/std"} <= set(row)
        assert row["actor/pg_loss"] == row["actor/pg_loss"] and row["actor/grad_norm"] > 0  # it trained
        assert row["critic/advantages/max"] > 0  # the components differed within groups
        # Whitened over the batch's tokens: mean 0 (unless every sample got the same advantage).
        assert abs(row["critic/advantages/mean"]) < 1e-4


def test_a_component_the_reward_function_does_not_return_stops_the_first_step(tiny_model_dir, tmp_path, capsys):
    assert main(_args(tiny_model_dir, tmp_path, "algorithm.gdpo_reward_keys=[accuracy_reward,length_reward]")) == 2
    err = capsys.readouterr().err
    assert "'length_reward', which the reward function did not return" in err
    assert "accuracy_reward, format_reward" in err
