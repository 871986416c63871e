"""Every code block of docs/distributed.md runs as written: one process, then torchrun with 2 CPU ranks."""

import json

import pytest
from helpers import REPO, run_document

DOC = REPO / "docs" / "distributed.md"

pytestmark = pytest.mark.slow


def test_every_code_block_of_the_distributed_guide_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    run_document(DOC, tmp_path, min_blocks=3)
    one = [json.loads(line) for line in (tmp_path / "outputs/one-process/metrics.jsonl").read_text().splitlines()]
    two = [json.loads(line) for line in (tmp_path / "outputs/two-ranks/metrics.jsonl").read_text().splitlines()]
    steps = [(r["step"], r["critic/score/mean"]) for r in one if "critic/score/mean" in r]
    assert steps and steps == [(r["step"], r["critic/score/mean"]) for r in two if "critic/score/mean" in r]
