"""Every code block of docs/vision.md runs, in order, as written."""

import pytest
from helpers import REPO, run_document

DOC = REPO / "docs" / "vision.md"

pytestmark = pytest.mark.slow


def test_every_code_block_of_the_vision_guide_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = run_document(DOC, tmp_path, min_blocks=1)
    assert namespace["out"].shape[0] == 1 and namespace["out"].shape[1] > namespace["inputs"]["input_ids"].shape[1]
    assert namespace["positions"].shape[0] == 3
    assert (tmp_path / "tiny-qwen2-vl" / "preprocessor_config.json").exists()
