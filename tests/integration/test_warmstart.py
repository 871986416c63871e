"""The demo's supervised warm start: the SFT trainer with a stop condition, cached, resumable, and
trained by rank 0 alone under torchrun. Tiny settings: a few steps and a few held-out prompts."""

import json
import os
import re
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


def test_the_direct_answers_stop_at_the_first_step_with_enough_expected_calls_and_no_greedy_one(tmp_path,
                                                                                                    monkeypatch):
    # sft_warmstart.direct_tool_calls: the odds of opening a call are measured after every step and the
    # phase ends at the first step where greedy decoding opens none and the expected share reaches the
    # key; the real rollouts (accuracy, calls) run once, at that step. The random model's odds are tiny
    # (11 byte tokens of <tool_call>) but not 0: a bound of 1e-30 is met at step 1, one of 1 never.
    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path / "cache"))
    base = [*TINY, "data.builtin_task=calculator", "sft_warmstart.max_steps=2", "sft_warmstart.eval_every=2",
            "sft_warmstart.target_accuracy=1", "sft_warmstart.direct_steps=4"]
    for bound, steps in (("1e-30", 1), ("1", 4)):
        warm = warm_start(TrainerConfig.from_overrides([*base, f"sft_warmstart.direct_tool_calls={bound}"]),
                          progress=False)
        checks = _metrics(warm.path.parent, "run-direct")
        odds = [m for m in checks if "val/expected_tool_calls" in m]
        assert warm.direct["steps"] == steps and [m["step"] for m in odds] == list(range(1, steps + 1))
        assert [m["step"] for m in checks if "val/greedy_accuracy" in m] == [steps]  # the rollouts, once
        assert all(0 < m["val/expected_tool_calls"] < 1e-6 and m["val/greedy_opens_call"] == 0 for m in odds)
        assert warm.direct["expected_tool_calls"] == odds[-1]["val/expected_tool_calls"]


def test_the_odds_of_opening_a_call_are_those_of_decoding_it_token_by_token(tiny_model_dir):
    # call_odds scores every held-out prompt (left-padded, of different lengths) with the call's opening
    # in one pass; here each prompt alone, one token at a time: the product of the opening tokens'
    # probabilities, and whether each is the most likely. The model is first taught to open the call
    # after two of the prompts, so that the odds are far from 0 and greedy decoding opens it for some.
    from verl.data import collate_prompts
    from verl.models.loading import load_causal_lm, load_tokenizer
    from verl.trainer.warmstart import CALL_OPENING, call_odds

    tokenizer = load_tokenizer(str(tiny_model_dir))
    model = load_causal_lm(str(tiny_model_dir), dtype=torch.float32).eval()
    opening = tokenizer(CALL_OPENING, add_special_tokens=False)["input_ids"]
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        for text in ("Q: 12*3=\nA: ", "Q: 123*45=\nA: "):
            ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"] + opening])
            model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    texts = ["Q: 12*3=\nA: ", "Q: 123*45=\nA: ", "hi", "Q: 999*99=\nA: <"]
    items = [{"input_ids": tokenizer(t, add_special_tokens=False)["input_ids"], "raw_prompt": t, "data_source": "x",
              "ground_truth": "", "extra_info": {}, "index": i} for i, t in enumerate(texts)]
    with torch.no_grad():
        odds = call_odds(model, collate_prompts(items, tokenizer.pad_token_id), tokenizer)
        probs, greedy = [], []
        for item in items:
            ids, p, best = list(item["input_ids"]), 1.0, True
            for token in opening:
                dist = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].double(), -1)
                p *= dist[token].item()
                best = best and dist.argmax().item() == token
                ids.append(token)
            probs.append(p)
            greedy.append(best)
    assert odds["val/expected_tool_calls"] == pytest.approx(sum(probs) / len(probs), rel=1e-4)
    assert odds["val/greedy_opens_call"] == sum(greedy) / len(greedy)
    assert 1e-6 < odds["val/expected_tool_calls"] and 0 < sum(greedy) < len(greedy), (probs, greedy)


@pytest.mark.parametrize("task", ["addition", "shapes"])
def test_the_gradient_norm_is_clipped_to_sft_warmstart_grad_clip(task, tmp_path, monkeypatch):
    # One step from the built-in model (the text one, and the vision-language one for shapes). AdamW's
    # step does not depend on the gradient's scale, except through eps (1e-8): clipped to a norm of
    # 1e-12, every gradient element is far below eps and the weights barely move; unclipped they move
    # by about lr.
    from verl.models.tiny import builtin_model_path
    from verl.models.tiny_vision import builtin_vl_model_path

    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path / "cache"))
    base = load_file((builtin_vl_model_path() if task == "shapes" else builtin_model_path()) / "model.safetensors")
    moved = {}
    for clip in ("null", "1e-12"):
        warm = warm_start(TrainerConfig.from_overrides([
            *TINY, f"data.builtin_task={task}", "sft_warmstart.max_steps=1", "sft_warmstart.eval_every=1",
            "sft_warmstart.target_accuracy=1", "sft_warmstart.lr=1e-3", f"sft_warmstart.grad_clip={clip}"]),
            progress=False)
        trained = load_file(warm.path / "model.safetensors")
        moved[clip] = max((trained[k].float() - base[k].float()).abs().max().item() for k in base)
    assert moved["null"] > 5e-4 and moved["1e-12"] < 1e-6, moved


def test_a_phase_of_direct_answers_needs_a_task_with_a_tool():
    config = TrainerConfig.from_overrides([*TINY, "sft_warmstart.direct_steps=3"])
    with pytest.raises(ValueError, match=r"sft_warmstart.direct_steps=3 needs a built-in task that uses a tool "
                                         r"\(data.builtin_task=calculator\); 'addition' answers without one"):
        warm_start(config, progress=False)
    # The second phase's own keys with the phase off: said, not ignored.
    for keys, named in ((["sft_warmstart.direct_tool_calls=0.1"], "sft_warmstart.direct_tool_calls=0.1 set"),
                        (["sft_warmstart.direct_lr=0.001", "sft_warmstart.direct_batch_size=8"],
                         "sft_warmstart.direct_lr=0.001, sft_warmstart.direct_batch_size=8 set")):
        config = TrainerConfig.from_overrides([*TINY, "data.builtin_task=calculator", "sft_warmstart.direct_steps=0",
                                               *keys])
        with pytest.raises(ValueError, match=re.escape(named) + " for the phase of direct answers, which "
                                             r"sft_warmstart.direct_steps=0 turns off"):
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
