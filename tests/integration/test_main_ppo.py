"""End-to-end runs of ``python -m verl.trainer.main_ppo`` on tiny local models."""

import json
import logging

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
                "perf/throughput", "response_length/mean", "perf/cpu_memory_used_gb"):
        assert key in steps[0], key
    assert 0.1 < steps[0]["perf/cpu_memory_used_gb"] < 64  # the process's peak RSS, in GiB
    assert "perf/max_memory_allocated_gb" not in steps[0]  # CUDA only
    assert any("val-core/echo/reward/mean@1" in r for r in rows)
    assert all(r["val-aux/echo/length/mean@1"] >= 0 for r in rows if "val-core/echo/reward/mean@1" in r)  # the dict's key
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


def test_a_grpo_checkpoint_resumed_under_gae_says_the_critic_starts_untrained(tiny_model_dir, tmp_path, caplog):
    """Before: the critic that GAE adds started from critic.model.path with no word but the changed estimator."""
    args = _common(tiny_model_dir, tmp_path, steps=2) + ["trainer.val_before_train=false", "trainer.save_freq=1"]
    assert main(args + ["trainer.total_training_steps=1"]) == 0
    with caplog.at_level(logging.WARNING, logger="verl.trainer.ppo.rl_trainer"):
        assert main(args + ["algorithm.adv_estimator=gae", "critic.optim.lr=1e-3"]) == 0
    assert ("holds no critic (its run used algorithm.adv_estimator=grpo): the critic starts untrained from "
            "critic.model.path at step 1") in caplog.text


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
def test_other_architectures_train_unchanged(arch, tmp_path, capsys):
    from verl.models.tiny import make_tiny_model_folder

    model_dir = make_tiny_model_folder(tmp_path / f"tiny-{arch}", arch=arch, num_layers=1, hidden_size=32,
                                       intermediate_size=64)
    args = _common(model_dir, tmp_path, steps=1) + ["algorithm.adv_estimator=gae", "trainer.val_before_train=false"]
    assert main(args) == 0
    # rollout.name=auto (the default) said which engine it picked for the architecture
    engine = "hf" if arch == "opt" else "native"
    assert f"Rollout engine: {engine} (actor_rollout_ref.rollout.name=auto: " in capsys.readouterr().out
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "huggingface")
    assert exported.config.model_type == arch


TWO_REWARDS = '''
import asyncio

def starts_right(data_source, solution_str, ground_truth, extra_info=None):
    if extra_info["index"] % 4 == 3:
        return None  # a broken sample: scored 0 with reward.on_error=zero
    return {"score": float(solution_str.strip().startswith(ground_truth)), "pred": solution_str.strip()[:1]}

async def brevity(prompts, completions, **kwargs):
    await asyncio.sleep(0)
    return [1.0 if len(c[0]["content"]) <= 2 else 0.0 for c in completions]
'''


def test_weighted_rewards_on_error_zero_and_validation_at_n(tiny_model_dir, tmp_path):
    reward = tmp_path / "two.py"
    reward.write_text(TWO_REWARDS)
    args = [a for a in _common(tiny_model_dir, tmp_path) if not a.startswith("custom_reward_function")]
    functions = f"[{{name: starts_right, path: {reward}}}, {{name: brevity, path: {reward}, weight: 0.5}}]"
    assert main(args + [f"reward.functions={functions}", "reward.on_error=zero",
                        "actor_rollout_ref.rollout.val_kwargs.n=3", "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0", "data.shuffle=false"]) == 0
    rows = _metrics(tmp_path / "out")
    steps = [r for r in rows if "critic/score/mean" in r]
    for r in steps:
        # unshuffled, step s trains on rows 4(s-1)..4s-1: one of them has index % 4 == 3, x 2 samples
        assert r["reward/num_errors"] == 2, r
    val = [r for r in rows if "val-core/echo/reward/mean@1" in r]
    assert val, rows
    for key in ("mean@3", "best@3", "maj@3"):
        assert f"val-core/echo/reward/{key}" in val[-1]
    last = val[-1]
    assert last["val-core/echo/reward/best@3"] >= last["val-core/echo/reward/mean@3"]
    assert "reward/starts_right/mean" in steps[0] and "reward/brevity/mean" in steps[0]
    # score = starts_right + 0.5 * brevity, per sample; so the means obey the same sum
    expected = steps[0]["reward/starts_right/mean"] + 0.5 * steps[0]["reward/brevity/mean"]
    assert steps[0]["critic/score/mean"] == pytest.approx(expected, abs=1e-6)


