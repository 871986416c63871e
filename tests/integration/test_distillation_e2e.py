"""On-policy distillation end to end through ``main_ppo``: the command of docs/distillation.md,
run on a tiny student and a teacher that is the same network with its logits sharpened tenfold, so
the way toward the teacher is short and the reverse KL visibly falls within the run."""

import json
import os
import re
import shlex
from pathlib import Path

import pytest
import torch

from verl.data import write_parquet
from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[2] / "docs" / "distillation.md"


def _doc_args() -> list[str]:
    """The overrides of the doc's `python -m verl.trainer.main_ppo` command, as the shell passes them."""
    (block,) = [b for b in re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.DOTALL) if "main_ppo" in b]
    words = shlex.split(block.replace("\\\n", " "))
    return [os.path.expandvars(w) for w in words[words.index("verl.trainer.main_ppo") + 1:]]


def _sharpened_copy(student: Path, target: Path, factor: float) -> Path:
    """The student's network with an untied output layer ``factor`` x its embeddings: the same
    tokenizer, a distribution the student can reach by sharpening its own."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(student)
    model.config.tie_word_embeddings = False
    teacher = AutoModelForCausalLM.from_config(model.config)
    teacher.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        teacher.lm_head.weight.copy_(model.model.embed_tokens.weight * factor)
    teacher.save_pretrained(target)
    for name in os.listdir(student):  # the tokenizer files
        if "token" in name or name.endswith(".jinja"):
            (target / name).write_bytes((student / name).read_bytes())
    return target


def test_the_docs_command_distils_the_student_toward_the_teacher(tiny_model_dir, tmp_path, monkeypatch):
    teacher = _sharpened_copy(Path(tiny_model_dir), tmp_path / "teacher", 10.0)
    rows = [{"prompt": [{"role": "user", "content": "say 1:"}], "data_source": "exact_match",
             "reward_model": {"style": "rule", "ground_truth": "1"}} for _ in range(32)]
    monkeypatch.setenv("STUDENT", str(tiny_model_dir))
    monkeypatch.setenv("TEACHER", str(teacher))
    monkeypatch.setenv("TRAIN_FILES", str(write_parquet(rows, tmp_path / "train.parquet")))
    args = _doc_args()
    assert f"distillation.teacher_models.teacher_model.model_path={teacher}" in args
    assert main([*args, f"trainer.default_local_dir={tmp_path / 'out'}", "trainer.progress_bar=false",
                 "trainer.val_before_train=false", "trainer.test_freq=0", "trainer.seed=1"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/distillation/loss" in r]
    assert len(steps) == 20
    for row in steps:
        assert {"actor/distillation/abs_loss", "actor/distillation/pg_clipfrac", "timing_s/teacher"} <= set(row)
        assert row["actor/pg_loss"] == 0  # use_task_rewards=false: the task loss is dropped
    kl = [r["actor/distillation/loss"] for r in steps]
    first, last = sum(kl[:3]) / 3, sum(kl[-3:]) / 3
    assert first > 1.0 and last < 0.6 * first, kl
