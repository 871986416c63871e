"""A short ``main_ppo`` run on the tiny model leaves its report in the output folder and names it in the
summary; the installed ``verl`` command compares runs and answers a folder without a run with exit 2."""

import json

import pytest

from tests.integration.helpers import echo_launch
from zygote import run_module
from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow

REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str[:1] == ground_truth)
'''


def _verl(*args):
    return run_module("verl.cli", args, timeout=300)


def test_a_short_run_writes_its_report_and_the_command_compares_runs(tiny_model_dir, tmp_path, capsys):
    assert main([*echo_launch(tiny_model_dir, tmp_path, REWARD_FILE), "trainer.write_report=true"]) == 0
    out = tmp_path / "out"
    report = out / "report.html"
    assert f"Report:         {report}" in capsys.readouterr().out
    page = report.read_text()
    assert 'src="data:image/png;base64,' in page and "http" not in page
    for name in ("reward", "response_length", "entropy", "grad_norm", "timing"):
        assert (out / "report" / f"{name}.png").stat().st_size > 1000
    # No validation and no KL (no reference model) in this run: listed, not an error.
    assert not (out / "report" / "kl.png").exists()
    missing = page.split("Not logged by this run")[1]
    assert "<code>val-core/*</code>" in missing and "<code>actor/kl_loss</code>" in missing

    # A second seed (without a report of its own: trainer.write_report=false), then both side by side.
    seed2 = tmp_path / "seed2"
    assert main([*echo_launch(tiny_model_dir, seed2, REWARD_FILE), "trainer.seed=2"]) == 0
    assert "Report:" not in capsys.readouterr().out
    assert not (seed2 / "out" / "report.html").exists() and not (seed2 / "out" / "report").exists()
    finals = []
    for run in (out, seed2 / "out"):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        finals.append(f"{rows[-1]['critic/score/mean']:.4g}")
    done = _verl("runs", out, seed2 / "out", "-o", tmp_path / "cmp")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == [str(out), str(seed2 / "out")]  # both folders are called "out"
    assert next(line for line in lines if line.startswith("steps")).split() == ["steps", "2", "2"]
    score_row = next(line for line in lines if line.startswith("critic/score/mean final"))
    assert score_row.split()[-2:] == finals
    assert (tmp_path / "cmp" / "runs.html").exists() and (tmp_path / "cmp" / "runs.png").exists()

    done = _verl("report", tmp_path)  # the runs' parent: no metrics.jsonl there, the run folders below it named
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: {tmp_path}: no metrics.jsonl in this folder; expected a run's output "
                                   f"folder (trainer.default_local_dir), which holds metrics.jsonl; the run folders "
                                   f"below it: {out}, {seed2 / 'out'}")
    done = _verl("report", tmp_path / "no-such-run")
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: {tmp_path / 'no-such-run'}: no such folder; give a run's output folder "
                                   f"(trainer.default_local_dir)")
