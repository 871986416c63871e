"""Every code block of docs/distributed.md runs as written: one process, torchrun with 2 CPU ranks, and
Ray: a local Ray with 2 CPU ranks, a critic on a pool of its own, and a job submitted to a cluster
started with ``ray start --head`` and a plain run beside it that joins it (stopped again with
``ray stop``, which stops every Ray of this user)."""

import json

import pytest
from helpers import REPO, run_document

DOC = REPO / "docs" / "distributed.md"

pytestmark = pytest.mark.slow


def test_every_code_block_of_the_distributed_guide_runs(tmp_path, monkeypatch):
    pytest.importorskip("ray", reason="the ray extra (bash scripts/setup.sh --test installs it)")
    monkeypatch.chdir(tmp_path)
    for key, value in {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    run_document(DOC, tmp_path, min_blocks=3)
    one = [json.loads(line) for line in (tmp_path / "outputs/one-process/metrics.jsonl").read_text().splitlines()]
    two = [json.loads(line) for line in (tmp_path / "outputs/two-ranks/metrics.jsonl").read_text().splitlines()]
    steps = [(r["step"], r["critic/score/mean"]) for r in one if "critic/score/mean" in r]
    assert steps and steps == [(r["step"], r["critic/score/mean"]) for r in two if "critic/score/mean" in r]
    # Ray's blocks: the 2-rank run equals the others; the critic's own pool and the submitted job ran.
    ray = [json.loads(line) for line in (tmp_path / "outputs/ray-two-ranks/metrics.jsonl").read_text().splitlines()]
    assert steps == [(r["step"], r["critic/score/mean"]) for r in ray if "critic/score/mean" in r]
    assert (tmp_path / "outputs/ray-critic-pool/huggingface/model.safetensors").exists()
    assert (tmp_path / "outputs/ray-job/huggingface/model.safetensors").exists()
    # a plain run next to the started cluster joined it (starting a Ray of its own there is refused by Ray)
    assert (tmp_path / "outputs/ray-joined/huggingface/model.safetensors").exists()
