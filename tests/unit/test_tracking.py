"""verl.tracking: metrics.jsonl rows, console lines, and the errors for unknown or missing loggers."""

import json
import logging
import math

import pytest

from verl.errors import VerlError
from verl.tracking import LOGGER_NAMES, Tracker


def read_rows(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_jsonl_backend_writes_one_json_object_per_log_call_with_its_step(tmp_path):
    tracker = Tracker(["jsonl"], tmp_path)
    tracker.log({"actor/pg_loss": 0.5, "reward/mean": 1}, step=1)
    tracker.log({"actor/pg_loss": 0.25}, step=2)
    tracker.close()
    assert read_rows(tmp_path / "metrics.jsonl") == [
        {"step": 1, "actor/pg_loss": 0.5, "reward/mean": 1.0},
        {"step": 2, "actor/pg_loss": 0.25},
    ]


def test_metrics_jsonl_is_written_once_per_step_whichever_loggers_are_named(tmp_path):
    tracker = Tracker(["console", "jsonl"], tmp_path, progress_bar=True)
    tracker.log({"x": 1.0}, step=1)
    tracker.close()
    assert len(read_rows(tmp_path / "metrics.jsonl")) == 1


def test_non_finite_values_become_null_so_every_row_stays_valid_json(tmp_path):
    tracker = Tracker("console", tmp_path)
    tracker.log({"a": math.nan, "b": math.inf, "c": 2.0}, step=4)
    tracker.close()
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert read_rows(tmp_path / "metrics.jsonl") == [{"step": 4, "a": None, "b": None, "c": 2.0}]


def test_a_resumed_run_appends_to_the_existing_metrics_file(tmp_path):
    for step in (1, 2):
        tracker = Tracker([], tmp_path)
        tracker.log({"x": float(step)}, step=step)
        tracker.close()
    assert [row["step"] for row in read_rows(tmp_path / "metrics.jsonl")] == [1, 2]


def test_console_prints_one_line_per_step_unless_a_progress_bar_is_shown(tmp_path, capsys):
    for progress_bar, expected in ((False, "step:3 - a:2 b:0.5\n"), (True, "")):
        tracker = Tracker(["console"], tmp_path / str(progress_bar), progress_bar=progress_bar)
        tracker.log({"b": 0.5, "a": 2.0}, step=3)
        tracker.close()
        assert capsys.readouterr().out == expected


def test_verls_file_logger_is_the_metrics_jsonl_and_says_where_it_is(tmp_path, caplog):
    # verl's launch scripts name it: trainer.logger='["console","wandb","file"]'
    with caplog.at_level(logging.WARNING):
        tracker = Tracker(["console", "file"], tmp_path / "run")
    tracker.log({"x": 1.0}, step=1)
    tracker.close()
    assert read_rows(tmp_path / "run" / "metrics.jsonl") == [{"step": 1, "x": 1.0}]
    assert f"verl's 'file' logger: the metrics go to {tmp_path / 'run' / 'metrics.jsonl'}" in caplog.text


def test_unknown_logger_raises_and_lists_the_valid_names(tmp_path):
    with pytest.raises(VerlError) as err:
        Tracker(["console", "mlflow"], tmp_path)
    assert "mlflow" in str(err.value)
    assert all(name in str(err.value) for name in LOGGER_NAMES)


def test_steps_in_order_hold_later_steps_behind_metrics_still_to_come(tmp_path):
    from verl.tracking.tracker import StepsInOrder

    tracker = StepsInOrder(Tracker([], tmp_path))
    tracker.log({"a": 1.0}, 1)
    tracker.expect(1)  # a validation of step 1, answered later
    tracker.log({"a": 2.0}, 2)
    tracker.log_generations([{"prompt": "p", "response": "r", "score": 1.0}], 2)
    tracker.expect(2)
    tracker.log({"a": 3.0}, 3)
    steps = lambda: [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps() == [1]
    tracker.log({"val": 0.5}, 1)  # what step 1 waited for goes out at once
    tracker.arrived(1)
    assert steps() == [1, 1, 2]  # then step 2, up to the next step still open
    tracker.log({"val": 0.7}, 2)
    tracker.arrived(2)
    assert steps() == [1, 1, 2, 2, 3] and (tmp_path / "val_generations.jsonl").exists()
    tracker.expect(3)  # a run that fails with a validation out still keeps the metrics of its later steps
    tracker.log({"a": 4.0}, 4)
    tracker.close(failed=True)
    assert steps() == [1, 1, 2, 2, 3, 4]
