"""The optimal token baseline end to end through ``main_ppo`` on the tiny model, with verl's keys:
the old-log-prob pass runs (with sum_pi_squared) even on a one-epoch, one-mini-batch step, and the
policy trains."""

import json

import pytest

from verl.config import ConfigError, TrainerConfig
from verl.data import write_parquet
from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow


def test_otb_trains_with_verls_launch_keys(tiny_model_dir, tmp_path):
    rows = [{"prompt": [{"role": "user", "content": f"say {i % 10}:"}], "data_source": "echo",
             "reward_model": {"style": "rule", "ground_truth": str(i % 10)}} for i in range(16)]
    train = write_parquet(rows, tmp_path / "train.parquet")
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(len(solution_str) % 2)\n")
    args = [f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={train}",
            f"custom_reward_function.path={reward}", "data.train_batch_size=4", "data.max_prompt_length=16",
            "data.max_response_length=6", "actor_rollout_ref.rollout.n=4",
            # One mini-batch, one epoch: the step would skip the old-log-prob pass for another estimator.
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.optim.lr=1e-3",
            "algorithm.adv_estimator=optimal_token_baseline", "actor_rollout_ref.actor.calculate_sum_pi_squared=True",
            "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path / 'out'}",
            "trainer.progress_bar=false", "trainer.val_before_train=false"]
    assert main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        assert "timing_s/old_log_prob" in row  # the pass the estimator reads ran
        assert row["actor/grad_norm"] > 0


def test_otb_switches_on_sum_pi_squared_and_refuses_bypass_mode():
    cfg = TrainerConfig.from_cli(["algorithm.adv_estimator=optimal_token_baseline", "actor_rollout_ref.rollout.n=4"])
    cfg.validate()
    assert cfg.actor_rollout_ref.actor.calculate_sum_pi_squared
    cfg = TrainerConfig.from_cli(["algorithm.adv_estimator=optimal_token_baseline", "actor_rollout_ref.rollout.n=4",
                                  "algorithm.rollout_correction.bypass_mode=true"])
    with pytest.raises(ConfigError, match="bypass_mode=true skips"):
        cfg.validate()
