"""Every code block of docs/rewards.md runs, in order, as written."""

import pytest
from helpers import REPO, run_document

DOC = REPO / "docs" / "rewards.md"

pytestmark = pytest.mark.slow


def test_every_code_block_of_the_rewards_guide_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = run_document(DOC, tmp_path, min_blocks=8)
    assert "reward/judge/mean" in namespace["step"]
    for run in ("one-reward", "three-rewards", "val-at-n"):
        assert (tmp_path / "outputs" / run / "huggingface" / "config.json").exists()
