"""Every code block of the tutorials runs, in order, as written (so the docs cannot rot)."""

import json
import math
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
    ns = run_document(REPO / doc, tmp_path, bash_cwd=lambda block: REPO if "scripts/setup.sh" in block else tmp_path)
    # What the tutorial promises, beyond "it ran": finite PPO losses, the model in the dtype asked
    # for, a generated string, the run folders, and the launch's metrics for every step.
    assert {"policy_loss", "value_loss"} <= set(ns["loss_dict"])
    assert all(math.isfinite(float(v)) for v in ns["loss_dict"].values()), ns["loss_dict"]
    assert next(ns["actor_model"].parameters()).dtype == ns["torch"].bfloat16
    assert isinstance(ns["response"], str)
    assert (tmp_path / "checkpoints" / "custom").is_dir() and (tmp_path / "runs" / "ppo").is_dir()
    rows = [json.loads(line) for line in (tmp_path / "outputs/quickstart/metrics.jsonl").read_text().splitlines()]
    steps = {int(row["step"]) for row in rows}  # (step 0: the held-out scores before training)
    assert set(range(1, 21)) <= steps and max(steps) == 20, sorted(steps)


def _code_without_comments(doc: str) -> list[str]:
    return [re.sub(r"\s*#.*", "", block).strip() for _, block in code_blocks((REPO / doc).read_text())]


def test_the_chinese_and_english_tutorials_run_the_same_code():
    assert _code_without_comments(DOCS[0]) == _code_without_comments(DOCS[1])
