"""A run whose first steps score every sample alike is told so once (verl.trainer.flat_rewards)."""

import logging

from verl.trainer.flat_rewards import FlatRewards


def _scores(low, high):
    return {"critic/score/min": low, "critic/score/max": high}


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if "every sample scored" in r.getMessage()]


def test_five_flat_steps_from_the_first_are_said_once_with_the_steps_and_the_score(caplog):
    watch = FlatRewards()
    with caplog.at_level(logging.WARNING, logger="verl.trainer.flat_rewards"):
        for step in range(1, 9):
            watch.observe(step, _scores(0.0, 0.0))
    assert len(_warnings(caplog)) == 1
    assert _warnings(caplog)[0].startswith("steps 1-5: every sample scored 0 (critic/score min = max)")


def test_a_step_that_tells_samples_apart_or_another_flat_score_ends_the_watch(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.trainer.flat_rewards"):
        for spread_at in (1, 3, 5):  # the spread step itself ends it, and no later flat run counts
            watch = FlatRewards()
            for step in range(1, 12):
                watch.observe(step, _scores(0.0, 1.0) if step == spread_at else _scores(1.0, 1.0))
        watch = FlatRewards()
        for step, score in enumerate([0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0], start=1):  # all 0, then all 1: learning
            watch.observe(step, _scores(score, score))
        watch = FlatRewards()
        for step in range(1, 9):  # no scores (distillation on the teacher's signal alone): nothing to judge
            watch.observe(step, {})
    assert _warnings(caplog) == []


def test_only_the_main_process_says_it():
    watch = FlatRewards(warn=False)
    for step in range(1, 6):
        watch.observe(step, _scores(0.5, 0.5))
    assert watch.over and watch.flat == 5
