"""Validation on the rollout (``async_training.use_trainer_do_validate=false``, verl's fully-async default): the
validation prompts go to the rollout with the trainer's weights and the trainer goes on; the figures, and the lines
of ``metrics.jsonl``, are those of the trainer validating. (Bound 0 on every placement with the rollout validating:
test_async_rl.py, test_ray_rl.py, test_vision_rl.py; the row server's rule: tests/unit/test_rollout_rows.py.)"""

import json
import shutil

import pytest

from rl_compare import (ASYNC, GRPO, LOG_PROBS, ONE_STEP_OFF, assert_same_metrics, assert_same_weights, computed,
                        make_data_dir, run_args, run_plain)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_data_dir(tmp_path_factory.mktemp("async-validation-data"))


def test_the_rollout_validates_with_the_trainers_weights_while_the_trainer_goes_on(tiny_model_dir, data_dir,
                                                                                  tmp_path):
    # Weights to the rollout every 2 steps, validation after steps 0 and 2 (answered while the trainer goes on,
    # recorded later for their own step) and 3, the last, which needs version 3: the trainer sends it with the
    # validation and waits. Validated by the trainer or by the rollout: one run, its lines in the same order.
    # (a learning rate at which 3 steps move what validation measures: at 1e-2 they do not)
    keys = (*GRPO, *ONE_STEP_OFF, "async_training.trigger_parameter_sync_step=2", "actor_rollout_ref.actor.optim.lr=0.1",
            "trainer.test_freq=2")
    runs, order, rollout_gen = {}, {}, {}
    for trainer_validates in (True, False):
        out = tmp_path / str(trainer_validates)
        run_plain(run_args(tiny_model_dir, data_dir, out, *keys,
                           f"async_training.use_trainer_do_validate={trainer_validates}"))
        runs[trainer_validates] = computed(out)
        lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        order[trainer_validates] = [(row["step"], any(k.startswith("val-") for k in row)) for row in lines]
        rollout_gen[trainer_validates] = [row.get("timing_s/validate_gen") for row in lines
                                          if any(k.startswith("val-") for k in row)]
    # the rollout's seconds generating each validation are logged with it (the trainer's own: timing_s/validate)
    assert rollout_gen[True] == [None] * 3 and len(rollout_gen[False]) == 3 and all(s > 0 for s in rollout_gen[False])
    moved = [k for k in runs[True][0] if k.startswith("val") and runs[True][3][k] != runs[True][0][k]]
    assert moved, "validation measures the 3 updates"
    assert_same_metrics(runs[True], runs[False])
    assert order[False] == order[True] == [(0, True), (1, False), (2, False), (2, True), (3, False), (3, True)]


def test_a_resume_between_two_syncs_validates_with_its_weights_and_trains_as_without_the_interruption(
        tiny_model_dir, data_dir, tmp_path):
    # Weights every 2 steps, one step off; a checkpoint after step 1, when the rollout holds version 0. Resumed with
    # val_before_train (the checkpoint holds no validation yet), the rollout validates with step 1's weights first;
    # step 3's request still waits for version 2: the same samples, metrics and weights as the uninterrupted run.
    keys = (*GRPO, *ONE_STEP_OFF, "async_training.trigger_parameter_sync_step=2", "actor_rollout_ref.actor.optim.lr=0.1",
            "async_training.use_trainer_do_validate=false", "trainer.test_freq=2", "trainer.save_freq=1")
    out, resumed = tmp_path / "uninterrupted", tmp_path / "resumed"
    run_plain(run_args(tiny_model_dir, data_dir, out, *keys, "trainer.val_before_train=false"))
    shutil.copytree(out / "global_step_1", resumed / "global_step_1")
    run_plain(run_args(tiny_model_dir, data_dir, resumed, *keys, "trainer.val_before_train=true"))
    before, after = computed(out), computed(resumed)
    assert any(k.startswith("val-") for k in after[1]) and not any(k.startswith("val-") for k in before[1])
    assert [after[step]["async/staleness_max"] for step in (2, 3)] == [1, 0]  # step 3: version 2's samples
    assert_same_metrics({step: before[step] for step in (2, 3)}, {step: after[step] for step in (2, 3)})
    assert_same_weights(out / "huggingface", resumed / "huggingface", tiny_model_dir)


def test_with_partial_rollouts_a_validation_is_drawn_by_its_steps_weights_alone(tiny_model_dir, data_dir, tmp_path):
    # Bound 0 with partial rollouts, validation after every step, answered while the trainer trains the next
    # step, whose weights would reach the rollout mid-validation: they wait until its rows are done. Validated by
    # the rollout or by the trainer: one run. (lr 0.1: each step moves what validation measures)
    keys = (*GRPO, *LOG_PROBS, *ASYNC, "async_training.partial_rollout=true", "trainer.test_freq=1",
            "actor_rollout_ref.actor.optim.lr=0.1")
    runs = {}
    for trainer_validates in (True, False):
        out = tmp_path / str(trainer_validates)
        run_plain(run_args(tiny_model_dir, data_dir, out, *keys,
                           f"async_training.use_trainer_do_validate={trainer_validates}"))
        runs[trainer_validates] = computed(out)
    assert len({tuple(sorted((k, v) for k, v in m.items() if k.startswith("val-"))) for m in runs[True].values()}) > 2
    assert_same_metrics(runs[True], runs[False])
