"""The built-in visual demo learns (issue 27): `python -m verl.trainer.main_ppo data.builtin_task=shapes` warm-
starts the built-in tiny Qwen2-VL on pictures of shapes (the colour of the largest one), then GRPO raises its
held-out accuracy. The question's text is the same for every picture: only reading the image helps."""


import pytest

from rl_compare import step_metrics
from zygote import run_module

pytestmark = pytest.mark.slow

GREEDY, SAMPLED = "val-core/builtin/shapes/reward/mean@1", "val-aux/builtin/shapes/reward/sampled_mean@1"


def test_the_shapes_demo_raises_held_out_accuracy_by_reading_the_pictures(tmp_path):
    done = run_module("verl.trainer.main_ppo", ["data.builtin_task=shapes", f"trainer.default_local_dir={tmp_path / 'shapes'}",
                                                "trainer.progress_bar=false", "trainer.write_report=false"], timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Vision-language policy (qwen2_vl)" in done.stdout
    metrics = step_metrics(tmp_path / "shapes")
    first, last = metrics[0], metrics[100]
    print(f"greedy {first[GREEDY]:.3f} -> {last[GREEDY]:.3f}, sampled {first[SAMPLED]:.3f} -> {last[SAMPLED]:.3f}")
    # Learning is the sampled accuracy's rise (+0.19 to +0.20 on seeds 1-3 here). Greedy decoding starts past
    # the warm start's jump (0.5-0.6) and moves less (+0.035, +0.13, +0.04 in 100 steps on those seeds, with a
    # spread of ~0.035 on 200 prompts): it must hold, not fall.
    assert last[SAMPLED] >= first[SAMPLED] + 0.1
    assert last[GREEDY] >= first[GREEDY] - 0.05
