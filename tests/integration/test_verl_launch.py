"""A launch written the way verl's example scripts are (tests/unit/test_config_verl_keys.py) trains
here: the same ~60 keys, with only what a user changes for their own machine and data appended
(model, files, sizes, steps, one process)."""

import json

import pytest

from tests.unit.test_config_verl_keys import GRPO_FSDP
from verl.data import write_parquet
from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow


def _rows(n):
    return [{"prompt": [{"role": "user", "content": f"say {i % 10}:"}], "data_source": "echo",
             "reward_model": {"style": "rule", "ground_truth": str(i % 10)}, "extra_info": {"index": i}}
            for i in range(n)]


def test_a_verl_style_grpo_launch_trains(tiny_model_dir, tmp_path):
    train = write_parquet(_rows(16), tmp_path / "train.parquet")
    val = write_parquet(_rows(4), tmp_path / "val.parquet")
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(solution_str.strip().startswith(ground_truth))\n")
    mine = [f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files=[{train}]", f"data.val_files={val}",
            f"reward.custom_reward_function.path={reward}", "data.train_batch_size=4", "data.max_prompt_length=16",
            "data.max_response_length=4", "actor_rollout_ref.rollout.prompt_length=16",
            "actor_rollout_ref.rollout.response_length=4", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32", "actor_rollout_ref.rollout.name=native",
            "actor_rollout_ref.model.enable_gradient_checkpointing=False",
            "trainer.logger=['console']", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2",
            "trainer.test_freq=2", "trainer.save_freq=2", f"trainer.default_local_dir={tmp_path / 'out'}",
            "trainer.progress_bar=false"]
    assert main(GRPO_FSDP + mine) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert "actor/kl_loss" in steps[0]  # use_kl_loss=True from the launch acts
    assert any("val-core/echo/" in k for r in rows for k in r)
