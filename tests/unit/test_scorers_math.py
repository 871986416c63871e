"""The GSM8K, MATH and format scorers, on hand-written responses."""

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from verl.rewards import RewardError
from verl.rewards.scorers import SCORERS, default_compute_score, gsm8k, math_answers
from verl.rewards.scorers.format import boxed_format, think_format


def gsm(response, truth, method="strict", **kw):
    return gsm8k.compute_score("openai/gsm8k", response, truth, method=method, **kw)


# --- GSM8K -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, strict, flexible", [
    ("The answer is 5. #### 7", "7", "7"),
    ("#### 7 apples, not 5", "7", "5"),
    ("So she has 12 left.", None, "12"),
    ("first #### 3\nthen #### 4", "4", "4"),
    ("#### $1,234", "1234", "1234"),
    ("It costs $1,234.", None, "1234"),
    ("#### -5", "-5", "-5"),
    ("#### 3.50", "3.50", "3.50"),
    ("1,2,3", None, "3"),
    ("no numbers here", None, None),
])
def test_gsm8k_strict_reads_after_the_last_hashes_and_flexible_the_last_number(text, strict, flexible):
    assert gsm8k.extract_solution(text, "strict") == strict
    assert gsm8k.extract_solution(text, "flexible") == flexible


def test_gsm8k_strict_and_flexible_score_differently():
    assert gsm("The answer is 5. #### 7", "5") == 0.0
    assert gsm("#### 7 apples, not 5", "5", method="flexible") == 1.0
    assert gsm("#### 7 apples, not 5", "7") == 1.0
    assert gsm("So the answer is 72.", "72") == 0.0
    assert gsm("So the answer is 72.", "72", method="flexible") == 1.0


@pytest.mark.parametrize("response, truth", [
    ("#### 1,234", "1234"),
    ("#### 1234", "1,234"),
    ("#### $18", "18"),
    ("#### -3", "-3"),
    ("#### 3.50", "3.5"),
    ("#### 2.0", "2"),
])
def test_gsm8k_numbers_compare_after_normalising_commas_dollars_and_trailing_zeros(response, truth):
    assert gsm(response, truth) == 1.0


def test_gsm8k_wrong_answer_gets_format_score_and_missing_answer_gets_zero():
    assert gsm("#### 8", "7") == 0.0
    assert gsm("#### -7", "7") == 0.0
    assert gsm("#### 8", "7", format_score=0.1) == 0.1
    assert gsm("no final line", "7", format_score=0.1) == 0.0
    assert gsm("#### 7", "7", score=2.0) == 2.0
    assert isinstance(gsm("#### 7", "7"), float)


def test_gsm8k_takes_a_worked_solution_as_ground_truth_by_its_final_number():
    """The raw answer column of openai/gsm8k, used without the preprocessing script: before, the response's number
    was compared with the whole solution text, so every response scored 0, all run."""
    solution = "Adults pay 2*7=<<2*7=14>>14 dollars.\nTogether 14+12=<<14+12=26>>26 dollars.\n#### 1,026"
    assert gsm("So #### 1026", solution) == 1.0 and gsm("#### 26", solution) == 0.0
    assert gsm("It is 1026.", solution, method="flexible") == 1.0


def test_a_ground_truth_no_gsm8k_response_can_match_stops_the_run_naming_the_row():
    from verl.rewards.scorers import check_builtin_rows

    rows = [{"data_source": "openai/gsm8k", "ground_truth": truth, "index": i}
            for i, truth in enumerate(["26", "Adults pay ... #### 26", 3.0, "twenty-six"])]
    with pytest.raises(RewardError, match=r"^data.train_files: row 3 \(data_source='openai/gsm8k'\): its ground truth "
                                          r"'twenty-six' is not a number, nor a solution ending '#### <number>', so its "
                                          r"built-in scorer would score every response 0. Give the final number as "
                                          r"reward_model.ground_truth"):
        check_builtin_rows(rows, "data.train_files")
    check_builtin_rows(rows[:3], "data.train_files")
    check_builtin_rows([{"data_source": "exact_match", "ground_truth": "twenty-six"}], "data.train_files")


def test_gsm8k_rejects_an_unknown_method():
    with pytest.raises(ValueError, match="strict"):
        gsm8k.extract_solution("#### 1", "loose")


def test_gsm8k_sources_are_registered():
    for source in ("openai/gsm8k", "gsm8k"):
        assert default_compute_score(source, "#### 72", "72") == 1.0
        assert default_compute_score(source, "it is 72", "72") == 0.0
    assert default_compute_score("gsm8k/flexible", "it is 72", "72") == 1.0


# --- MATH --------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, boxed", [
    ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("\\boxed{1} then \\boxed{\\frac{a}{\\sqrt{b}}}", "\\frac{a}{\\sqrt{b}}"),
    ("$\\boxed 5$", "5"),
    ("\\boxed 7 apples", "7"),
    ("\\fbox{3}", "3"),
    ("\\boxed{2} or rather \\fbox{4}", "4"),
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
    ("\\boxed{ 9 }", "9"),
    ("\\boxed{}", None),
    ("\\boxed{\\frac{1}{2}", None),
    ("\\boxed", None),
    ("the answer is 5", None),
])
def test_extract_boxed_takes_the_last_box_with_nested_braces(text, boxed):
    assert math_answers.extract_boxed(text) == boxed


