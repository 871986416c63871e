"""verl's DAPO math scorer: the last "Answer:" line, Minerva-normalised, 1 / -1, for math_dapo and aime* rows."""

import pytest

from verl.rewards.scorers import SCORERS, default_compute_score, get_scorer
from verl.rewards.scorers.math_dapo import normalize_answer


@pytest.mark.parametrize("response, truth, score, pred", [
    ("So x = 3.\nAnswer: 34", "34", 1.0, "34"),
    ("answer:  \\boxed{34}", "34", 1.0, "34"),                       # any case; the box unwrapped
    ("Answer: $\\frac12$", "\\frac{1}{2}", 1.0, "\\frac{1}{2}"),     # shorthand fraction written out
    ("Answer: 1,000 dollars", "1000", 1.0, "1000"),                  # units dropped, thousands separator too
    ("Answer: x = 5\nAnswer: 7", "7", 1.0, "7"),                    # the last one counts
    ("Answer: 35", "34", -1.0, "35"),
    ("The result is 34.", "34", -1.0, "[INVALID]"),                  # no Answer line: -1, not 0
])
def test_the_last_answer_line_is_normalised_and_scored_plus_or_minus_one(response, truth, score, pred):
    assert SCORERS["math_dapo"]("math_dapo", response, truth) == {"score": score, "acc": score == 1.0, "pred": pred}


def test_only_the_last_300_characters_are_read():
    assert SCORERS["math_dapo"]("math_dapo", "Answer: 34\n" + "x" * 300, "34")["score"] == -1.0


@pytest.mark.parametrize("source", ["math_dapo_reasoning", "aime24", "aime_2025"])
def test_verls_dapo_data_sources_are_scored_by_it(source):
    assert get_scorer(source) is SCORERS["math_dapo"]
    assert default_compute_score(source, "Answer: 12", "12") == {"score": 1.0, "acc": True, "pred": "12"}


def test_normalisation_keeps_the_part_after_the_last_equals_sign_and_drops_text_wrappers():
    assert normalize_answer("y = \\text{5 cm}") == "5"
    assert normalize_answer("\\sqrt2") == "\\sqrt{2}"
