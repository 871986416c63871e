"""End-to-end runs of ``python -m verl.trainer.main_ppo`` on tiny local models."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.data import write_parquet
from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow


def _rows(n, offset=0):
    # A toy task the tiny model can be scored on: echo the digit after "say".
    return [{"prompt": [{"role": "user", "content": f"say {(i + offset) % 10}:"}], "data_source": "echo",
             "reward_model": {"style": "rule", "ground_truth": str((i + offset) % 10)},
             "extra_info": {"index": i}} for i in range(n)]


REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "echo"
    hit = solution_str.strip().startswith(ground_truth)
    return {"score": 1.0 if hit else 0.0, "length": len(solution_str)}
'''


def _common(tiny_model_dir, tmp_path, steps=2):
    train = write_parquet(_rows(16), tmp_path / "train.parquet")
    val = write_parquet(_rows(6, offset=3), tmp_path / "val.parquet")
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD_FILE)
    return [f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={train}", f"data.val_files={val}",
            f"custom_reward_function.path={reward}", "custom_reward_function.name=compute_score",
            "data.train_batch_size=4", "data.max_prompt_length=16", "data.max_response_length=4",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.optim.lr=1e-3", f"trainer.total_training_steps={steps}",
            f"trainer.default_local_dir={tmp_path / 'out'}", "trainer.progress_bar=false"]


def _metrics(out_dir):
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def test_grpo_on_parquet_with_custom_reward_writes_a_loadable_policy(tiny_model_dir, tmp_path):
    assert main(_common(tiny_model_dir, tmp_path) + ["algorithm.adv_estimator=grpo",
                                                     "actor_rollout_ref.actor.use_kl_loss=true"]) == 0
    out = tmp_path / "out"
    rows = _metrics(out)
    steps = [r for r in rows if "critic/score/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "timing_s/gen", "timing_s/update_actor",
                "perf/throughput", "response_length/mean"):
        assert key in steps[0], key
    assert any("val-core/echo/reward/mean@1" in r for r in rows)
    model = AutoModelForCausalLM.from_pretrained(out / "huggingface")
    tokenizer = AutoTokenizer.from_pretrained(out / "huggingface")
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    changed = any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), original.state_dict().values()))
    assert changed, "training must change the exported weights"
    assert tokenizer("say 1:")["input_ids"] == AutoTokenizer.from_pretrained(tiny_model_dir)("say 1:")["input_ids"]


def test_ppo_with_gae_trains_a_critic(tiny_model_dir, tmp_path):
    assert main(_common(tiny_model_dir, tmp_path) + ["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1",
                                                     "critic.optim.lr=1e-3", "algorithm.use_kl_in_reward=true"]) == 0
    steps = [r for r in _metrics(tmp_path / "out") if "critic/score/mean" in r]
    for key in ("critic/vf_loss", "critic/values/mean", "timing_s/values", "timing_s/update_critic",
                "actor/reward_kl_penalty"):
        assert key in steps[-1], key


def test_resumed_run_equals_uninterrupted_run(tiny_model_dir, tmp_path):
    straight_args = _common(tiny_model_dir, tmp_path / "a", steps=4) + ["trainer.val_before_train=false"]
    assert main(straight_args) == 0
    straight = AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "out" / "huggingface").state_dict()

    # The same run stopped after step 2 (checkpoint at step 2), then started again with 4 steps.
    resumed_args = _common(tiny_model_dir, tmp_path / "b", steps=4) + ["trainer.val_before_train=false",
                                                                        "trainer.save_freq=2"]
    assert main(resumed_args + ["trainer.total_training_steps=2"]) == 0
    assert (tmp_path / "b" / "out" / "global_step_2" / "state.pt").exists()
    assert main(resumed_args) == 0
    resumed = AutoModelForCausalLM.from_pretrained(tmp_path / "b" / "out" / "huggingface").state_dict()
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=0, atol=0)
    steps = [r["step"] for r in _metrics(tmp_path / "b" / "out") if "critic/score/mean" in r]
    assert steps == [1, 2, 3, 4]


@pytest.mark.parametrize("arch", ["llama", "phi3", "opt"])
def test_other_architectures_train_unchanged(arch, tmp_path):
    from verl.models.tiny import make_tiny_model_folder

    model_dir = make_tiny_model_folder(tmp_path / f"tiny-{arch}", arch=arch, num_layers=1, hidden_size=32,
                                       intermediate_size=64)
    args = _common(model_dir, tmp_path, steps=1) + ["algorithm.adv_estimator=gae", "trainer.val_before_train=false"]
    assert main(args) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "huggingface")
    assert exported.config.model_type == arch