def test_reward_model_scores_add_to_rule_scores(tiny_model_dir, tmp_path):
    from verl.models.tiny import make_tiny_reward_model_folder

    rm_dir = make_tiny_reward_model_folder(tmp_path / "rm")
    ones = tmp_path / "ones.py"
    ones.write_text("def one(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    args = [a for a in _common(tiny_model_dir, tmp_path) if not a.startswith("custom_reward_function")]
    assert main(args + ["reward_model.enable=true", f"reward_model.model.path={rm_dir}", "reward_model.weight=0.5",
                        "reward_model.micro_batch_size_per_gpu=3", f"reward.functions=[{{name: one, path: {ones}}}]"]) == 0
    steps = [r for r in _metrics(tmp_path / "out") if "critic/score/mean" in r]
    assert len(steps) == 2
    for r in steps:
        # score = rule (always 1) + 0.5 * rm_score for every sample, hence for the means too
        assert r["critic/score/mean"] == pytest.approx(1.0 + 0.5 * r["reward_extra/rm_score/mean"], abs=1e-5)
        assert r["reward_extra/rm_score/mean"] != 0.0


def test_with_validation_off_the_validation_files_are_not_read(tiny_model_dir, tmp_path, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="verl.trainer.ppo.build"):
        assert main(_common(tiny_model_dir, tmp_path, steps=1) + ["trainer.val_before_train=false",
                                                                  "trainer.test_freq=-1"]) == 0
    assert any("validation is off" in r.getMessage() for r in caplog.records)
    assert not any(k.startswith("val-") for r in _metrics(tmp_path / "out") for k in r)


def test_zero_training_steps_validates_and_stops(tiny_model_dir, tmp_path):
    """verl's trainer.val_only, spelled as its refusal advises: total_training_steps=0 validates the
    model once and trains nothing (0 is not read as "unset")."""
    assert main(_common(tiny_model_dir, tmp_path, steps=0)) == 0
    rows = _metrics(tmp_path / "out")
    assert [r["step"] for r in rows] == [0] and "val-core/echo/reward/mean@1" in rows[0]
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "huggingface")
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert all(torch.equal(a, b) for a, b in zip(exported.state_dict().values(), original.state_dict().values()))


def test_log_val_generations_logs_the_same_prompts_with_their_responses_and_scores(tiny_model_dir, tmp_path, capsys):
    """verl's trainer.log_val_generations: N greedy validation samples at every validation."""
    import re

    args = _common(tiny_model_dir, tmp_path, steps=2) + ["trainer.log_val_generations=3", "trainer.test_freq=2",
                                                          "trainer.logger=[console]"]
    assert main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "val_generations.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 0, 0, 2, 2, 2]
    assert [r["prompt"] for r in rows[:3]] == [r["prompt"] for r in rows[3:]]  # the same prompts each time
    assert len({r["prompt"] for r in rows}) == 3
    for row in rows:  # the score is the reward function's for that response
        digit = re.search(r"say (\d):", row["prompt"]).group(1)
        assert row["score"] == (1.0 if row["response"].strip().startswith(digit) else 0.0), row
    assert capsys.readouterr().out.count("validation generations at step") == 2


def test_the_demo_with_a_batch_size_the_run_refuses_stops_before_its_warm_start_trains(tmp_path, monkeypatch, capsys):
    """Before: the demo trained its SFT warm start (~45 s on 2 cores, minutes on a laptop), then stopped on the
    batch arithmetic that the config alone decides."""
    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path / "cache"))  # nothing cached: the warm start would train
    code = main(["actor_rollout_ref.actor.ppo_mini_batch_size=3", f"trainer.default_local_dir={tmp_path / 'out'}"])
    out, err = capsys.readouterr()
    assert code != 0
    assert "data.train_batch_size=32 is not divisible by actor_rollout_ref.actor.ppo_mini_batch_size=3" in err, err
    assert "SFT warm start" not in out + err and "Memory plan" not in out
