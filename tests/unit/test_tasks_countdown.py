"""The countdown task: its scorer on hand-worked answers, its generator, and its way into training."""

import ast
import itertools
import os
import re
import runpy
import shlex
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest

from verl.data import RLDataset, read_rows, write_parquet
from verl.data.tasks import TASKS, countdown
from verl.data.tasks.countdown import FORMAT_SCORE, ExpressionError, evaluate, parse, solve
from verl.errors import VerlError

GT = {"target": 8, "numbers": [6, 4, 3]}


def score(text, gt=GT):
    return countdown.compute_score(countdown.DATA_SOURCE, text, gt)


# ----------------------------------------------------------------------------- scorer

@pytest.mark.parametrize("text", [
    "<answer>6 / 3 * 4</answer>",
    "<answer>4 * 6 / 3</answer>",
    "<answer>4 / 3 * 6</answer>",  # 4/3 is not whole: exact fractions still reach 8
    "<answer>6 * 4 / 3</answer>",
    "<answer>((6) * (4)) / 3</answer>",
])
def test_correct_equations_score_one(text):
    assert score(text) == 1.0


def test_intermediate_fraction_reaches_the_target_exactly():
    # 1/3 + 1 = 4/3, times 6 = 8; a float evaluator could miss, Fraction cannot. 1 is given twice.
    assert score("<answer>(1 / 3 + 1) * 6</answer>", {"target": 8, "numbers": [1, 3, 1, 6]}) == 1.0


@pytest.mark.parametrize("text, why", [
    ("<answer>6 + 4 + 3</answer>", "evaluates to 13, not 8"),
    ("<answer>6 / 3 * 4 * 4 / 4</answer>", "uses 4 three times"),
    ("<answer>6 / 3 + 6</answer>", "uses 6 twice and 4 not at all"),
    ("<answer>16 / 2</answer>", "uses numbers that were not given"),
    ("<answer>6 + 4 - 2</answer>", "2 is not given"),
    ("<answer>6 + 4</answer>", "leaves 3 unused: every number exactly once"),
])
def test_well_formed_but_wrong_equations_get_the_format_score(text, why):
    assert score(text) == FORMAT_SCORE, why


@pytest.mark.parametrize("text", [
    "",
    "I cannot do this",
    "<answer></answer>",
    "<answer>6 / * 3 4</answer>",
    "<answer>(6 / 3 * 4</answer>",
    "<answer>6 / 3) * 4</answer>",
    "<answer>6 ** 3</answer>",
    "<answer>-6 + 4 * 3 + 2</answer>",  # no unary minus
    "<answer>6.0 / 3 * 4</answer>",
    "<answer>6 / 3 * 4 = eight</answer>",
    "<answer>8 = 6 / 3 * 4</answer>",
    "<answer>" + "(" * 150 + "6 / 3 * 4" + ")" * 150 + "</answer>",  # over MAX_EQUATION_CHARS
    "<answer>" + "(" * 20 + "6 / 3 * 4" + ")" * 20 + "</answer>",  # over MAX_NESTING
    "<answer>" + "(" * 199 + "</answer>",  # would recurse deeply without the nesting limit
])
def test_malformed_answers_score_zero(text):
    assert score(text) == 0.0


def test_division_by_zero_scores_zero():
    assert score("<answer>6 / (4 - 4)</answer>", {"target": 8, "numbers": [6, 4, 4]}) == 0.0


def test_injection_is_never_executed(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a) or 0)
    marker = tmp_path / "pwned"
    for text in ["__import__('os').system('x')", f"<answer>__import__('os').system('touch {marker}')</answer>",
                 "<answer>(lambda: 8)()</answer>", "<answer>open('/etc/passwd').read()</answer>"]:
        assert score(text) == 0.0
    assert calls == [] and not marker.exists()


@pytest.mark.parametrize("text", [
    "  <answer>\n   6/3*4 \n</answer>\n",
    "first try <answer>6 + 4 + 3</answer>, better: <answer>6 / 3 * 4</answer>",  # the last tag counts
    "Let me think.\n6 * 4 = 24, 24 / 3 = 8.\n6 * 4 / 3\n\n",  # no tag: the last non-empty line
    "<answer>6 / 3 * 4 = 8</answer>",  # a trailing "= number" is allowed
    "<answer>6/3*4=8</answer>",
])
def test_whitespace_tags_and_last_line_are_handled(text):
    assert score(text) == 1.0


def test_claimed_result_is_ignored_in_favour_of_the_expression_value():
    assert score("<answer>6 + 4 + 3 = 8</answer>") == FORMAT_SCORE


