"""Bad input stops before training with one clear message (exit code 2, no traceback)."""

import pytest

from verl.data import write_parquet
from verl.trainer.main_ppo import main


def run_main(args, capsys):
    code = main(args)
    err = capsys.readouterr().err
    return code, err


def _rows():
    return [{"prompt": [{"role": "user", "content": f"{i}+1="}], "data_source": "exact_match",
             "reward_model": {"ground_truth": str(i + 1)}} for i in range(8)]


def _small_run(tiny_model_dir, tmp_path, rows, *extra):
    """The arguments of a tiny RL run on ``rows`` (4 prompts x 2 samples a step), output in tmp_path/out."""
    return [f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={write_parquet(rows, tmp_path / 't.parquet')}",
            "actor_rollout_ref.rollout.n=2", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "trainer.progress_bar=false", "trainer.write_report=false", "data.max_response_length=4",
            "data.max_prompt_length=32", f"trainer.default_local_dir={tmp_path / 'out'}", *extra]


def test_unknown_key_suggests_the_right_one(capsys):
    code, err = run_main(["trainer.totl_epochs=3"], capsys)
    assert code == 2
    assert err.startswith("error:") and "trainer.total_epochs" in err and "Traceback" not in err


def test_misplaced_key_suggests_its_full_path(capsys):
    code, err = run_main(["trainer.lr=1e-5"], capsys)
    assert code == 2 and "actor_rollout_ref.actor.optim.lr" in err


def test_missing_model_folder(tmp_path, capsys):
    code, err = run_main([f"actor_rollout_ref.model.path={tmp_path}/no-such-model"], capsys)
    assert code == 2 and "no-such-model" in err and "actor_rollout_ref.model.path" in err


def test_missing_dataset_file(tiny_model_dir, tmp_path, capsys):
    code, err = run_main([f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={tmp_path}/nope.parquet",
                          "actor_rollout_ref.rollout.n=2"], capsys)
    assert code == 2 and "nope.parquet" in err and "data.train_files" in err


def test_dataset_without_prompt_column(tiny_model_dir, tmp_path, capsys):
    path = write_parquet([{"question": "1+1=", "data_source": "x"}] * 4, tmp_path / "bad.parquet")
    code, err = run_main([f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={path}",
                          "actor_rollout_ref.rollout.n=2"], capsys)
    assert code == 2 and "prompt" in err and "question" in err and "data.prompt_key" in err


def test_reward_file_without_the_named_function(tiny_model_dir, tmp_path, capsys):
    data = write_parquet(_rows(), tmp_path / "train.parquet")
    reward = tmp_path / "reward.py"
    reward.write_text("def my_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    code, err = run_main([f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={data}",
                          f"custom_reward_function.path={reward}", "actor_rollout_ref.rollout.n=2"], capsys)
    assert code == 2 and "compute_score" in err and "my_score" in err and "custom_reward_function.name" in err


@pytest.mark.parametrize("arg", ["not-an-override", "data.train_batch_size=many"])
def test_malformed_overrides(arg, capsys):
    code, err = run_main([arg], capsys)
    assert code == 2 and "error:" in err


