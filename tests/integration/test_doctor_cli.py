"""``verl doctor`` run as a subprocess on this environment (offline: no network)."""

import json
import subprocess

import pytest

from verl.cli import main
from zygote import run_module


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    return run_module(module, args, env={"HF_HUB_OFFLINE": "1"}, timeout=300)


@pytest.mark.slow
def test_doctor_passes_here_and_runs_one_ppo_step():
    done = _run("verl.cli", "doctor")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    step = next(line for line in lines if "ppo step" in line)
    assert step.split()[0] == "OK" and "one PPO step on" in step and "finite" in step
    hub = next(line for line in lines if "hf hub" in line)
    assert "offline mode (HF_HUB_OFFLINE=1)" in hub
    assert not any(line.split()[0] == "FAIL" for line in lines[1:-1] if line.strip())


def test_json_output_parses_and_skip_step_skips():
    done = _run("verl.doctor", "--json", "--skip-step")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["ok"] is True
    names = [check["name"] for check in report["checks"]]
    assert names[:3] == ["python", "torch", "transformers"] and "ppo step" not in names
    assert all(check["status"] in ("OK", "INFO", "WARN") for check in report["checks"])
    assert next(c for c in report["checks"] if c["name"] == "hf hub")["data"]["offline"] is True


def test_doctor_is_listed_in_the_usage(capsys):
    main(["--help"])
    assert "doctor" in capsys.readouterr().out
