"""verl's ``verl.utils.reward_score`` (default_compute_score, gsm8k, math, math_dapo, geo3k) with verl's
signatures, for reward files written against verl; values worked out by hand."""

import logging

import pytest

from verl.errors import RewardError
from verl.rewards.loader import load_reward_function
from verl.utils import reward_score
from verl.utils.reward_score import default_compute_score, geo3k, gsm8k, math, math_dapo


def test_gsm8k_takes_verls_positional_arguments_and_scores():
    assert gsm8k.compute_score("so 3 + 4 = 7\n#### 7", "7") == 1.0
    assert gsm8k.compute_score("#### 8", "7") == 0.0
    assert gsm8k.compute_score("#### 8", "7", "strict", 0.1, 2.0) == 0.1  # a wrong answer earns format_score
    assert gsm8k.compute_score("#### 7", "7", "strict", 0.1, 2.0) == 2.0
    assert gsm8k.compute_score("the answer is 7", "7") == 0.0  # strict: no "####"
    assert gsm8k.compute_score("the answer is 7", "7", method="flexible") == 1.0
    assert gsm8k.extract_solution("#### $1,234") == "1234"


def test_math_boxes_and_equivalence():
    text = r"so it is \boxed{\frac{1}{2}}, not \boxed{3}? no: \boxed{\frac{1}{2}}."
    assert math.last_boxed_only_string(text) == r"\boxed{\frac{1}{2}}"
    assert math.remove_boxed(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert math.last_boxed_only_string(r"$\boxed 5$") == r"\boxed 5" and math.remove_boxed(r"\boxed 5") == "5"
    assert math.last_boxed_only_string("no box") is None and math.last_boxed_only_string(r"\boxed{open") is None
    assert math.compute_score(text, "0.5") == 1.0  # math-verify: 1/2 is 0.5
    assert math.compute_score(text, "2") == 0.0 and math.compute_score("1/2", "0.5") == 0.0  # no box: 0
    assert math.is_equiv(r"\frac{1}{2}", "0.5") and not math.is_equiv("1", "2")
    assert math.is_equiv(None, None) and not math.is_equiv(None, "1")
    with pytest.raises(ValueError, match="not a boxed answer"):
        math.remove_boxed("5")


def test_math_dapo_answer_line_and_strict_box():
    assert math_dapo.compute_score("work...\nAnswer: 1,000 dollars", "1000") == {"score": 1.0, "acc": True,
                                                                                  "pred": "1000"}
    assert math_dapo.compute_score("Answer: 7", "8")["score"] == -1.0
    # strict: the last box of the last 100 characters, compared as text
    assert math_dapo.compute_score(r"x \boxed{12}", "12", strict_box_verify=True) == {"score": 1.0, "acc": True,
                                                                                        "pred": "12"}
    early = "." * 50 + r"\boxed{12}" + "." * 100  # the box is outside the last 100 characters
    assert math_dapo.compute_score(early, "12", strict_box_verify=True) == {"score": -1.0, "acc": False,
                                                                             "pred": None}
    # with pause tokens, from 100 characters before the last one's position: early[50:] holds the box
    assert math_dapo.compute_score(early, "12", True, [0, 1, 2, 150])["score"] == 1.0
    assert math_dapo.compute_score(early, "12", True, [0, 1, 2, 151])["score"] == -1.0  # early[51:]: cut
    assert math_dapo.compute_score(r"\boxed{12.0}", "12", strict_box_verify=True)["score"] == -1.0  # as text
    assert math_dapo.normalize_final_answer("x = 5 dollars") == "5"


def test_geo3k_weighs_the_answer_and_the_format():
    shaped = r"<think>angles add up</think> so \boxed{30}"
    assert geo3k.compute_score(shaped, "30") == pytest.approx(1.0)
    assert geo3k.compute_score(shaped, "31") == pytest.approx(0.1)  # the format part only
    assert geo3k.compute_score(r"\boxed{30}", "30") == pytest.approx(0.9)  # no <think>
    assert geo3k.compute_score(r"\boxed{30}", "30", format_score=0.5) == pytest.approx(0.5)
    assert geo3k.compute_score("30", "30", use_boxed=False) == pytest.approx(0.9)


def test_default_compute_score_dispatches_on_the_data_source_as_verl_does(caplog):
    assert default_compute_score("openai/gsm8k", "#### 7", "7") == 1.0
    assert isinstance(default_compute_score("openai/gsm8k", "#### 7", "7"), float)
    assert default_compute_score("aime2024", "Answer: 7", "7")["acc"] is True  # verl: any source starting aime
    assert default_compute_score("lighteval/MATH", r"\boxed{7}", "7") == {"score": 1.0, "pred": "7"}
    assert reward_score._default_compute_score is default_compute_score
    with pytest.raises(NotImplementedError) as err:  # what verl raises: a reward file may catch it
        default_compute_score("my/new_task", "x", "y")
    assert isinstance(err.value, RewardError) and "no built-in reward scorer for data_source='my/new_task'" in \
        str(err.value)
    reward_score._warned.clear()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            default_compute_score("openai/gsm8k", "#### 7", "7", sandbox_fusion_url="http://sandbox:8080/run_code")
    assert caplog.text.count("sandbox_fusion_url='http://sandbox:8080/run_code'): not used here") == 1


def test_a_verl_reward_file_loads_and_one_that_imports_a_missing_verl_scorer_is_named(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text("from verl.utils.reward_score import default_compute_score\n"
                    "from verl.utils.reward_score.gsm8k import compute_score as gsm8k_score\n\n"
                    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    if data_source == 'mine':\n"
                    "        return gsm8k_score(solution_str, ground_truth, format_score=0.1)\n"
                    "    return default_compute_score(data_source, solution_str, ground_truth, extra_info)\n")
    fn = load_reward_function(path)
    assert fn("mine", "#### 3", "4") == 0.1 and fn("openai/gsm8k", "#### 4", "4") == 1.0
    path.write_text("from verl.utils.reward_score import prime_math\n")
    with pytest.raises(RewardError, match=r"raised ImportError: cannot import name 'prime_math'.* \(verl\.utils\."
                                          r"reward_score\.prime_math is a scorer module of upstream verl"):
        load_reward_function(path)
    path.write_text("import verl.utils.reward_score.prime_math\n")
    with pytest.raises(RewardError, match=r"verl\.utils\.reward_score\.prime_math is a scorer module of upstream "
                                          r"verl that this project does not have; here verl\.utils\.reward_score has "
                                          r"default_compute_score and the modules gsm8k, math, math_dapo and geo3k"):
        load_reward_function(path)
    path.write_text("from verl.utils.hdfs_io import copy\n")
    with pytest.raises(RewardError, match=r"verl\.utils\.hdfs_io is a module of upstream verl that this project "
                                          r"does not have"):
        load_reward_function(path)
