"""The word-problem task: its strict GSM8K-format scorer and its generator."""

import random
import re
from collections import Counter

import pytest

from verl.data import read_rows, write_parquet
from verl.data.tasks import TASKS, word_problems
from verl.data.tasks.word_problems import TEMPLATES, extract_answer
from verl.errors import VerlError


def score(text, gt="29"):
    return word_problems.compute_score(word_problems.DATA_SOURCE, text, gt)


# ----------------------------------------------------------------------------- scorer

@pytest.mark.parametrize("text", [
    "60 - 31 = 29\n#### 29",
    "#### 29",
    "So 29 are left.\n####29\n",
    "#### $29",
    "#### 29.",  # a sentence's full stop is not part of the number
    "#### 29.00",  # equal as a number
    "wrong: #### 30\nOn second thought:\n#### 29",  # the last #### counts
])
def test_correct_answers_score_one(text):
    assert score(text) == 1.0


@pytest.mark.parametrize("text, why", [
    ("#### 30", "wrong number"),
    ("#### 29\nno wait\n#### 30", "the last #### says 30"),
    ("The answer is 29.", "no ####: the strict format wants one"),
    ("29", "no ####"),
    ("", "empty"),
    ("#### twenty-nine", "words in place of a number"),
    ("#### the answer is 29", "strict: the number must follow ####"),
    ("#### -29", "sign matters"),
    ("#### 2.9", "not the same number"),
])
def test_wrong_or_unformatted_answers_score_zero(text, why):
    assert score(text) == 0.0, why


@pytest.mark.parametrize("text", ["#### 1,250", "#### $1,250", "#### 1250", "#### $ 1,250.0"])
def test_dollar_signs_and_thousands_commas_are_normalised(text):
    assert score(text, "1250") == 1.0
    assert score(text, "1,250") == 1.0


def test_extract_answer_returns_the_bare_number_or_none():
    assert extract_answer("so\n#### $1,234\n") == "1234"
    assert extract_answer("no marker 12") is None
    assert extract_answer("#### ") is None


def test_bad_ground_truth_is_named():
    with pytest.raises(VerlError, match="ground_truth must be a number, got 'twenty'"):
        score("#### 20", "twenty")


# ----------------------------------------------------------------------------- generator

def _key(row):
    return row["extra_info"]["template"], tuple(row["extra_info"]["numbers"])


def test_every_template_gives_a_positive_whole_answer_that_its_solution_reaches():
    rng = random.Random(0)
    for name, template in TEMPLATES.items():
        for _ in range(300):
            numbers, question, steps, answer = template(rng)
            assert isinstance(answer, int) and answer > 0, (name, numbers)
            assert question.endswith("?") and steps
            assert word_problems.compute_score(None, "\n".join(steps + [f"#### {answer}"]), str(answer)) == 1.0
            # Every intermediate line is arithmetic that holds.
            for a, op, b, c in re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", "\n".join(steps)):
                assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b),
                        "/": int(a) / int(b)}[op] == int(c), (name, steps)


def test_generation_is_deterministic_per_seed():
    assert word_problems.make_rows("train", n=50, seed=3) == word_problems.make_rows("train", n=50, seed=3)
    assert word_problems.make_rows("train", n=50, seed=3) != word_problems.make_rows("train", n=50, seed=4)


def test_train_and_test_are_disjoint_in_numbers_and_in_text():
    train, test = word_problems.make_rows("train"), word_problems.make_rows("test")
    assert (len(train), len(test)) == (word_problems.DEFAULT_ROWS["train"], word_problems.DEFAULT_ROWS["test"])
    assert not {_key(r) for r in train} & {_key(r) for r in test}
    texts = [r["prompt"][0]["content"] for r in train], [r["prompt"][0]["content"] for r in test]
    assert len(set(texts[0])) == len(train) and len(set(texts[1])) == len(test)
    assert not set(texts[0]) & set(texts[1])
    # Other seeds draw other problems, each still on its side of the fixed split.
    other = word_problems.make_rows("test", n=300, seed=9)
    assert not {_key(r) for r in other} & {_key(r) for r in train}


def test_every_template_appears_in_both_splits():
    for rows in (word_problems.make_rows("train"), word_problems.make_rows("test")):
        counts = Counter(r["extra_info"]["template"] for r in rows)
        assert set(counts) == set(TEMPLATES) and min(counts.values()) >= len(rows) // 20, counts


def test_every_reference_solution_scores_one_with_the_task_scorer():
    rows = word_problems.make_rows("train") + word_problems.make_rows("test")
    for row in rows:
        solution, gt = row["extra_info"]["solution"], row["reward_model"]["ground_truth"]
        assert solution.endswith(f"#### {gt}") and gt.isdigit()
        assert word_problems.compute_score(row["data_source"], solution, gt) == 1.0


def test_rows_have_the_verl_layout_and_the_format_instruction():
    row = word_problems.make_rows("test", n=1)[0]
    assert row["data_source"] == word_problems.DATA_SOURCE and row["prompt"][0]["role"] == "user"
    assert row["prompt"][0]["content"].endswith(word_problems.INSTRUCTION) and "####" in word_problems.INSTRUCTION
    assert row["reward_model"] == {"style": "rule", "ground_truth": row["reward_model"]["ground_truth"]}
    assert row["extra_info"]["split"] == "test" and row["extra_info"]["index"] == 0


def test_unknown_split_is_named():
    with pytest.raises(ValueError, match="split must be 'train' or 'test', got 'dev'"):
        word_problems.make_rows("dev")


def test_rows_survive_the_parquet_round_trip(tmp_path):
    rows = word_problems.make_rows("train", n=60, seed=2)
    assert read_rows(write_parquet(rows, tmp_path / "w.parquet")) == rows


def test_the_reward_registry_routes_word_problem_rows_to_this_scorer():
    from verl.rewards.scorers import default_compute_score

    assert TASKS["word_problems"] is word_problems
    assert default_compute_score(word_problems.DATA_SOURCE, "... #### 1,250", "1250") == 1.0