@pytest.mark.parametrize("gt", [{"target": 8}, "8", None, {"target": "eight", "numbers": [1]}])
def test_bad_ground_truth_names_the_expected_form(gt):
    with pytest.raises(VerlError, match=r"ground_truth must be a dict \{'target': int, 'numbers'"):
        score("<answer>1</answer>", gt)


@pytest.mark.parametrize("text, value", [
    ("2 + 3 * 4", 14), ("(2 + 3) * 4", 20), ("8 - 3 - 2", 3), ("8 / 4 / 2", 1), ("8 - (3 - 2)", 7),
    ("((7))", 7), ("1 / 3", Fraction(1, 3)), ("(" * 16 + "7" + ")" * 16, 7),
])
def test_parser_respects_precedence_and_left_associativity(text, value):
    assert evaluate(parse(text)) == value


@pytest.mark.parametrize("text", ["", "1 +", "1 2", "()", "1 + (2", "x", "1 ^ 2"])
def test_parser_rejects_incomplete_or_foreign_text(text):
    with pytest.raises(ExpressionError):
        parse(text)


# ----------------------------------------------------------------------------- brute-force solver

def test_solver_finds_a_scoring_equation_or_reports_none():
    found = solve([6, 4, 3], 8)
    assert found is not None and score(f"<answer>{found}</answer>") == 1.0
    assert score(f"<answer>{solve([1, 3, 1, 6], 8)}</answer>", {"target": 8, "numbers": [1, 3, 1, 6]}) == 1.0
    assert solve([1, 1, 1], 100) is None
    assert solve([2, 2], 5) is None


# ----------------------------------------------------------------------------- generator

def _key(row):
    gt = row["reward_model"]["ground_truth"]
    return tuple(sorted(gt["numbers"])), gt["target"]


def test_generation_is_deterministic_per_seed():
    assert countdown.make_rows("train", n=50, seed=3) == countdown.make_rows("train", n=50, seed=3)
    assert countdown.make_rows("train", n=50, seed=3) != countdown.make_rows("train", n=50, seed=4)


def test_train_and_test_instances_are_disjoint_and_distinct():
    train, test = countdown.make_rows("train"), countdown.make_rows("test")
    assert (len(train), len(test)) == (countdown.DEFAULT_ROWS["train"], countdown.DEFAULT_ROWS["test"])
    train_keys, test_keys = {_key(r) for r in train}, {_key(r) for r in test}
    assert len(train_keys) == len(train) and len(test_keys) == len(test)
    assert not train_keys & test_keys


def test_held_out_split_is_a_fixed_function_of_the_instance():
    other_seed = countdown.make_rows("train", n=300, seed=11)
    assert not any(countdown._is_held_out(list(numbers), target) for numbers, target in map(_key, other_seed))
    assert all(countdown._is_held_out(list(n), t) for n, t in map(_key, countdown.make_rows("test", n=100, seed=11)))


def test_every_instance_is_solvable_and_its_reference_solution_scores_one():
    for row in countdown.make_rows("test") + countdown.make_rows("train", n=1000, seed=5):
        gt = row["reward_model"]["ground_truth"]
        assert 3 <= len(gt["numbers"]) <= 4
        assert all(countdown.NUMBER_RANGE[0] <= x <= countdown.NUMBER_RANGE[1] for x in gt["numbers"])
        assert countdown.TARGET_RANGE[0] <= gt["target"] <= countdown.TARGET_RANGE[1]
        assert solve(gt["numbers"], gt["target"]) is not None, gt
        assert score(row["extra_info"]["solution"], gt) == 1.0, row


def test_an_independent_brute_force_confirms_solvability():
    # Not the module's solver: every permutation, every operator choice, every bracketing.
    def values(nums):
        if len(nums) == 1:
            yield Fraction(nums[0])
            return
        for cut in range(1, len(nums)):
            for a, b in itertools.product(list(values(nums[:cut])), list(values(nums[cut:]))):
                yield from (a + b, a - b, a * b)
                if b:
                    yield a / b

    for row in countdown.make_rows("test", n=60, seed=2):
        gt = row["reward_model"]["ground_truth"]
        assert any(gt["target"] in set(values(list(p))) for p in itertools.permutations(gt["numbers"])), gt


def test_rows_have_the_verl_layout_and_a_prompt_naming_numbers_and_target():
    row = countdown.make_rows("train", n=1)[0]
    gt = row["reward_model"]["ground_truth"]
    text = row["prompt"][0]["content"]
    assert row["data_source"] == countdown.DATA_SOURCE and row["prompt"][0]["role"] == "user"
    assert str(gt["numbers"]) in text and f"equals {gt['target']}" in text and "<answer>" in text
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 0


