"""TRL's side of benchmarks/bench_vs_trl.py and benchmarks/parity_trl.py: its own virtualenv (TRL is
installed only for the benchmarks, never into verl's .venv) and the script that runs ``trl.GRPOTrainer``
in it.

The script takes one JSON argument. Besides the run's shape (model, steps, prompts, samples, lr, seed)
it reads the learning settings that parity_trl.py matches against ours, each defaulting to what the
speed benchmark has always run (TRL's own defaults, beta 0): ``loss_type``, ``scale_rewards``, ``beta``,
``use_bias_correction_kl``, ``epsilon``, ``optim``; ``log_clamped_kl``, a bound: also log TRL's per-token
k3 clamped at it as ``kl_clamped``, verl's definition; ``log_history``, a path to write
``trainer.state.log_history`` to (TRL's metrics, one dict per logged step); and for
parity_trl_fixed.py ``rows_jsonl`` (the prompts, verl-layout rows) and ``replay`` (the completions to
take instead of sampling)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TRL_PACKAGES = ["trl", "datasets", "accelerate"]


# ----------------------------------------------------------------------------- TRL's virtualenv

def _torch_pin() -> str:
    """The torch release of this interpreter (e.g. 2.13.0), so that TRL gets the same CPU build."""
    from importlib.metadata import version

    return version("torch").split("+")[0]


def setup_trl_venv(venv: Path, torch_pin: str) -> Path:
    """Create ``venv`` with torch==``torch_pin`` (installed first, and pinned again beside TRL so that
    pip never swaps it for another build), then TRL, datasets and accelerate. Returns its python."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"[setup] creating {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    print(f"[setup] pip install torch=={torch_pin}", flush=True)
    subprocess.run(pip + [f"torch=={torch_pin}"], check=True)
    print(f"[setup] pip install {' '.join(TRL_PACKAGES)} (torch pinned to {torch_pin})", flush=True)
    subprocess.run(pip + TRL_PACKAGES + [f"torch=={torch_pin}"], check=True)
    installed = trl_versions(python)
    print(f"[setup] installed: {installed}", flush=True)
    if installed.get("torch", "").split("+")[0] != torch_pin or "+cu" in installed.get("torch", ""):
        raise SystemExit(f"TRL's virtualenv has torch {installed.get('torch')}, not {torch_pin} (CPU): remove {venv}")
    return python


def trl_versions(python: Path) -> dict[str, str]:
    code = ("import json\nfrom importlib.metadata import version, PackageNotFoundError\nout={}\n"
            "for p in ('torch','transformers','trl','datasets','accelerate'):\n"
            "    try: out[p]=version(p)\n    except PackageNotFoundError: pass\nprint(json.dumps(out))")
    res = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return json.loads(res.stdout) if res.returncode == 0 else {}


def ensure_trl(venv: Path, force: bool) -> Path:
    python = venv / "bin" / "python"
    if force or not python.exists() or "trl" not in trl_versions(python):
        return setup_trl_venv(venv, _torch_pin())
    return python


# ----------------------------------------------------------------------------- the TRL side

TRL_SCRIPT = r'''
"""TRL's side of benchmarks/bench_vs_trl.py and parity_trl.py (written by them; run with TRL's virtualenv)."""
import importlib.util
import json
import sys

import torch

cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])

from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

# The built-in task's own module, loaded from its file (it imports nothing of verl): same prompts,
# same scorer.
spec = importlib.util.spec_from_file_location("verl_builtin_addition", cfg["addition_py"])
task = importlib.util.module_from_spec(spec)
spec.loader.exec_module(task)
if cfg.get("rows_jsonl"):  # a fixed set of rows (parity_trl_fixed.py) instead of all training prompts
    with open(cfg["rows_jsonl"]) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
else:
    rows = task.make_rows("train")
# Both sides get the chat messages and render them with the model's template (add_generation_prompt:
# "Q: 37+48=\nA: "), so both feed the same token ids.
dataset = Dataset.from_dict({
    "prompt": [r["prompt"] for r in rows],
    "ground_truth": [r["reward_model"]["ground_truth"] for r in rows],
    "data_source": [r["data_source"] for r in rows],
})

completions_seen = []


def addition_reward(prompts, completions, ground_truth, data_source, **kwargs):
    completions_seen.append(len(completions))
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]  # chat prompts: message lists
    return [task.compute_score(src, t, gt) for src, t, gt in zip(data_source, texts, ground_truth)]


class CountSteps(TrainerCallback):
    optimizer_steps = 0

    def on_optimizer_step(self, args, state, control, **kwargs):
        CountSteps.optimizer_steps += 1


samples = cfg["prompts_per_step"] * cfg["samples_per_prompt"]
args = GRPOConfig(
    output_dir=cfg["output_dir"],
    per_device_train_batch_size=samples,  # completions: one micro-batch of all 4 x 8
    gradient_accumulation_steps=1,        # -> one optimizer step per generation of 4 prompts x 8
    num_generations=cfg["samples_per_prompt"],
    max_completion_length=cfg["max_new_tokens"],
    temperature=1.0, top_p=1.0, top_k=0,
    beta=cfg.get("beta", 0.0),            # 0: no KL term, no reference model
    use_bias_correction_kl=cfg.get("use_bias_correction_kl", True),  # TRL's default
    loss_type=cfg.get("loss_type", "dapo"), scale_rewards=cfg.get("scale_rewards", "group"),
    epsilon=cfg.get("epsilon", 0.2),
    num_iterations=1,
    learning_rate=cfg["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
    bf16=False, fp16=False, use_cpu=True, gradient_checkpointing=False, disable_dropout=True,
    model_init_kwargs={"dtype": "float32"},
    report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
    max_steps=cfg["steps"], seed=cfg["seed"], dataloader_num_workers=0,
    **({"optim": cfg["optim"]} if cfg.get("optim") else {}),
)
trainer = GRPOTrainer(model=cfg["model"], reward_funcs=addition_reward, args=args, train_dataset=dataset,
                      callbacks=[CountSteps()])

# Stage timers, on this instance only (a perf_counter pair per call): generate() alone, and the whole
# generate-and-score stage (generation, decoding, rewards, advantages). The rest of TRL's step_time
# is the loss's forward and backward.
import time

stage_times = {"generate": [], "generate_and_score": []}


def timed(name, fn):
    def wrapper(*a, **k):
        start = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            stage_times[name].append(time.perf_counter() - start)
    return wrapper


if cfg.get("log_clamped_kl"):
    # verl clamps its per-token k3 at 10 (verl/algorithms/kl.py), TRL does not: log TRL's k3 clamped the same way
    # as "kl_clamped", from the log-probs of TRL's own loss forward (no extra forward; the only call that asks
    # for entropies) and the reference log-probs of the same batch.
    captured = {}
    get_logps, compute_loss = trainer._get_per_token_logps_and_entropies, trainer._compute_loss

    def capture_logps(*a, **k):
        out = get_logps(*a, **k)
        if k.get("compute_entropy"):
            captured["logps"] = out[0].detach()
        return out

    def loss_and_clamped_kl(model, inputs):
        loss = compute_loss(model, inputs)
        x = inputs["ref_per_token_logps"] - captured.pop("logps")
        k3 = (torch.exp(x) - x - 1).clamp(max=cfg["log_clamped_kl"])
        mask = inputs["completion_mask"]
        trainer._metrics["train"]["kl_clamped"].append(((k3 * mask).sum() / mask.sum().clamp(min=1)).item())
        return loss

    trainer._get_per_token_logps_and_entropies = capture_logps
    trainer._compute_loss = loss_and_clamped_kl

if cfg.get("replay"):
    # Fixed completions instead of sampling (parity_trl_fixed.py): each row of a generation takes the next
    # completion listed for its prompt's token ids (EOS included, nothing after it).
    with open(cfg["replay"]) as fh:
        queues = json.load(fh)

    def replay(prompt_ids, *a, **k):
        return [list(queues[json.dumps(list(ids))].pop(0)) for ids in prompt_ids], None

    trainer._generate_single_turn = replay

trainer.model.generate = timed("generate", trainer.model.generate)
trainer._generate_and_score_completions = timed("generate_and_score", trainer._generate_and_score_completions)
trainer.train()
steps = CountSteps.optimizer_steps
per_step = sum(completions_seen) / max(steps, 1)
logged = [h for h in trainer.state.log_history if "completions/mean_length" in h]
if cfg.get("log_history"):
    with open(cfg["log_history"], "w") as fh:
        json.dump(trainer.state.log_history, fh)
print("BENCH_RESULT " + json.dumps({
    "optimizer_steps": steps, "completions_per_step": per_step, "generations": len(completions_seen),
    "completions_per_generation": sorted(set(completions_seen)), "torch_threads": torch.get_num_threads(),
    "response_length": sum(float(h["completions/mean_length"]) for h in logged) / max(len(logged), 1),
    "step_times": [float(h["step_time"]) for h in logged if "step_time" in h], "stage_times": stage_times}),
    flush=True)
'''
