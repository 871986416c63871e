"""verl's bypass mode end to end through ``main_ppo`` on the tiny model, with the rollout_correction keys
of verl's two bypass launches (examples/rollout_correction/run_qwen2_5_7b_fsdp.sh: REINFORCE with
batch-normalised sequence weights; run_qwen2_5_7b_fsdp_multi_rs.sh: PPO-clip with token weights and
two rejection options): each trains, logs the rollout_corr metrics, and runs no old-log-prob pass
although two mini-batches per step would need one outside bypass mode."""

import json

import pytest

from verl.data import write_parquet
from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow

# A reward a random model earns unevenly, so that groups have advantages to learn from.
REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return sum(map(ord, solution_str)) % 7 / 7
'''
REINFORCE_SEQ_IS = ["algorithm.rollout_correction.rollout_is=sequence",
                    "algorithm.rollout_correction.rollout_is_threshold=2.0",
                    "algorithm.rollout_correction.rollout_is_batch_normalize=true",
                    "algorithm.rollout_correction.rollout_rs=null",
                    "algorithm.rollout_correction.rollout_rs_threshold=null",
                    "algorithm.rollout_correction.bypass_mode=true",
                    "algorithm.rollout_correction.loss_type=reinforce"]
PPO_CLIP_MULTI_RS = ["algorithm.rollout_correction.rollout_is=token",
                     "algorithm.rollout_correction.rollout_is_threshold=2.0",
                     "algorithm.rollout_correction.rollout_is_batch_normalize=false",
                     "algorithm.rollout_correction.rollout_rs='token_k1,seq_max_k2'",
                     "algorithm.rollout_correction.rollout_rs_threshold='0.6_1.6,2.5'",
                     "algorithm.rollout_correction.bypass_mode=true",
                     "algorithm.rollout_correction.loss_type=ppo_clip"]


def _run(tiny_model_dir, tmp_path, monkeypatch, *overrides):
    """metrics.jsonl's step rows, and how many log-prob passes the actor ran."""
    from verl.workers.actor import Actor

    rows = [{"prompt": [{"role": "user", "content": f"say {i % 10}:"}], "data_source": "echo",
             "reward_model": {"style": "rule", "ground_truth": str(i % 10)}} for i in range(16)]
    train = write_parquet(rows, tmp_path / "train.parquet")
    reward_file = tmp_path / "reward.py"
    reward_file.write_text(REWARD_FILE)
    passes = []
    original = Actor.compute_log_prob
    monkeypatch.setattr(Actor, "compute_log_prob", lambda self, b, **kw: passes.append(1) or original(self, b, **kw))
    out = tmp_path / "out"
    # 4 prompts x 3 samples = 12 rows in 2 mini-batches of 6: not an on-policy step
    assert main([f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={train}",
                 f"custom_reward_function.path={reward_file}", "data.train_batch_size=4",
                 "data.max_prompt_length=16", "data.max_response_length=4",
                 "actor_rollout_ref.rollout.n=3", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                 "actor_rollout_ref.actor.ppo_epochs=1", "actor_rollout_ref.actor.optim.lr=1e-3",
                 "actor_rollout_ref.rollout.calculate_log_probs=True", "algorithm.adv_estimator=rloo",
                 "trainer.total_training_steps=2", f"trainer.default_local_dir={out}",
                 "trainer.progress_bar=false", "trainer.val_before_train=false", *overrides]) == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "critic/score/mean" in r], len(passes)


@pytest.mark.parametrize("launch, expected", [
    (REINFORCE_SEQ_IS, {"rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_batch_norm_factor"}),
    (PPO_CLIP_MULTI_RS, {"rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_token_k1_mean",
                         "rollout_corr/rollout_rs_seq_max_k2_mean", "rollout_corr/rollout_rs_masked_fraction",
                         "actor/pg_clipfrac"}),
], ids=["reinforce_seq_is", "ppo_clip_multi_rs"])
def test_verls_bypass_launches_train_without_an_old_log_prob_pass(tiny_model_dir, tmp_path, monkeypatch, launch,
                                                                 expected):
    steps, passes = _run(tiny_model_dir, tmp_path, monkeypatch, *launch)
    assert [r["step"] for r in steps] == [1, 2]
    assert passes == 0
    for row in steps:
        assert "timing_s/old_log_prob" not in row
        assert expected | {"rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/chi2_token",
                           "actor/entropy", "actor/rollout_log_prob_diff"} <= set(row), sorted(row)
        assert row["actor/pg_loss"] == row["actor/pg_loss"] and row["actor/grad_norm"] > 0  # it trained


def test_the_same_steps_outside_bypass_mode_run_the_pass(tiny_model_dir, tmp_path, monkeypatch):
    steps, passes = _run(tiny_model_dir, tmp_path, monkeypatch)
    assert passes == 2 and all("timing_s/old_log_prob" in row for row in steps)