def test_unknown_split_is_named():
    with pytest.raises(ValueError, match="split must be 'train' or 'test', got 'val'"):
        countdown.make_rows("val")


def test_ground_truth_survives_the_parquet_round_trip(tmp_path):
    rows = countdown.make_rows("test", n=40)
    back = read_rows(write_parquet(rows, tmp_path / "c.parquet"))
    assert back == rows
    assert all(score(r["extra_info"]["solution"], r["reward_model"]["ground_truth"]) == 1.0 for r in back)


# ----------------------------------------------------------------------------- into training

def test_the_reward_registry_routes_countdown_rows_to_this_scorer():
    from verl.rewards.scorers import default_compute_score

    assert TASKS["countdown"] is countdown
    assert default_compute_score(countdown.DATA_SOURCE, "<answer>6/3*4</answer>", GT) == 1.0


def test_builtin_task_files_load_as_an_rl_dataset(tmp_path, monkeypatch):
    from verl.models.tiny import build_char_tokenizer
    from verl.trainer.ppo.build import builtin_task_files

    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path))
    train_file, test_file = builtin_task_files("countdown")
    assert str(tmp_path) in train_file and str(tmp_path) in test_file
    test_set = RLDataset(test_file, build_char_tokenizer(), max_prompt_length=400, config_key="data.val_files")
    assert len(test_set) == countdown.DEFAULT_ROWS["test"]
    item = test_set[0]
    assert item["data_source"] == countdown.DATA_SOURCE and set(item["ground_truth"]) == {"target", "numbers"}
    assert score(item["extra_info"]["solution"], item["ground_truth"]) == 1.0
    assert len(read_rows(train_file)) == countdown.DEFAULT_ROWS["train"]
    assert not Counter(map(_key, read_rows(train_file))) & Counter(map(_key, read_rows(test_file)))


# ----------------------------------------------------------------------------- docs/builtin_tasks.md stays true

DOC = (Path(__file__).resolve().parents[2] / "docs" / "builtin_tasks.md").read_text()
BLOCKS = re.findall(r"```(python|bash)\n(.*?)```", DOC, flags=re.DOTALL)


def test_the_documented_rows_have_the_generated_layout_and_score_one():
    documented = [ast.literal_eval(code) for kind, code in BLOCKS if kind == "python" and code.startswith("{")]
    assert [row["data_source"] for row in documented] == [countdown.DATA_SOURCE, "builtin/word_problems"]
    for row in documented:
        task = next(t for t in TASKS.values() if t.DATA_SOURCE == row["data_source"])
        made = task.make_rows("train", n=1)[0]
        assert set(row) == set(made) and set(row["extra_info"]) == set(made["extra_info"])
        gt = row["reward_model"]["ground_truth"]
        assert task.compute_score(row["data_source"], row["extra_info"]["solution"], gt) == 1.0
    assert documented[0]["prompt"][0]["content"] == countdown.prompt_text([6, 4, 3], 8)


def test_the_documented_parquet_recipe_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = next(code for kind, code in BLOCKS if kind == "python" and "write_parquet" in code)
    (tmp_path / "recipe.py").write_text(recipe)
    runpy.run_path(str(tmp_path / "recipe.py"))
    assert len(read_rows("data/countdown/train.parquet")) == 2000
    sft = read_rows("data/word_problems/sft.parquet")
    assert len(sft) == 2000 and sft[0]["prompt"][0]["role"] == "user"
    assert re.search(r"\n#### \d+$", sft[0]["response"])


def test_the_documented_commands_are_valid_configs():
    from verl.config.offline import SFTTrainerConfig
    from verl.trainer.main_ppo import load_config
    from verl.trainer.ppo.build import check_algorithm_names

    commands = [shlex.split(line) for kind, code in BLOCKS if kind == "bash"
                for line in code.replace("\\\n", " ").splitlines() if line.strip()]
    assert {c[2] for c in commands} == {"verl.trainer.main_ppo", "verl.trainer.main_sft"}
    for command in commands:
        if command[2] == "verl.trainer.main_sft":
            SFTTrainerConfig.from_cli(command[3:]).validate()
            continue
        config = load_config(command[3:])
        config.validate()
        check_algorithm_names(config)
        assert config.actor_rollout_ref.model.path is not None  # else the addition demo preset applies
        assert config.data.train_files is not None or config.data.builtin_task in TASKS
