"""Run reports from a metrics.jsonl written here: PNGs and one self-contained HTML page, tables whose
values are the ones worked out by hand from the rows, the side-by-side table of two runs, and the
exit-2 line for a folder that holds no run."""

import json
import logging
import re

import pytest

from verl.cli import main as cli_main
from verl.errors import VerlError
from verl.tracking.report import (MAX_BARS, PANELS, compare_runs, load_metrics, run_labels, run_table, runs_table,
                                  stacked_bars, summarize, write_report, write_run_report)

VAL = "val-core/echo/reward/mean@1"


def _train_row(step, score, *, critic=True):
    row = {"step": step, "critic/score/mean": score, "response_length/mean": 10.0 + step,
           "actor/entropy": 1.0 / step, "actor/kl_loss": 0.01 * step, "actor/grad_norm": 2.0 * step,
           "timing_s/gen": 0.5, "timing_s/update_actor": 1.0, "timing_s/step": 1.5 + step}
    if critic:
        row.update({"critic/grad_norm": 3.0, "critic/vf_loss": 0.5 / step, "timing_s/values": 0.25})
    return row


def _write(run_dir, rows):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def _full_run(run_dir):
    """Validation at steps 0 and 2 (rows of their own, as the trainer logs them), a critic, 3 steps."""
    return _write(run_dir, [{"step": 0, VAL: 0.25}, _train_row(1, 0.5), _train_row(2, 0.75),
                            {"step": 2, VAL: 0.5}, _train_row(3, 0.625)])


def _bare_run(run_dir):
    """No critic, no validation."""
    return _write(run_dir, [_train_row(1, 0.25, critic=False), _train_row(2, 0.5, critic=False)])


def _assert_self_contained(page: str):
    assert "<link" not in page and "<script" not in page
    sources = re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', page)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)


def test_a_full_run_gets_every_plot_and_a_self_contained_page(tmp_path):
    run = _full_run(tmp_path / "run")
    path = write_report(run)
    assert path == run / "report.html"
    every = [panel for panel in PANELS if not panel.optional]  # the asynchronous panels are an async run's
    assert {p.name for p in (run / "report").iterdir()} == {f"{panel.name}.png" for panel in every}
    page = path.read_text()
    _assert_self_contained(page)
    assert page.count("<img") == len(every)
    assert "Not logged by this run" in page and "actor/reward_kl_penalty" in page  # the KL it did not use
    assert "async/" not in page  # a synchronous run is not told it lacks them


def test_an_asynchronous_run_gets_its_staleness_idle_and_sync_plots(tmp_path):
    rows = [{**_train_row(step, 0.5), "async/staleness_mean": float(step > 1), "async/staleness_max": float(step > 1),
             "async/queue_depth": 0, "async/in_flight": 1, "async/trainer_idle_frac": 0.1,
             "async/rollout_idle_frac": 0.5, "async/weight_sync_s": 0.01, "async/mismatch_kl": 0.001 * step}
            for step in (1, 2, 3)]
    run = _write(tmp_path / "run", rows)
    write_report(run)
    for name in ("async_staleness", "async_idle", "async_sync"):
        assert (run / "report" / f"{name}.png").stat().st_size > 1000


def test_the_time_panel_of_a_long_run_draws_at_most_max_bars_each_the_mean_of_its_steps():
    # 1,000 steps drew 5,000 bars (~7 s); now 200 per stage, each of 5 consecutive steps.
    rows = [{"step": s, "timing_s/gen": float(s), "timing_s/update_actor": 1.0} for s in range(1, 1001)]
    rows[1]["timing_s/update_actor"] = None  # step 2 skipped the update (a NaN loss logs null): 0 there
    centres, width, heights = stacked_bars(rows, ["timing_s/gen", "timing_s/update_actor"])
    assert MAX_BARS == 200 and len(centres) == 200 and width == pytest.approx(4.0)
    assert centres[:2] == [3.0, 8.0] and centres[-1] == 998.0  # the mean step of 1..5, 6..10, 996..1000
    assert heights["timing_s/gen"][:2] == [3.0, 8.0]
    assert heights["timing_s/update_actor"][:2] == [0.8, 1.0]
    # A short run: one bar per step, as it was drawn before.
    centres, width, heights = stacked_bars(rows[:3], ["timing_s/gen"])
    assert centres == [1.0, 2.0, 3.0] and width == pytest.approx(0.8) and heights == {"timing_s/gen": [1.0, 2.0, 3.0]}


def test_the_table_holds_first_final_and_best_worked_out_by_hand(tmp_path):
    summary = summarize(load_metrics(_full_run(tmp_path / "run")))
    assert summary["steps"] == 3
    assert summary["wall_time_s"] == pytest.approx(2.5 + 3.5 + 4.5)  # the sum of timing_s/step
    score = summary["metrics"]["critic/score/mean"]
    assert (score.first, score.final, score.best, score.points) == (0.5, 0.625, 0.75, 3)
    val = summary["metrics"][VAL]
    assert (val.first, val.final, val.best, val.points) == (0.25, 0.5, 0.5, 2)
    entropy = summary["metrics"]["actor/entropy"]
    assert (entropy.first, entropy.final, entropy.best) == (1.0, pytest.approx(1 / 3), None)
    table = run_table(summary)
    assert table[0] == ["metric", "points", "first", "final", "best"]
    assert ["critic/score/mean", "3", "0.5", "0.625", "0.75"] in table
    assert [VAL, "2", "0.25", "0.5", "0.5"] in table
    assert ["critic/vf_loss", "3", "0.5", "0.1667", "-"] in table
    page = write_report(tmp_path / "run").read_text()
    assert "<td>critic/score/mean</td><td>3</td><td>0.5</td><td>0.625</td><td>0.75</td>" in page


