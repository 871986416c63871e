"""The embedded default (no arguments) learns: held-out reward after RL beats the reward before."""

import json

import pytest
from transformers import AutoModelForCausalLM

from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow

GREEDY = "val-core/builtin/addition/reward/mean@1"
SAMPLED = "val-aux/builtin/addition/reward/sampled_mean@1"


def test_demo_raises_held_out_reward(tmp_path, capsys):
    # The shipped demo runs 200 RL steps; 30 on a fixed seed are enough to see the rise. The warm
    # start is the shipped one, cached for the session (the docs' demo run reuses it).
    out = tmp_path / "demo"
    assert main(["trainer.total_training_steps=30", f"trainer.default_local_dir={out}", "trainer.seed=1"]) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    validations = [r for r in rows if GREEDY in r]
    before, after = validations[0], validations[-1]
    assert before["step"] == 0 and after["step"] == 30
    assert after[GREEDY] > before[GREEDY] + 0.05
    assert after[SAMPLED] > before[SAMPLED] + 0.05
    assert [r["step"] for r in rows if "critic/score/mean" in r] == list(range(1, 31))
    assert "held-out" in printed and "SFT warm start" in printed
    AutoModelForCausalLM.from_pretrained(out / "huggingface")
    config = (out / "config.yaml").read_text()
    assert "name: native" in config, "the demo generates with the fastest engine installed"
    # A run writes its report unless told not to (trainer.write_report, on by default; most tests turn it off).
    assert f"Report:         {out / 'report.html'}" in printed and (out / "report" / "reward.png").is_file()

    # The warm start is cached: a second run goes straight to RL.
    assert main(["trainer.total_training_steps=1", f"trainer.default_local_dir={tmp_path / 'again'}", "trainer.seed=1",
                 "trainer.val_before_train=false"]) == 0
    assert "(cached)" in capsys.readouterr().out
