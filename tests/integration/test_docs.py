"""Every code block of the tutorials runs, in order, as written (so the docs cannot rot)."""

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = ["docs/tutorial.md", "docs/tutorial.zh.md"]

pytestmark = pytest.mark.slow


def code_blocks(markdown: str) -> list[tuple[str, str]]:
    return re.findall(r"```(python|bash)\n(.*?)```", markdown, flags=re.S)


def run_bash(block: str, cwd: Path) -> None:
    script = block.replace(".venv/bin/python", sys.executable)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, f"{block}\n--- stdout\n{done.stdout[-2000:]}\n--- stderr\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_code_block_runs(doc, tmp_path, monkeypatch):
    blocks = code_blocks((REPO / doc).read_text())
    assert len(blocks) >= 10, "the tutorial lost its code blocks"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    namespace: dict = {"__name__": "__tutorial__"}
    root_level = logging.getLogger().level
    try:
        for kind, block in blocks:
            if kind == "python":
                exec(compile(block, f"{doc}:block", "exec"), namespace)
            elif "scripts/setup.sh" in block:
                run_bash(block, REPO)  # the README's set-up: idempotent, runs in the repository
            else:
                run_bash(block, tmp_path)
    finally:
        logging.getLogger().setLevel(root_level)


def _code_without_comments(doc: str) -> list[str]:
    return [re.sub(r"\s*#.*", "", block).strip() for _, block in code_blocks((REPO / doc).read_text())]


def test_the_chinese_and_english_tutorials_run_the_same_code():
    assert _code_without_comments(DOCS[0]) == _code_without_comments(DOCS[1])
