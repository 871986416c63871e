"""The agentic demo (``data.builtin_task=calculator``) learns: after the warm start on worked tool-use
conversations, multi-turn GRPO raises held-out accuracy on multiplications the model can only do
with the calculator tool."""

import json

import pytest

from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow

GREEDY = "val-core/builtin/calculator/reward/mean@1"
SAMPLED = "val-aux/builtin/calculator/reward/sampled_mean@1"


def test_calculator_demo_raises_held_out_accuracy_with_the_tool(tmp_path, capsys):
    # The shipped demo runs 60 RL steps; its first 20 are this run, on the same seed. The warm start
    # (the shipped one, cached for the session) stops at the edge of a jump in accuracy, so where it
    # stops, and how far RL then rises, depends on the machine's float arithmetic (docs/agents.md):
    # greedy 0.53 -> 0.71 and sampled 0.08 -> 0.195 on an AMD EPYC with AVX2 (this test's one thread).
    out = tmp_path / "calculator"
    assert main(["data.builtin_task=calculator", "trainer.total_training_steps=20", "trainer.test_freq=20",
                 f"trainer.default_local_dir={out}", "trainer.seed=1"]) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    validations = [r for r in rows if GREEDY in r]
    before, after = validations[0], validations[-1]
    assert before["step"] == 0 and after["step"] == 20
    # What holds on both: sampled accuracy (what GRPO trains) rises clearly, greedy does not fall.
    assert after[SAMPLED] > before[SAMPLED] + 0.08
    assert after[GREEDY] >= before[GREEDY]
    steps = [r for r in rows if "agent/num_turns/mean" in r]
    assert len(steps) == 20
    # The model calls the tool and answers after reading the result, in most trajectories (sampled at
    # temperature 1, some calls are malformed: 0.71 calls and 1.62 turns a trajectory at step 20 on the EPYC).
    assert steps[-1]["agent/tool_calls/mean"] > 0.5 and 1.4 < steps[-1]["agent/num_turns/mean"] <= 2.0
    assert "SFT warm start" in printed and "multi_turn" in (out / "config.yaml").read_text()
