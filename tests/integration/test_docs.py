"""Every code block of the tutorials runs, in order, as written (so the docs cannot rot).

The Chinese tutorial is the English one translated: its code blocks are checked to be the same
programs (the same Python tokens, comments aside; the same shell commands), so the English run
proves that both run, and the suite runs the blocks once."""

import io
import json
import math
import re
import tokenize

import pytest
from helpers import REPO, code_blocks, run_document

DOCS = ["docs/tutorial.md", "docs/tutorial.zh.md"]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("doc", DOCS[:1])
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


def _program(kind: str, block: str):
    """What a block runs: its Python tokens without comments and line breaks inside brackets, or its
    shell lines without comments."""
    if kind == "python":
        tokens = tokenize.generate_tokens(io.StringIO(block).readline)
        return [(t.type, t.string) for t in tokens if t.type not in (tokenize.COMMENT, tokenize.NL)]
    return [re.sub(r"(^|\s+)#.*", "", line).rstrip() for line in block.splitlines()]


def _programs(doc: str) -> list:
    return [(kind, _program(kind, block)) for kind, block in code_blocks((REPO / doc).read_text())]


def test_the_chinese_and_english_tutorials_run_the_same_code():
    english, chinese = _programs(DOCS[0]), _programs(DOCS[1])
    assert len(english) == len(chinese) >= 10
    for i, (en, zh) in enumerate(zip(english, chinese)):
        assert en == zh, f"code block {i} of {DOCS[1]} differs from {DOCS[0]}'s beyond its comments"


def test_the_program_check_sees_a_changed_string_but_not_a_changed_comment():
    base = 'x = "a # b"  # note\n'
    assert _program("python", base) == _program("python", 'x = "a # b"  # 注释\n')
    assert _program("python", base) != _program("python", 'x = "a # c"  # note\n')
    assert _program("bash", "run --n 2  # note") == _program("bash", "run --n 2  # 注释")
    assert _program("bash", "run --n 2") != _program("bash", "run --n 3")
