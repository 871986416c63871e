"""The GSM8K and MATH preprocessing scripts, run as a user runs them, on small files in the public layouts."""

import os
import re

import pytest
from helpers import REPO
from zygote import run_script

from verl.data import RLDataset, read_rows, write_parquet
from verl.models.tiny import build_char_tokenizer
from verl.rewards.scorers import SCORERS, default_compute_score

FIXTURES = REPO / "tests" / "fixtures"
GSM8K = REPO / "examples" / "data_preprocess" / "gsm8k.py"
MATH = REPO / "examples" / "data_preprocess" / "math_dataset.py"
GSM8K_ANSWERS = {"train": ["28", "210", "1250", "6", "48"], "test": ["39", "270", "26", "38", "100"]}
MATH_ANSWERS = {"train": ["\\frac{5}{6}", "6", "9\\pi", "5\\sqrt{2}", "6"],
                "test": ["23", "\\frac{3}{5}", "3", "2x+1", "2"]}


def preprocess(script, tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets-cache")}
    return run_script(script, args, cwd=tmp_path, env=env, timeout=300)


def check_ok(done):
    assert done.returncode == 0, f"--- stdout\n{done.stdout[-2000:]}\n--- stderr\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def gsm8k_out(tmp_path_factory):
    """The GSM8K fixture folder (train.jsonl, test.jsonl) preprocessed; the folder of the parquet files."""
    tmp_path = tmp_path_factory.mktemp("gsm8k")
    check_ok(preprocess(GSM8K, tmp_path, "--local_dataset_path", FIXTURES / "gsm8k", "--local_save_dir", "out"))
    return tmp_path / "out"


def test_gsm8k_jsonl_folder_becomes_verl_rows_that_the_gsm8k_scorer_accepts(gsm8k_out):
    questions = {split: [r["question"] for r in read_rows(FIXTURES / "gsm8k" / f"{split}.jsonl")]
                 for split in ("train", "test")}
    for split in ("train", "test"):
        rows = read_rows(gsm8k_out / f"{split}.parquet")
        assert [r["reward_model"]["ground_truth"] for r in rows] == GSM8K_ANSWERS[split]
        for i, row in enumerate(rows):
            assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
            assert row["reward_model"]["style"] == "rule"
            assert [m["role"] for m in row["prompt"]] == ["user"]
            assert row["prompt"][0]["content"].startswith(questions[split][i])
            assert "####" in row["prompt"][0]["content"]
            info = row["extra_info"]
            assert (info["split"], info["index"], info["question"]) == (split, i, questions[split][i])
            # The reference solution, graded by the registered scorer, earns full marks.
            assert default_compute_score(row["data_source"], info["answer"], row["reward_model"]["ground_truth"]) == 1.0


def test_gsm8k_hub_parquet_layout_loads_from_its_folder(tmp_path):
    # The Hub's openai/gsm8k keeps each config as main/{split}-00000-of-00001.parquet.
    for split in ("train", "test"):
        write_parquet(read_rows(FIXTURES / "gsm8k" / f"{split}.jsonl"),
                      tmp_path / "gsm8k" / "main" / f"{split}-00000-of-00001.parquet")
    done = preprocess(GSM8K, tmp_path, "--local_dataset_path", tmp_path / "gsm8k" / "main", "--local_save_dir", "out")
    check_ok(done)
    for split in ("train", "test"):
        rows = read_rows(tmp_path / "out" / f"{split}.parquet")
        assert [r["reward_model"]["ground_truth"] for r in rows] == GSM8K_ANSWERS[split]


def test_math_files_become_verl_rows_that_the_math_scorer_accepts(tmp_path):
    files = [FIXTURES / "math" / "train.jsonl", FIXTURES / "math" / "test.jsonl"]
    check_ok(preprocess(MATH, tmp_path, "--local_dataset_path", *files, "--local_save_dir", "out"))
    for split in ("train", "test"):
        source = read_rows(FIXTURES / "math" / f"{split}.jsonl")
        rows = read_rows(tmp_path / "out" / f"{split}.parquet")
        assert [r["reward_model"]["ground_truth"] for r in rows] == MATH_ANSWERS[split]
        for i, (row, original) in enumerate(zip(rows, source)):
            assert row["data_source"] == "DigitalLearningGmbH/MATH-lighteval" and row["ability"] == "math"
            assert row["prompt"][0]["content"].startswith(original["problem"])
            assert "\\boxed{}" in row["prompt"][0]["content"]
            assert row["extra_info"] == {"split": split, "index": i, "answer": original["solution"],
                                         "question": original["problem"], "level": original["level"],
                                         "type": original["type"]}
            score = default_compute_score(row["data_source"], original["solution"], row["reward_model"]["ground_truth"])
            assert score == {"score": 1.0, "pred": MATH_ANSWERS[split][i]}


def test_math_500_layout_uses_its_answer_column_and_names_its_source(tmp_path):
    rows = [{"problem": "What is $7 \\cdot 6$?", "solution": "It is $\\boxed{42}$.", "answer": "42",
             "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/1.json"}]
    write_parquet(rows, tmp_path / "math500" / "test.parquet")
    check_ok(preprocess(MATH, tmp_path, "--local_dataset_path", tmp_path / "math500" / "test.parquet",
                        "--hub_name", "HuggingFaceH4/MATH-500", "--local_save_dir", "out"))
    assert not (tmp_path / "out" / "train.parquet").exists()
    [row] = read_rows(tmp_path / "out" / "test.parquet")
    assert row["data_source"] == "HuggingFaceH4/MATH-500" and row["reward_model"]["ground_truth"] == "42"
    assert (row["extra_info"]["type"], row["extra_info"]["level"]) == ("Prealgebra", 1)


@pytest.mark.parametrize("script, hub_name", [(GSM8K, "openai/gsm8k"), (MATH, "DigitalLearningGmbH/MATH-lighteval")])
def test_hub_name_without_network_says_to_pass_a_local_path(tmp_path, script, hub_name):
    done = preprocess(script, tmp_path, "--local_save_dir", "out")
    assert done.returncode != 0
    assert f"could not load {hub_name!r}" in done.stderr and "--local_dataset_path" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_bad_local_paths_are_named(tmp_path):
    done = preprocess(GSM8K, tmp_path, "--local_dataset_path", tmp_path / "nowhere", "--local_save_dir", "out")
    assert done.returncode != 0 and "no such file or folder" in done.stderr and "nowhere" in done.stderr
    (tmp_path / "questions.jsonl").write_text((FIXTURES / "gsm8k" / "train.jsonl").read_text())
    done = preprocess(GSM8K, tmp_path, "--local_dataset_path", tmp_path / "questions.jsonl", "--local_save_dir", "out")
    assert done.returncode != 0 and "cannot tell the split" in done.stderr and "questions.jsonl" in done.stderr


def test_preprocessed_parquet_loads_as_an_rl_dataset(gsm8k_out):
    tokenizer = build_char_tokenizer()
    dataset = RLDataset(gsm8k_out / "test.parquet", tokenizer, max_prompt_length=1024)
    assert len(dataset) == 5
    item = dataset[1]
    assert item["ground_truth"] == "270" and item["data_source"] == "openai/gsm8k"
    assert "A train travels 60 kilometers" in tokenizer.decode(item["input_ids"])


def test_datasets_doc_names_real_scripts_and_registered_scorers():
    doc = (REPO / "docs" / "datasets.md").read_text()
    scripts = set(re.findall(r"examples/data_preprocess/\w+\.py", doc))
    assert scripts == {"examples/data_preprocess/gsm8k.py", "examples/data_preprocess/math_dataset.py"}
    assert all((REPO / script).is_file() for script in scripts)
    for name in ("openai/gsm8k", "gsm8k", "gsm8k/flexible", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval",
                 "HuggingFaceH4/MATH-500", "math", "format/think", "format/boxed"):
        assert f"`{name}`" in doc and name in SCORERS
