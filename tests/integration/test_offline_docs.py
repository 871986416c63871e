"""Every code block of docs/offline.md runs, in order, as written (so the guide cannot rot)."""

import pytest
from helpers import REPO, run_document

DOC = REPO / "docs" / "offline.md"

pytestmark = pytest.mark.slow


def test_every_code_block_of_the_offline_guide_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_document(DOC, tmp_path)
    assert (tmp_path / "outputs" / "my-dpo" / "huggingface" / "config.json").exists()
