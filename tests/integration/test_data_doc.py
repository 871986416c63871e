"""Every code block of docs/data.md runs, in order, as written."""

import json

import pytest
from helpers import REPO, run_document

pytest.importorskip("datasets")

DOC = REPO / "docs" / "data.md"

pytestmark = pytest.mark.slow


def test_every_code_block_of_the_data_guide_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_document(DOC, tmp_path, min_blocks=6)
    rows = [json.loads(line) for line in (tmp_path / "outputs" / "data-demo" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) == 4  # one epoch of 32 prompts in batches of 8
