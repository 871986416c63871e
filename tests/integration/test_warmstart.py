"""The demo's supervised warm start: the SFT trainer with a stop condition, cached, resumable, and
trained by rank 0 alone under torchrun. Tiny settings: a few steps and a few held-out prompts."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from helpers import REPO
from zygote import run_torchrun
from verl.config import TrainerConfig
from verl.distributed.process_group import alone
from verl.trainer.warmstart import warm_start

TINY = ["sft_warmstart.eval_samples=8", "sft_warmstart.batch_size=16"]


def _metrics(folder, run="run"):
    path = folder / run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_warm_start_stops_at_its_target_accuracy_and_is_cached():
    # A target of 0 is reached at the first check (step 2): the run stops there, not at max_steps.
    config = TrainerConfig.from_overrides([*TINY, "sft_warmstart.max_steps=50", "sft_warmstart.eval_every=2",
                                           "sft_warmstart.target_accuracy=0"])
    first = warm_start(config, progress=False)
    assert (first.steps, first.cached) == (2, False)
    assert (first.path / "config.json").exists() and (first.path / "tokenizer.json").exists()
    folder = first.path.parent
    checks = [m for m in _metrics(folder) if "val/sampled_accuracy" in m]
    assert [m["step"] for m in checks] == [2]  # validated every eval_every steps, not before training
    assert json.loads((folder / "warmstart.json").read_text())["steps"] == 2
    again = warm_start(config, progress=False)
    assert again.cached and again.path == first.path and again.steps == 2


def test_an_edit_to_a_builtin_task_makes_its_rows_and_trains_its_warm_start_anew(tmp_path, monkeypatch):
    # What is cached from a task (its parquet rows, its warm start) is keyed by the tasks' sources: an
    # edit, even one to a helper another task shares (calculator's rows are made by addition's code),
    # never serves the old rows or a warm start trained on them, within one version too.
    import shutil

    from verl.data import tasks
    from verl.trainer import warmstart
    from verl.trainer.ppo.build import builtin_task_files

    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path / "cache"))
    config = TrainerConfig.from_overrides(["data.builtin_task=calculator"])
    key, rows = warmstart._cache_key(config), builtin_task_files("calculator")
    copy = tmp_path / "tasks"
    shutil.copytree(os.path.dirname(tasks.__file__), copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(tasks, "__file__", str(copy / "__init__.py"))
    assert (warmstart._cache_key(config), builtin_task_files("calculator")) == (key, rows)  # the same sources
    shared = copy / "addition.py"
    shared.write_text(shared.read_text().replace('"index": i,', '"index": i, "edited": True,'))
    assert warmstart._cache_key(config) != key
    assert os.path.dirname(builtin_task_files("calculator")[0]) != os.path.dirname(rows[0])


def test_a_warm_start_that_misses_its_target_trains_max_steps():
    config = TrainerConfig.from_overrides([*TINY, "sft_warmstart.max_steps=5", "sft_warmstart.eval_every=2",
                                           "sft_warmstart.target_accuracy=1"])
    warm = warm_start(config, progress=False)
    assert warm.steps == 5 and warm.accuracy < 1
    checks = [m["step"] for m in _metrics(warm.path.parent) if "val/sampled_accuracy" in m]
    assert checks == [2, 4, 5]  # and once more after the last step


def test_the_calculator_warm_start_ends_with_a_phase_of_direct_answers(tmp_path, monkeypatch):
    # sft_warmstart.direct_steps: after the tool conversations (first phase, here 2 steps), steps on
    # answers without the tool, a seeded share of rows still calling it, from the first phase's model.
    from verl.trainer.warmstart import DirectAnswerPhase

    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path / "cache"))
    config = TrainerConfig.from_overrides([*TINY, "data.builtin_task=calculator", "sft_warmstart.max_steps=2",
                                           "sft_warmstart.eval_every=2", "sft_warmstart.target_accuracy=1",
                                           "sft_warmstart.direct_steps=3", "sft_warmstart.direct_tool_share=0.25"])
    warm = warm_start(config, progress=False)
    folder = warm.path.parent
    assert (warm.steps, warm.direct["steps"], warm.cached) == (2, 3, False)
    for key in ("greedy_accuracy", "greedy_tool_calls", "sampled_accuracy", "sampled_tool_calls"):
        assert 0 <= warm.direct[key] <= 1
    # The first phase's model is kept (a resumed second phase starts from it); the result is the second's.
    first, second = (load_file(folder / name / "model.safetensors") for name in ("tool-model", "model"))
    assert first.keys() == second.keys() and any(not torch.equal(first[k], second[k]) for k in first)
    checks = [m["step"] for m in _metrics(folder) if "val/sampled_accuracy" in m]
    direct_checks = [m for m in _metrics(folder, "run-direct") if "val/greedy_tool_calls" in m]
    assert checks == [2] and [m["step"] for m in direct_checks] == [3]  # the second phase: one check, at its end
    again = warm_start(config, progress=False)
    assert again.cached and again.direct == warm.direct
    # Stopped during the second phase (no result yet): the next run does not train the first again.
    (folder / "warmstart.json").unlink()
    first_metrics = _metrics(folder)
    redone = warm_start(config, progress=False)
    assert not redone.cached and (redone.steps, redone.direct["steps"]) == (2, 3) and _metrics(folder) == first_metrics

    # Its rows: a quarter of the training rows (seeded: the same ones every time) keep the conversation
    # with the tool, the others answer at once.
    with alone():
        phase = DirectAnswerPhase(config, tmp_path / "entry", progress=False, start=folder / "tool-model")
        rows = phase.rows()[0]
    with_tool = [i for i, row in enumerate(rows) if "<tool_call>" in row["messages"][1]["content"]]
    assert len(rows) == 4000 and len(with_tool) == 1000
    assert all(len(rows[i]["messages"]) == 4 for i in with_tool)
    direct = next(row["messages"] for i, row in enumerate(rows) if i not in with_tool)
    a, b = direct[0]["content"].rstrip("=").split("*")
    assert direct[1:] == [{"role": "assistant", "content": str(int(a) * int(b))}]
    with alone():
        assert [i for i, row in enumerate(DirectAnswerPhase(config, tmp_path / "entry2", progress=False,
                                                            start=folder / "tool-model").rows()[0])
                if len(row["messages"]) == 4] == with_tool


def test_a_phase_of_direct_answers_needs_a_task_with_a_tool():
    config = TrainerConfig.from_overrides([*TINY, "sft_warmstart.direct_steps=3"])
    with pytest.raises(ValueError, match=r"sft_warmstart.direct_steps=3 needs a built-in task that uses a tool "
                                         r"\(data.builtin_task=calculator\); 'addition' answers without one"):
        warm_start(config, progress=False)


def test_an_interrupted_warm_start_resumes_from_its_last_step(tmp_path):
    """Ctrl-C during the demo's warm start keeps the step it reached (a checkpoint in the cache entry);
    the same command resumes there instead of starting over."""
    args = ["-m", "verl.trainer.main_ppo", *TINY, "sft_warmstart.max_steps=40", "sft_warmstart.eval_every=40",
            "sft_warmstart.target_accuracy=1", "trainer.total_training_steps=1",
            f"trainer.default_local_dir={tmp_path / 'out'}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cache = tmp_path / "cache"
    env["VERL_CACHE_DIR"] = str(cache)
    job = subprocess.Popen([sys.executable, *args], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    folder = None
    while time.monotonic() < deadline and job.poll() is None:
        entries = [p for p in (cache / "warmstart").glob("addition-*") if p.is_dir()] if cache.exists() else []
        folder = entries[0] if entries else None
        if folder is not None and len(_metrics(folder)) >= 3:
            break
        time.sleep(0.2)
    assert job.poll() is None, job.communicate()[1][-2000:]
    job.send_signal(signal.SIGINT)
    out, err = job.communicate(timeout=120)
    assert job.returncode == 130, err[-2000:]
    assert "its checkpoint saved; run the same command again to resume" in err
    stopped = [p.name for p in (folder / "run").glob("global_step_*")]
    assert len(stopped) == 1, stopped
    step = int(stopped[0].split("_")[-1])
    assert 3 <= step < 40 and not (folder / "warmstart.json").exists()

    done = subprocess.run([sys.executable, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"Resumed from {folder / 'run' / stopped[0]} at step {step}" in done.stdout
    assert "SFT warm start done: 40 steps" in done.stdout and "RL: 1 steps" in done.stdout
    # The resumed run logged the steps after the checkpoint once each.
    steps = [m["step"] for m in _metrics(folder) if "train/loss" in m]
    assert steps == list(range(1, 41)), steps


@pytest.mark.slow
def test_under_torchrun_rank_0_trains_the_warm_start_alone(tmp_path):
    """Two ranks run the demo: rank 0 trains and caches the warm start by itself (no process group
    yet: a world of one), the other waits at the barrier, and both train RL from its result."""
    done = run_torchrun(["--standalone", "--nproc_per_node=2", "-m", "verl.trainer.main_ppo", *TINY,
                         "sft_warmstart.max_steps=4", "sft_warmstart.eval_every=2", "sft_warmstart.target_accuracy=0",
                         "trainer.total_training_steps=1", f"trainer.default_local_dir={tmp_path / 'out'}"],
                        env={"VERL_CACHE_DIR": str(tmp_path / "cache")}, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("SFT warm start done: 2 steps") == 1  # trained once, by rank 0
    assert "RL: 1 steps" in done.stdout
    (entry,) = [p for p in (tmp_path / "cache" / "warmstart").iterdir() if p.is_dir()]
    assert json.loads((entry / "warmstart.json").read_text())["steps"] == 2
