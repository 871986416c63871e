"""Every code block of docs/offline.md runs, in order, as written (so the guide cannot rot)."""

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "offline.md"

pytestmark = pytest.mark.slow


def run_bash(block: str, cwd: Path) -> None:
    # `python` in the guide is the interpreter running the tests, with this checkout importable; one
    # thread, as in the test process (two threads per process crawl on a busy 2-core machine).
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{block}\n--- stdout\n{done.stdout[-2000:]}\n--- stderr\n{done.stderr[-3000:]}"


def test_every_code_block_of_the_offline_guide_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```(python|bash)\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert len(blocks) >= 10, "the guide lost its code blocks"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__offline_guide__"}
    root_level = logging.getLogger().level
    try:
        for kind, block in blocks:
            if kind == "python":
                exec(compile(block, f"{DOC.name}:block", "exec"), namespace)
            else:
                run_bash(block, tmp_path)
    finally:
        logging.getLogger().setLevel(root_level)
    assert (tmp_path / "outputs" / "my-dpo" / "huggingface" / "config.json").exists()
