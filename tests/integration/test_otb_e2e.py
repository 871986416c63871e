"""The optimal token baseline end to end through ``main_ppo`` on the tiny model, with verl's keys:
the old-log-prob pass runs (with sum_pi_squared) even on a one-epoch, one-mini-batch step, and the
policy trains."""

import json

import pytest

from tests.integration.helpers import echo_launch
from verl.config import ConfigError, TrainerConfig
from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow


def test_otb_trains_with_verls_launch_keys(tiny_model_dir, tmp_path):
    reward = ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
              "    return float(len(solution_str) % 2)\n")
    # One mini-batch, one epoch: the step would skip the old-log-prob pass for another estimator.
    args = [*echo_launch(tiny_model_dir, tmp_path, reward, n=4, mini_batch=4, response_length=6),
            "algorithm.adv_estimator=optimal_token_baseline", "actor_rollout_ref.actor.calculate_sum_pi_squared=True"]
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