def test_unreachable_hub_id_names_the_fix(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no hub here: the same failure as an unreachable one
    code, err = run_main(["actor_rollout_ref.model.path=some-org/some-model"], capsys)
    assert code == 2
    assert "some-org/some-model" in err and "hub" in err and "actor_rollout_ref.model.path=DIR" in err


@pytest.mark.parametrize("case", ["no_answer_in_train", "null_answer_in_val", "no_data_source", "format_needs_none"])
def test_rows_a_builtin_scorer_cannot_score_stop_before_loading_naming_row_and_key(case, tiny_model_dir, tmp_path,
                                                                                     capsys):
    """Without a reward function each row is scored by its data source's built-in scorer: a row with no
    answer (or no data source) would score 0 all run, so it stops the run first, by row and key."""
    train, val = _rows(), _rows()
    if case == "no_answer_in_train":
        del train[5]["reward_model"]
    elif case == "null_answer_in_val":
        val[2]["reward_model"] = {"ground_truth": None}
    elif case == "no_data_source":
        del train[3]["data_source"]
    else:  # format rewards judge the response alone: no ground truth needed
        for row in train + val:
            row["data_source"] = "format/think"
            del row["reward_model"]
    args = _small_run(tiny_model_dir, tmp_path, train, f"data.val_files={write_parquet(val, tmp_path / 'v.parquet')}",
                      "trainer.total_training_steps=1")
    code, err = run_main(args, capsys)
    if case == "format_needs_none":
        assert code == 0, err
        return
    assert code == 2 and err.count("\n") == 1, err
    expected = {"no_answer_in_train": ("data.train_files: row 5 (data_source='exact_match') has no ground truth",
                                       "reward_model.ground_truth"),
                "null_answer_in_val": ("data.val_files: row 2 (data_source='exact_match') has no ground truth",
                                       "custom_reward_function.path"),
                "no_data_source": ("data.train_files: row 3 has no data_source", "custom_reward_function.path")}[case]
    assert all(part in err for part in expected), err
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_a_reward_function_file_with_rows_missing_their_answer_is_warned_once(tiny_model_dir, tmp_path, capsys, caplog):
    train = _rows()
    train[5]["reward_model"] = {"ground_truth": None}
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(solution_str.strip() == ground_truth)\n")
    args = _small_run(tiny_model_dir, tmp_path, train, f"custom_reward_function.path={reward}",
                      "trainer.total_training_steps=1")
    with caplog.at_level("WARNING", logger="verl.rewards.scorers"):
        code, err = run_main(args, capsys)
    assert code == 0, err
    warned = [r.getMessage() for r in caplog.records if "no ground truth" in r.getMessage()]
    assert warned == ["data.train_files: 1 of 8 rows have no ground truth (row 5): the reward function gets "
                      "ground_truth=None for them, while the other rows have one. Fill in reward_model.ground_truth "
                      "(or a ground_truth / answer / solution column), or drop those rows"]


def test_resuming_under_another_learning_rate_names_the_changed_key(tiny_model_dir, tmp_path, capsys, caplog):
    args = _small_run(tiny_model_dir, tmp_path, _rows(), "trainer.save_freq=1")
    assert run_main(args + ["trainer.total_training_steps=1"], capsys)[0] == 0
    with caplog.at_level("WARNING", logger="verl.trainer.run_loop"):
        code, err = run_main(args + ["trainer.total_training_steps=2", "actor_rollout_ref.actor.optim.lr=1e-3"], capsys)
    assert code == 0, err
    warned = [r.getMessage() for r in caplog.records if "resuming from" in r.getMessage()]
    assert len(warned) == 1 and "1 setting(s) other than those of the run that saved it: " \
                               "actor_rollout_ref.actor.optim.lr: 1e-06 -> 0.001" in warned[0], warned


def test_data_reward_fn_key_gives_the_reward_function_that_column(tiny_model_dir, tmp_path, capsys):
    rows = [{**row, "source": "arith", "data_source": "unused"} for row in _rows()]
    seen = tmp_path / "seen.txt"
    reward = tmp_path / "reward.py"
    reward.write_text(f"def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      f"    open({str(seen)!r}, 'a').write(f'{{data_source}}\\n')\n    return 0.0\n")
    args = _small_run(tiny_model_dir, tmp_path, rows, f"custom_reward_function.path={reward}",
                      "data.reward_fn_key=source", "trainer.total_training_steps=1")
    code, err = run_main(args, capsys)
    assert code == 0, err
    assert set(seen.read_text().split()) == {"arith"}  # before: None for every sample


def test_a_reward_that_scores_every_sample_alike_is_said_after_the_first_five_steps(tiny_model_dir, tmp_path, capsys,
                                                                                     caplog):
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return 0.25  # a reward that never tells answers apart\n")
    args = _small_run(tiny_model_dir, tmp_path, _rows(), f"custom_reward_function.path={reward}",
                      "trainer.total_training_steps=6")
    with caplog.at_level("WARNING", logger="verl.trainer.flat_rewards"):
        code, err = run_main(args, capsys)
    assert code == 0, err
    warned = [r.getMessage() for r in caplog.records if "every sample scored" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("steps 1-5: every sample scored 0.25"), warned



def test_an_output_folder_under_home_is_written_there_and_validating_on_the_train_file_is_said(
        tiny_model_dir, tmp_path, capsys, caplog, monkeypatch):
    """`trainer.default_local_dir='~/runs/x'` (quoted, as the override grammar asks): before, the run wrote
    its checkpoints and model to ./~/runs/x of the current folder. data.val_files naming the training file
    (under another spelling here) went without a word."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    args = [a for a in _small_run(tiny_model_dir, tmp_path, _rows()) if not a.startswith("trainer.default_local_dir")]
    with caplog.at_level("WARNING", logger="verl.trainer.ppo.build"):
        code, err = run_main([*args, "trainer.default_local_dir='~/runs/x'", "trainer.total_training_steps=1",
                              "sft_warmstart.enable=false", "data.val_files=./t.parquet"], capsys)
    assert code == 0, err
    assert (tmp_path / "home" / "runs" / "x" / "huggingface" / "config.json").is_file()
    assert not (tmp_path / "~").exists()
    warned = [r.getMessage() for r in caplog.records if "both read" in r.getMessage()]
    assert warned == [f"data.val_files and data.train_files both read {tmp_path.resolve() / 't.parquet'}: validation "
                      f"then scores prompts the policy trains on, which shows memorising more than learning; give "
                      f"held-out rows (e.g. the test split) as data.val_files"]


def test_a_full_disk_stops_the_run_with_one_line_naming_the_file_and_its_free_space(tiny_model_dir, tmp_path, capsys):
    """Before: a traceback ending in 'OSError: [Errno 28] No space left on device', no file named."""
    import os
    import subprocess

    disk = tmp_path / "full"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        with open(disk / "filler", "wb", buffering=0) as filler:  # 8 KiB left: the start's check passes,
            with pytest.raises(OSError):                            # the run's config.yaml (28 KiB) does not fit
                while True:
                    filler.write(b"x" * 4096)
            filler.truncate(filler.tell() - 8192)
        args = _small_run(tiny_model_dir, tmp_path, _rows(), f"trainer.default_local_dir={disk / 'out'}")
        code, err = run_main(args, capsys)
        assert code == 2
        assert err.startswith(f"error: no space left on the device writing {disk / 'out'}/config.yaml (0.0 MiB free "
                              f"in {disk / 'out'})"), err
        assert len(err.strip().splitlines()) == 1 and "trainer.default_local_dir" in err, err
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)