def test_a_run_without_critic_or_validation_plots_what_it_has_and_lists_the_rest(tmp_path):
    run = _bare_run(tmp_path / "run")
    page = write_report(run).read_text()
    _assert_self_contained(page)
    assert (run / "report" / "reward.png").exists() and (run / "report" / "grad_norm.png").exists()
    missing = page.split("Not logged by this run")[1]
    for pattern in ("val-core/*", "val-aux/*", "critic/grad_norm", "response_length/max"):
        assert f"<code>{pattern}</code>" in missing
    assert "critic/score/mean" not in missing
    assert set(summarize(load_metrics(run))["metrics"]) == {"critic/score/mean", "response_length/mean",
                                                           "actor/entropy", "actor/kl_loss", "actor/grad_norm"}


def test_a_panel_the_run_logged_nothing_for_is_not_drawn(tmp_path):
    run = _write(tmp_path / "run", [{"step": 1, "critic/score/mean": 0.5}, {"step": 2, "critic/score/mean": None}])
    write_report(run)
    assert [p.name for p in (run / "report").iterdir()] == ["reward.png"]
    score = summarize(load_metrics(run))["metrics"]["critic/score/mean"]
    assert (score.final, score.points) == (0.5, 1)  # a non-finite value (logged as null) is skipped
    assert summarize(load_metrics(run))["wall_time_s"] is None


def test_rows_merge_per_step_and_a_rewritten_step_keeps_its_later_value(tmp_path):
    run = _write(tmp_path / "run", [{"step": 2, "a": 1.0}, {"step": 1, "a": 0.0}, {"step": 2, "b": 5.0},
                                    {"step": 2, "a": 3.0}])
    assert load_metrics(run) == [{"step": 1, "a": 0.0}, {"step": 2, "a": 3.0, "b": 5.0}]


def test_a_half_written_last_row_is_skipped_and_a_corrupt_row_elsewhere_is_an_error(tmp_path):
    run = _write(tmp_path / "run", [{"step": 1, "a": 1.0}])
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "a"')  # killed mid-write
    assert load_metrics(run) == [{"step": 1, "a": 1.0}]
    (run / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(VerlError, match=r"metrics.jsonl:2: not a JSON row"):
        load_metrics(run)


def test_two_runs_side_by_side(tmp_path):
    full, bare = _full_run(tmp_path / "gae"), _bare_run(tmp_path / "grpo")
    path, text = compare_runs([full, bare], tmp_path / "cmp")
    assert path == tmp_path / "cmp" / "runs.html" and (tmp_path / "cmp" / "runs.png").exists()
    _assert_self_contained(path.read_text())
    table = runs_table({"gae": summarize(load_metrics(full)), "grpo": summarize(load_metrics(bare))})
    assert table[0] == ["", "gae", "grpo"]
    assert ["steps", "3", "2"] in table
    assert ["wall time (s)", "10.5", "6"] in table  # 2.5+3.5+4.5 and 2.5+3.5
    assert ["critic/score/mean final", "0.625", "0.5"] in table
    assert ["critic/score/mean best", "0.75", "0.5"] in table
    assert [f"{VAL} final", "0.5", "-"] in table
    assert ["critic/vf_loss final", "0.1667", "-"] in table
    assert not any(row[0] == "actor/entropy best" for row in table)  # entropy has no "better"
    assert text.splitlines()[0].split() == ["gae", "grpo"]


def test_runs_with_the_same_folder_name_are_told_apart_by_path(tmp_path):
    a, b = _bare_run(tmp_path / "seed1" / "run"), _bare_run(tmp_path / "seed2" / "run")
    path, _ = compare_runs([a, b], tmp_path / "cmp")
    assert str(a) in path.read_text() and str(b) in path.read_text()
    assert run_labels([a, a]) == [f"{a} #1", f"{a} #2"]


def test_the_cli_writes_the_report_and_prints_its_path(tmp_path, capsys):
    run = _full_run(tmp_path / "run")
    assert cli_main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"Report: {run / 'report.html'}" in out and "critic/score/mean" in out
    assert cli_main(["runs", str(run), str(_bare_run(tmp_path / "other")), "-o", str(tmp_path / "cmp")]) == 0
    assert (tmp_path / "cmp" / "runs.html").exists()
    assert cli_main(["report", str(run), str(tmp_path / "other"), "-o", str(tmp_path / "cmp2")]) == 0
    assert (tmp_path / "cmp2" / "runs.html").exists()


@pytest.mark.parametrize("command", ["report", "runs"])
def test_a_folder_without_metrics_exits_2_with_one_line_naming_it(command, tmp_path, capsys):
    good, bad = _full_run(tmp_path / "run"), tmp_path / "empty"
    bad.mkdir()
    assert cli_main([command, str(good), str(bad), "-o", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {bad}: no metrics.jsonl")
    assert "run's output folder" in err
    assert not (tmp_path / "cmp").exists()  # nothing is written before every folder is read
    assert cli_main(["report", str(tmp_path / "missing")]) == 2


def test_the_end_of_run_report_warns_instead_of_failing(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="verl.tracking.report"):
        assert write_run_report(tmp_path) is None
    assert "could not write the run report" in caplog.text
    assert write_run_report(_bare_run(tmp_path / "run")) == tmp_path / "run" / "report.html"
