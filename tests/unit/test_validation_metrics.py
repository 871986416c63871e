"""mean@N, best@N and maj@N of validation, against numbers worked out by hand."""

import pytest

from verl.trainer.ppo.validation import at_n_metrics


def test_mean_best_and_majority_by_hand():
    # prompt A: answers 5, 5, 7 scored 1, 1, 0 -> best 1, majority "5" scores 1
    # prompt B: answers 3, 4, 4 scored 1, 0, 0 -> best 1, majority "4" scores 0
    # prompt C: answers 9, 8, 9 scored 0, 0, 0 -> best 0, majority "9" scores 0
    scores = [1, 1, 0, 1, 0, 0, 0, 0, 0]
    answers = ["5", "5", "7", "3", "4", "4", "9", "8", "9"]
    groups = ["A"] * 3 + ["B"] * 3 + ["C"] * 3
    got = at_n_metrics(scores, answers, groups)
    assert got["mean"] == pytest.approx(3 / 9)
    assert got["best"] == pytest.approx(2 / 3)
    assert got["maj"] == pytest.approx(1 / 3)


def test_majority_ties_go_to_the_first_answer_and_equal_answers_average_their_scores():
    # one prompt, answers x y x y: tie 2-2 -> "x" (seen first); x scored 1 and 0.5 -> 0.75
    got = at_n_metrics([1.0, 0.0, 0.5, 0.0], [" x", "y", "x\n", "y"], [0, 0, 0, 0])
    assert got == {"mean": pytest.approx(1.5 / 4), "best": 1.0, "maj": pytest.approx(0.75)}


def test_groups_need_not_be_adjacent_and_unhashable_answers_are_compared_by_value():
    got = at_n_metrics([1.0, 0.0, 0.0, 0.0], [[1, 2], "a", [1, 2], "b"], ["p", "q", "p", "q"])
    assert got["best"] == pytest.approx(0.5)  # p: 1, q: 0
    assert got["maj"] == pytest.approx(0.25)  # p: [1,2] twice, scores 1 and 0 -> 0.5; q: tie -> "a" -> 0


def test_answers_come_from_pred_of_any_function_else_none():
    from verl.protocol import Batch
    from verl.trainer.ppo.validation import _answers

    scored = Batch({}, {"reward_extra/a/pred": [None, "1", None], "reward_extra/b/pred": ["x", "2", None],
                        "reward_extra/b/other": [1, 2, 3]})
    assert _answers(scored, 3) == ["x", "1", None]
    assert _answers(Batch({}, {"reward_extra/pred": ["7"]}), 1) == ["7"]
