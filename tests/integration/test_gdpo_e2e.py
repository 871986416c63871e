"""GDPO end to end through ``main_ppo`` on the tiny model: the reward function's dict components
reach the estimator and the policy trains; a component it never returns stops the first step
with a message naming the keys it does return."""

import json

import pytest

from verl.data import write_parquet
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
    rows = [{"prompt": [{"role": "user", "content": f"say {i % 10}:"}], "data_source": "echo",
             "reward_model": {"style": "rule", "ground_truth": str(i % 10)}} for i in range(16)]
    train = write_parquet(rows, tmp_path / "train.parquet")
    reward_file = tmp_path / "reward.py"
    reward_file.write_text(REWARD_FILE)
    return [f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={train}",
            f"custom_reward_function.path={reward_file}", "data.train_batch_size=4", "data.max_prompt_length=16",
            "data.max_response_length=4", "actor_rollout_ref.rollout.n=3",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.optim.lr=1e-3",
            "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path / 'out'}",
            "trainer.progress_bar=false", "trainer.val_before_train=false", "algorithm.adv_estimator=gdpo",
            *overrides]


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
