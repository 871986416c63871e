"""An exactly on-policy step (one PPO epoch over one mini-batch) skips the separate old-log-prob pass:
the update takes the old log-probs from its own forward, detached. Same training as with the pass:
weights, losses and the metrics the pass used to give (entropy, KL to the reference, the engine's
log-prob gap), side by side in one test."""

import json

import pytest
import torch
from safetensors.torch import load_file

from verl.data import write_parquet
from verl.trainer.main_ppo import main
from verl.trainer.ppo.rl_trainer import RLTrainer

pytestmark = pytest.mark.slow

REWARD = ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
          "    return len(set(solution_str)) / (1 + len(solution_str))\n")


def _run(tiny_model_dir, tmp_path, name, extra=()):
    rows = [{"prompt": [{"role": "user", "content": f"say {i % 10}:"}], "data_source": "echo",
             "reward_model": {"style": "rule", "ground_truth": str(i % 10)}} for i in range(8)]
    train = write_parquet(rows, tmp_path / "train.parquet")
    (tmp_path / "reward.py").write_text(REWARD)
    out = tmp_path / name
    assert main([f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={train}",
                 f"data.val_files={train}", f"custom_reward_function.path={tmp_path / 'reward.py'}",
                 "data.train_batch_size=4", "data.max_prompt_length=16", "data.max_response_length=6",
                 "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.optim.lr=1e-2",
                 "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.rollout.calculate_log_probs=true",
                 "trainer.total_training_steps=3", "trainer.val_before_train=false", "trainer.test_freq=-1",
                 f"trainer.default_local_dir={out}", "trainer.progress_bar=false", *extra]) == 0
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [s for s in steps if "actor/pg_loss" in s], load_file(out / "huggingface" / "model.safetensors")


def test_the_on_policy_step_skips_the_pass_and_trains_the_same(tiny_model_dir, tmp_path, monkeypatch):
    # Without shared prompts the two ways run the same forward on the same rows: equal to the last bit.
    # (Shared, the pass and the update group the rows differently, so their log-probs differ by rounding,
    # which AdamW at lr 1e-2 turns into ~5e-5 on weights with near-zero gradients.)
    plain = ["actor_rollout_ref.actor.use_prefix_grouper=false"]
    skipped, weights = _run(tiny_model_dir, tmp_path, "skip", plain)
    assert all("timing_s/old_log_prob" not in s for s in skipped), "the pass is skipped"
    monkeypatch.setattr(RLTrainer, "on_policy_update", lambda self, rows: False)
    full, full_weights = _run(tiny_model_dir, tmp_path, "full", plain)
    assert all("timing_s/old_log_prob" in s for s in full)
    for a, b in zip(skipped, full):
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/ref_kl", "actor/rollout_log_prob_diff",
                    "critic/score/mean", "response_length/mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    assert skipped[0]["critic/advantages/max"] > 0  # a real learning signal
    for name in weights:
        torch.testing.assert_close(weights[name], full_weights[name], atol=1e-5, rtol=0, msg=name)


def test_two_mini_batches_or_kl_in_the_reward_keep_the_pass(tiny_model_dir, tmp_path):
    two, _ = _run(tiny_model_dir, tmp_path, "two", ["actor_rollout_ref.actor.ppo_mini_batch_size=2"])
    assert all("timing_s/old_log_prob" in s for s in two)
    kl, _ = _run(tiny_model_dir, tmp_path, "kl", ["algorithm.use_kl_in_reward=true",
                                                  "actor_rollout_ref.actor.use_kl_loss=false"])
    assert all("timing_s/old_log_prob" in s for s in kl)
