"""The built-in spelling task: rows, the long tail of lengths, and the graded score, by hand."""

import collections

import pytest

from verl.data.tasks import TASKS, spell
from verl.rewards.scorers import default_compute_score


def test_rows_split_numbers_apart_with_a_long_tail_of_lengths():
    train, test = spell.make_rows("train"), spell.make_rows("test")
    assert len(train) == spell.TRAIN_ROWS and len(test) == spell.TEST_ROWS and TASKS["spell"] is spell
    assert not {r["extra_info"]["number"] for r in train} & {r["extra_info"]["number"] for r in test}
    row = train[0]
    number = row["extra_info"]["number"]
    assert row["prompt"] == [{"role": "user", "content": f"spell {number}"}]
    assert row["reward_model"]["ground_truth"].split() == [spell.WORDS[int(d)] for d in number]
    digits = collections.Counter(len(r["extra_info"]["number"]) for r in train)
    assert set(digits) == set(range(1, 13))
    # most answers are short, a few long: the median is under a third of the longest
    lengths = sorted(len(r["reward_model"]["ground_truth"]) for r in train)
    assert lengths[len(lengths) // 2] * 3 < lengths[-1] and digits[1] > 5 * digits[12]
    assert spell.make_rows("train", n=10, seed=3) == spell.make_rows("train", n=10, seed=3)


@pytest.mark.parametrize("response, score", [
    ("four eight three one", 1.0),
    ("  four eight three one\n", 1.0),
    ("four eight", 0.5),                    # two of four words
    ("four eight three one one", 0.8),      # four right of five said
    ("eight four three one", 0.5),          # words out of place are wrong
    ("", 0.0),
])
def test_the_score_is_the_share_of_words_right_in_place(response, score):
    assert spell.compute_score(spell.DATA_SOURCE, response, "four eight three one") == score
    assert default_compute_score(spell.DATA_SOURCE, response, "four eight three one") == score
