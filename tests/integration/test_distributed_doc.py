"""Every code block of docs/distributed.md runs as written: one process, torchrun with 2 CPU ranks and
with two launchers as two "nodes" (c10d rendezvous), and Ray: a local Ray with 2 CPU ranks, a critic on
a pool of its own, and a job submitted to a two-node cluster (``ray start --head`` and a second
``ray start --address``, one CPU each) with a plain run beside it that joins it (stopped again with
``ray stop``, which stops every Ray of this user)."""

import pytest
from helpers import REPO, run_document
from rl_compare import assert_same_metrics, step_metrics

DOC = REPO / "docs" / "distributed.md"

pytestmark = pytest.mark.slow


def test_every_code_block_of_the_distributed_guide_runs(tmp_path, monkeypatch):
    pytest.importorskip("ray", reason="the ray extra (bash scripts/setup.sh --test installs it)")
    monkeypatch.chdir(tmp_path)
    for key, value in {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    run_document(DOC, tmp_path, min_blocks=3)
    one = step_metrics(tmp_path / "outputs/one-process")
    assert len(one) == 2 and one[1]["actor/entropy"] > 0
    # The same 2 steps, metric for metric, on 2 ranks, 2 "nodes", 2 Ray actors and a 2-node Ray cluster.
    for placement in ("two-ranks", "two-nodes", "ray-two-ranks", "ray-job"):
        assert_same_metrics(one, step_metrics(tmp_path / "outputs" / placement))
    assert (tmp_path / "outputs/ray-critic-pool/huggingface/model.safetensors").exists()
    # a plain run next to the started cluster joined it (starting a Ray of its own there is refused by Ray)
    assert (tmp_path / "outputs/ray-joined/huggingface/model.safetensors").exists()
