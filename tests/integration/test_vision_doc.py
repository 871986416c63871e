"""Every code block of docs/vision.md runs, in order, as written."""

import json

import pytest
from helpers import REPO, run_document

DOC = REPO / "docs" / "vision.md"

pytestmark = pytest.mark.slow


def test_every_code_block_of_the_vision_guide_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = run_document(DOC, tmp_path, min_blocks=3)
    rows = [json.loads(line) for line in (tmp_path / "outputs" / "dots" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) == 2 and any("val-core/exact_match/reward/mean@1" in r for r in rows)
    assert (tmp_path / "outputs" / "dots" / "huggingface" / "preprocessor_config.json").exists()
    assert namespace["out"].shape[1] > namespace["inputs"]["input_ids"].shape[1]
    assert namespace["positions"].shape[0] == 3
