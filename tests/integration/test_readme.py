"""The README's commands run as written (the two set-up commands are checked by CI itself)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()

pytestmark = pytest.mark.slow


def bash_blocks(markdown: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", markdown, flags=re.S)


def _run(block: str, cwd: Path) -> subprocess.CompletedProcess:
    script = block.replace("python ", f"{sys.executable} ")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_reward_function_example_runs(tmp_path):
    block = next(b for b in bash_blocks(README) if "examples/rewards/last_number.py" in b)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    done = _run(block, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "data" / "addition" / "train.parquet").exists()
    assert (tmp_path / "outputs" / "run" / "huggingface" / "config.json").exists()
    metrics = (tmp_path / "outputs" / "run" / "metrics.jsonl").read_text()
    assert '"reward_extra/has_number/mean"' in metrics  # extra keys of the returned dict are logged
    assert "the policy has nothing to learn from" in done.stderr  # the untrained model: as the README says


def test_unknown_key_error_is_as_documented(tmp_path):
    documented = re.search(r"\$ (python -m verl\.trainer\.main_ppo .*)\n(error: .*)\n", README)
    done = _run(documented.group(1), tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == documented.group(2)


def test_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    assert type(namespace["trainer"]).__name__ == "PPOTrainer"
