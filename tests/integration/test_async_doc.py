"""Every code block of docs/async.md runs, in order, as written."""

import pytest
from helpers import REPO, run_document

DOC = REPO / "docs" / "async.md"

pytestmark = pytest.mark.slow


def test_every_code_block_of_the_async_guide_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = run_document(DOC, tmp_path, min_blocks=2)
    assert len(namespace["steps"]) == 4
    for run in ("one-step-off", "dapo-one-step-off", "fully-async", "rollout-ranks", "rollout-node", "v1-separate-async"):
        assert (tmp_path / "outputs" / run / "huggingface" / "config.json").exists()