@pytest.mark.parametrize("response, truth", [
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{\\frac{1}{2}}", "\\frac12"),
    ("\\boxed{0.5}", "\\dfrac{1}{2}"),
    ("\\boxed{2x+1}", "1+2x"),
    ("\\boxed{\\sqrt{2}}", "\\sqrt2"),
    ("\\boxed{9\\pi}", "9\\pi"),
    ("first \\boxed{3}, no: \\boxed{\\frac{6}{2} + \\frac{1}{1}}", "4"),
])
def test_math_equivalent_answers_score_one(response, truth):
    assert math_answers.compute_score("math", response, truth) == {
        "score": 1.0, "pred": math_answers.extract_boxed(response)}


@pytest.mark.parametrize("response, truth, pred", [
    ("\\boxed{3}", "4", "3"),
    ("\\boxed{2x-1}", "2x+1", "2x-1"),
    ("\\boxed{4} then finally \\boxed{3}", "4", "3"),
    ("the answer is 4", "4", None),
    ("\\boxed{}", "4", None),
])
def test_math_wrong_or_missing_answers_score_zero(response, truth, pred):
    assert math_answers.compute_score("math", response, truth) == {"score": 0.0, "pred": pred}


def test_math_sources_are_registered():
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math"):
        assert default_compute_score(source, "\\boxed{\\frac{3}{5}}", "0.6")["score"] == 1.0


def test_math_scores_off_the_main_thread_where_signal_timeouts_cannot_run():
    with ThreadPoolExecutor(1) as pool:
        result = pool.submit(math_answers.compute_score, "math", "\\boxed{\\frac12}", "0.5").result()
    assert result["score"] == 1.0


def test_math_keeps_the_timeout_in_the_main_thread_and_drops_it_elsewhere(monkeypatch):
    import math_verify

    seen = []
    real_parse, real_verify = math_verify.parse, math_verify.verify

    def parse(text, parsing_timeout):
        seen.append(parsing_timeout)
        return real_parse(text, parsing_timeout=None)

    def verify(gold, pred, timeout_seconds):
        seen.append(timeout_seconds)
        return real_verify(gold, pred, timeout_seconds=None)

    monkeypatch.setattr(math_verify, "parse", parse)
    monkeypatch.setattr(math_verify, "verify", verify)
    assert threading.current_thread() is threading.main_thread()
    assert math_answers.compute_score("math", "\\boxed{1}", "1", timeout_s=7)["score"] == 1.0
    assert seen == [7, 7, 7]
    seen.clear()
    with ThreadPoolExecutor(1) as pool:
        pool.submit(math_answers.compute_score, "math", "\\boxed{1}", "1", timeout_s=7).result()
    assert seen == [None, None, None]


def test_math_parse_that_runs_past_the_timeout_scores_zero(monkeypatch):
    import math_verify.parser

    def slow(*args, **kwargs):
        time.sleep(5)
        return []

    monkeypatch.setattr(math_verify.parser, "extract_target_from_pred", slow)
    start = time.monotonic()
    assert math_answers.compute_score("math", "\\boxed{1}", "1", timeout_s=1) == {"score": 0.0, "pred": "1"}
    assert time.monotonic() - start < 4


def test_math_without_math_verify_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` raise ImportError
    with pytest.raises(RewardError, match=r"pip install math-verify.*verl\[math\]"):
        math_answers.compute_score("math", "\\boxed{1}", "1")
    # A response with no box needs no grading, so it still scores without the library.
    assert math_answers.compute_score("math", "no box", "1") == {"score": 0.0, "pred": None}


# --- format ------------------------------------------------------------------------------------

@pytest.mark.parametrize("response, expected", [
    ("<think>add them</think>The answer is 5.", 1.0),
    ("  <think>\nadd them\n</think>\n5", 1.0),
    ("<think></think>5", 1.0),
    ("<think>add them</think>", 0.0),
    ("<think>add them</think>   ", 0.0),
    ("add them</think>5", 0.0),
    ("The answer is 5.", 0.0),
    ("<think>a</think>5<think>b</think>6", 0.0),
    ("<think>a<think>b</think>5", 0.0),
    ("<think>a</think>5</think>", 0.0),
    ("intro <think>a</think>5", 0.0),
])
def test_think_format_wants_one_leading_think_block_then_an_answer(response, expected):
    assert think_format("x", response) == expected


@pytest.mark.parametrize("response, expected", [
    ("so \\boxed{5}", 1.0), ("\\fbox{x}", 1.0), ("\\boxed{}", 0.0), ("\\boxed{5", 0.0), ("5", 0.0)])
def test_boxed_format_wants_a_non_empty_box(response, expected):
    assert boxed_format("x", response) == expected


def test_format_rewards_are_registered():
    assert SCORERS["format/think"] is think_format and SCORERS["format/boxed"] is boxed_format
    assert default_compute_score("format/boxed", "\\boxed{1}", None) == 1.0


def test_built_in_task_scorers_are_kept():
    from verl.data.tasks import TASKS

    assert SCORERS["exact_match"]("x", " 5 ", "5") == 1.0
    for task in TASKS.values():
        assert SCORERS[task.DATA_SOURCE] is task.compute_score
