"""Every code block of the tutorials runs, in order, as written (so the docs cannot rot)."""

import re

import pytest
from helpers import REPO, code_blocks, run_document

DOCS = ["docs/tutorial.md", "docs/tutorial.zh.md"]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("doc", DOCS)
def test_every_code_block_runs(doc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    # The README's set-up line is idempotent and runs in the repository; everything else in tmp_path.
    run_document(REPO / doc, tmp_path, bash_cwd=lambda block: REPO if "scripts/setup.sh" in block else tmp_path)


def _code_without_comments(doc: str) -> list[str]:
    return [re.sub(r"\s*#.*", "", block).strip() for _, block in code_blocks((REPO / doc).read_text())]


def test_the_chinese_and_english_tutorials_run_the_same_code():
    assert _code_without_comments(DOCS[0]) == _code_without_comments(DOCS[1])
