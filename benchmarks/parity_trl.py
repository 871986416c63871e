"""Learning-curve parity with TRL: the same GRPO runs here and in ``trl.GRPOTrainer``, 3 seeds each.

    python benchmarks/parity_trl.py                    # 3 settings x 3 seeds x 2 sides, 300 steps
    python benchmarks/parity_trl.py --settings grpo --seeds 1 2 --steps 100
    python benchmarks/parity_trl.py --analyse-only     # recompute tables, verdict and plot from the runs kept

Both sides train one model folder, the demo's supervised warm start (``verl.trainer.warmstart``, the
built-in Qwen2 of ~0.8M parameters after SFT on 2-digit addition, sampled accuracy ~0.4; trained and
cached on first use), copied to ``--workdir``. The task is the built-in addition task
(``verl/data/tasks/addition.py``: its training prompts, rendered by the folder's chat template as
``Q: 37+48=\\nA: ``, and its exact-match ``compute_score``; TRL loads the module by file path). One step =
16 prompts x 8 samples, at most 6 new tokens, one optimizer step over all 128 samples. Ours is
``python -m verl.trainer.main_ppo key=value ...`` (every key the demo sets given explicitly), TRL's the
script of ``trl_side.py`` in TRL's own virtualenv. Each run is a separate process with 1 thread;
``--jobs`` of them at a time.

Matched definitions (ours: this repository; TRL: trl 1.16.0, ``trl/trainer/grpo_trainer.py`` as GT, and
``grpo_config.py`` as GC):

* Advantage, setting ``grpo`` and ``grpo_seqmean``: (r - group mean) / (group std + eps), std unbiased
  (Bessel) on both: ours ``_group_stats`` / ``compute_grpo_outcome_advantage`` in
  verl/algorithms/advantages.py, eps 1e-6 (fixed); TRL GT:2765-2787 with ``nanstd`` (trl/trainer/utils.py:1021,
  Bessel-corrected), eps 1e-4 (fixed). The eps differ and neither is configurable; for 0/1 rewards in groups
  of 8 a non-zero std is at least sqrt(1/8) = 0.354, so the two advantages differ by at most 0.03 %,
  and an all-equal group gets advantage 0 on both. Setting ``dr_grpo``: r - group mean on both
  (ours ``algorithm.norm_adv_by_std_in_grpo=false``, TRL ``scale_rewards="none"``, GT:2786).
* Loss aggregation: ``grpo``: token-mean over the batch (ours ``loss_agg_mode=token-mean``, TRL
  ``loss_type="dapo"``, GT:3168-3172: normaliser = tokens of the generation batch, which is the batch here,
  one process, no accumulation). ``grpo_seqmean``: mean over sequences of each sequence's token mean (ours
  ``seq-mean-token-mean``, TRL ``"grpo"``, GT:3153-3157). ``dr_grpo``: token sum / (sequences x 6), the
  constant max length (ours ``seq-mean-token-sum-norm`` with norm_len = data.max_response_length, TRL
  ``"dr_grpo"`` with ``max_completion_length``, GT:3163-3167).
* Surrogate: per-token clipped ratio, epsilon 0.2 both ways (ours ``clip_ratio=0.2``, TRL ``epsilon=0.2``,
  GT:3112-3119). Ours also has dual-clip (c = 3, not switchable); it acts only on ratios above 3 with A < 0.
  Every update here is on-policy (one epoch, one mini-batch; TRL ``num_iterations=1``,
  ``steps_per_generation=1``), so the old log-probs are the current ones detached on both (ours
  ``Actor.ppo_loss`` when the batch has no ``old_log_probs``; TRL GT:3066): the ratio is exactly 1 and
  no clip ever acts; the gradient is -A grad log pi on both.
* KL: ``grpo``: a KL loss of 0.001 x k3 (ours ``use_kl_loss=true, kl_loss_coef=0.001,
  kl_loss_type=low_var_kl``; TRL ``beta=0.001``, GT:3098-3102, added to the per-token loss, GT:3149-3150),
  aggregated like the policy loss on both; the reference is the starting model. Its gradient is that of k3
  itself, (1 - pi_ref/pi) grad log pi, on both: TRL's default ``use_bias_correction_kl=True`` (GC:972,
  GT:3104-3105) multiplies k3 by the (differentiable) ratio, which adds k3 grad log pi, so it is set False.
  One difference stays, by design: ours (as verl) clamps each token's k3 at 10 (verl/algorithms/kl.py
  ``kl_penalty``), TRL does not. Here 0.1-0.2 % of the tokens pass 10 by the end (up to 125), which lowers our
  mean KL by 0.01-0.03; their KL gradient is 0 on our side (0.1 % of the tokens, x 0.001: the gradient norm
  of the same batch moves by 3e-4 relative). So TRL's script also logs its k3 clamped at 10
  (``kl_clamped``, from the log-probs of its own loss forward; trl_side.py) and that is compared with ours
  ``actor/kl_loss`` (the KL term as aggregated: token-mean here); TRL's own ``kl`` (not clamped, token mean,
  GT:3268) is printed and drawn beside it. ``grpo_seqmean`` and ``dr_grpo``: no KL term and no reference
  model on either (beta 0, the Dr. GRPO paper's setting).
* Sampling: temperature 1, top-p 1, no top-k (ours top_k=-1, TRL top_k=0), at most 6 new tokens; a
  response ends at its first EOS, which is part of it (ours ``response_mask_from_ids`` in
  verl/rollout/base.py, TRL GT:1880-1886); truncated responses are kept and scored (TRL
  ``mask_truncated_completions=False``); the reward is ``compute_score`` of the text decoded with special
  tokens skipped on both.
* Optimiser: AdamW, betas (0.9, 0.999), eps 1e-8, weight decay 0, constant lr 1e-4, no warm-up, global
  grad-norm clip 1.0 (ours verl/workers/optim.py; TRL via transformers' Trainer with
  ``optim="adamw_torch"``, the same torch class, not the fused default); fp32; no dropout (the model has
  none; both disable it anyway); no entropy bonus.
* Logged per step (all computed on the step's samples before its update): reward (ours
  ``critic/score/mean``, TRL ``reward``), entropy (token mean; ``actor/entropy`` / ``entropy``), response
  length in tokens including EOS (``response_length/mean`` / ``completions/mean_length``), pre-clip
  gradient norm (``actor/grad_norm`` / ``grad_norm``), KL (above).

Prompts: for the same seed both sides draw the same prompts at each step (within the first epoch, 455
steps): TRL's sampler takes ``torch.randperm(n, generator=Generator().manual_seed(seed))`` (trl/trainer/
utils.py:928-933), ours the same permutation of the same rows (verl/data/loader.py) with ``data.seed``,
which defaults to a fixed 1 and so is set to the seed here (with it left at 1 all our seeds drew seed 1's
prompts, and our spread missed the prompt-to-prompt variance). Per step, response length, which follows
the prompts (3 or 4 tokens), correlates 0.97 between ours and TRL's runs of one seed and ~0 across seeds.
Not matched: the random numbers of sampling (ours draws each row with its own seed, TRL with torch's
global generator), so a seed is a different run on each side: hence 3 seeds and the comparison below.

Agreement: the steps are cut into windows of ``--window`` steps. For each window and side, each seed's
mean over the window; the side's value is the mean of its seeds, its spread the range (max - min) of
its seeds. A window agrees when |ours - TRL| <= the larger of the two spreads. A metric agrees when the
whole run (one window of all steps) agrees and at least ``--min-fraction`` of the windows do. With two
sides alike (3 normal draws each) a window still fails 4.9 % of the time, so the rule allows a few. Per-step
means and min / max over seeds go to ``curves.csv``, the figure to ``parity_trl.png``, everything to
``summary.json``, all in ``--workdir``. benchmarks/parity_trl_fixed.py checks the same definitions
without sampling noise: both sides on identical batches, to float rounding.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_vs_trl, trl_side, also when loaded by path
from bench_vs_trl import (ADDITION_PY, BARE_RUN_KEYS, DEFAULT_TRL_VENV, REPO, child_env,  # noqa: E402
                          machine_lines, timed_run)
from trl_side import TRL_SCRIPT, ensure_trl  # noqa: E402

PROMPTS_PER_STEP = 16
SAMPLES_PER_PROMPT = 8
MAX_NEW_TOKENS = 6   # as the demo: answers are 2-3 digits + EOS
MAX_PROMPT_TOKENS = 16  # the prompts are 13 tokens
KL_COEF = 0.001
K3_CLAMP = 10.0  # verl's bound on the per-token k3 (verl/algorithms/kl.py); TRL has none

# Each setting: our keys, TRL's GRPOConfig values (see the module docstring for the definitions).
SETTINGS = {
    "grpo": {
        "ours": ["algorithm.norm_adv_by_std_in_grpo=true", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
                 "actor_rollout_ref.actor.use_kl_loss=true", f"actor_rollout_ref.actor.kl_loss_coef={KL_COEF}"],
        "trl": {"scale_rewards": "group", "loss_type": "dapo", "beta": KL_COEF, "use_bias_correction_kl": False,
                "log_clamped_kl": K3_CLAMP},
        "title": "GRPO: std-normalised, token-mean, KL 0.001 (k3)",
    },
    "dr_grpo": {
        "ours": ["algorithm.norm_adv_by_std_in_grpo=false",
                 "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
                 "actor_rollout_ref.actor.use_kl_loss=false", f"actor_rollout_ref.actor.kl_loss_coef={KL_COEF}"],
        "trl": {"scale_rewards": "none", "loss_type": "dr_grpo", "beta": 0.0},
        "title": "Dr. GRPO: no std, sum / (seqs x max length), no KL",
    },
    "grpo_seqmean": {
        "ours": ["algorithm.norm_adv_by_std_in_grpo=true",
                 "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
                 "actor_rollout_ref.actor.use_kl_loss=false", f"actor_rollout_ref.actor.kl_loss_coef={KL_COEF}"],
        "trl": {"scale_rewards": "group", "loss_type": "grpo", "beta": 0.0},
        "title": "GRPO, per-sequence mean: std-normalised, seq-mean-token-mean, no KL",
    },
}

# metric: (our key in metrics.jsonl, TRL's key in log_history)
METRICS = {
    "reward": ("critic/score/mean", "reward"),
    "kl": ("actor/kl_loss", "kl_clamped"),  # k3 clamped at 10 on both (see the docstring)
    "entropy": ("actor/entropy", "entropy"),
    "response_length": ("response_length/mean", "completions/mean_length"),
    "grad_norm": ("actor/grad_norm", "grad_norm"),
}
SIDES = ("ours", "TRL")
TRL_UNCLAMPED_KL = "kl"  # TRL's own KL metric: k3 without a clamp, reported beside the comparison


# ----------------------------------------------------------------------------- arithmetic

def window_means(values: list[float], window: int) -> list[float]:
    """Means of consecutive windows of ``window`` values; a shorter last window is dropped (unless it is
    the only one)."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    full = len(values) // window
    if full == 0:
        return [statistics.fmean(values)] if values else []
    return [statistics.fmean(values[i * window:(i + 1) * window]) for i in range(full)]


def per_step(seeds: list[list[float]]) -> list[tuple[float, float, float]]:
    """(mean, min, max) over seeds at each step; the seeds' curves must have the same length."""
    if len({len(s) for s in seeds}) != 1:
        raise ValueError(f"the seeds' curves differ in length: {[len(s) for s in seeds]}")
    return [(statistics.fmean(col), min(col), max(col)) for col in zip(*seeds)]


def compare_windows(ours: list[list[float]], trl: list[list[float]], window: int) -> list[dict]:
    """One row per window: each side's mean over seeds of the seeds' window means, its spread (range of
    those seed means), the gap ours - TRL, and whether |gap| <= the larger spread."""
    rows = []
    ours_w = [window_means(s, window) for s in ours]
    trl_w = [window_means(s, window) for s in trl]
    n = min(len(w) for w in ours_w + trl_w)
    for i in range(n):
        o = [w[i] for w in ours_w]
        t = [w[i] for w in trl_w]
        gap = statistics.fmean(o) - statistics.fmean(t)
        spread = max(max(o) - min(o), max(t) - min(t))
        rows.append({"first_step": i * window + 1, "last_step": (i + 1) * window,
                     "ours": statistics.fmean(o), "trl": statistics.fmean(t), "ours_spread": max(o) - min(o),
                     "trl_spread": max(t) - min(t), "gap": gap, "spread": spread, "agree": abs(gap) <= spread})
    return rows


def metric_verdict(ours: list[list[float]], trl: list[list[float]], window: int, min_fraction: float) -> dict:
    """The windows, the whole run as one window, and the verdict: the whole run agrees and at least
    ``min_fraction`` of the windows do."""
    rows = compare_windows(ours, trl, window)
    steps = min(len(s) for s in ours + trl)
    whole = compare_windows([s[:steps] for s in ours], [s[:steps] for s in trl], steps)[0]
    agreeing = sum(r["agree"] for r in rows)
    return {"windows": rows, "whole": whole, "windows_agree": agreeing,
            "agree": whole["agree"] and agreeing >= min_fraction * len(rows)}


# ----------------------------------------------------------------------------- arguments

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=300, help="RL steps of every run")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--window", type=int, default=20, help="steps per window of the comparison")
    parser.add_argument("--min-fraction", type=float, default=0.8, help="windows that must agree, as a fraction")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every run (OMP_NUM_THREADS)")
    parser.add_argument("--workdir", type=Path, default=REPO / "outputs" / "parity_trl",
                        help="the model copy, the runs, curves.csv, summary.json and the figure")
    parser.add_argument("--fresh", action="store_true", help="rerun runs already complete in --workdir")
    parser.add_argument("--analyse-only", action="store_true", help="run nothing: use the runs in --workdir")
    parser.add_argument("--trl-venv", type=Path, default=DEFAULT_TRL_VENV, help="TRL's virtualenv (made when missing)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before a run is killed")
    args = parser.parse_args(argv)
    if min(args.seeds) < 0 or args.steps < 1 or args.jobs < 1 or args.threads < 1 or args.window < 1:
        parser.error("--seeds must be >= 0; --steps, --jobs, --threads and --window at least 1")
    if len(set(args.seeds)) < 2:
        parser.error("--seeds: at least two different seeds (the spread is their range)")
    if not 0 <= args.min_fraction <= 1:
        parser.error("--min-fraction is a fraction in [0, 1]")
    return args


# ----------------------------------------------------------------------------- runs

def warm_start_model(dest: Path) -> Path:
    """The demo's warm-started model (trained and cached on first use) copied to ``dest``; checked to be a
    complete Hugging Face folder with its tokenizer and chat template."""
    if not (dest / "config.json").exists():
        from verl.trainer.main_ppo import load_config
        from verl.trainer.warmstart import warm_start

        warm = warm_start(load_config([]), progress=False)
        print(f"warm start: {warm.path} ({warm.steps} SFT steps, sampled accuracy {warm.accuracy:.3f})", flush=True)
        shutil.copytree(warm.path, dest)
    missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                           "chat_template.jinja") if not (dest / f).exists()]
    if missing:
        raise SystemExit(f"{dest} is not a complete model folder (missing {', '.join(missing)}): remove it")
    return dest


def ours_command(args, model: Path, out_dir: Path, setting: str, seed: int) -> list[str]:
    keys = [
        f"actor_rollout_ref.model.path={model}",  # a folder: no demo preset, no warm start
        "actor_rollout_ref.model.dtype=float32",
        "actor_rollout_ref.model.disable_dropout=true",
        "actor_rollout_ref.rollout.name=native",
        f"actor_rollout_ref.rollout.n={SAMPLES_PER_PROMPT}",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.top_k=-1",
        "actor_rollout_ref.rollout.do_sample=true",
        f"data.train_batch_size={PROMPTS_PER_STEP}",
        f"data.max_prompt_length={MAX_PROMPT_TOKENS}",
        f"data.max_response_length={MAX_NEW_TOKENS}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS_PER_STEP}",  # one optimizer step per RL step
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.shuffle=false",
        "actor_rollout_ref.actor.clip_ratio=0.2",
        "actor_rollout_ref.actor.entropy_coeff=0.0",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.grad_clip=1.0",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.actor.optim.betas=[0.9,0.999]",
        "actor_rollout_ref.actor.optim.eps=1e-8",
        "actor_rollout_ref.actor.optim.warmup_style=constant",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        *SETTINGS[setting]["ours"],
        *BARE_RUN_KEYS,
        "trainer.val_sampled=false",
        f"trainer.experiment_name=parity-{setting}",
        f"trainer.seed={seed}",
        f"data.seed={seed}",  # the prompt order: its default is a fixed 1, TRL's follows the seed
        f"trainer.total_training_steps={args.steps}",
        f"trainer.default_local_dir={out_dir}",
    ]
    return [str(REPO / ".venv" / "bin" / "python"), "-m", "verl.trainer.main_ppo", *keys]


def trl_command(trl_python: Path, script: Path, args, model: Path, out_dir: Path, setting: str, seed: int):
    cfg = {"model": str(model), "addition_py": str(ADDITION_PY), "steps": args.steps, "lr": args.lr, "seed": seed,
           "threads": args.threads, "output_dir": str(out_dir / "trainer"), "prompts_per_step": PROMPTS_PER_STEP,
           "samples_per_prompt": SAMPLES_PER_PROMPT, "max_new_tokens": MAX_NEW_TOKENS, "epsilon": 0.2,
           "optim": "adamw_torch", "log_history": str(out_dir / "log_history.json"), **SETTINGS[setting]["trl"]}
    return [str(trl_python), str(script), json.dumps(cfg)]


def run_dir(workdir: Path, setting: str, side: str, seed: int) -> Path:
    return workdir / setting / f"{side.lower()}-seed{seed}"


def load_curves(out_dir: Path, side: str) -> dict[str, list[float]]:
    """Per metric, its value at each step (steps in order); metrics a side does not log are absent."""
    if side == "ours":
        path = out_dir / "run" / "metrics.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        column = 0
    else:
        path = out_dir / "log_history.json"
        records = [h for h in json.loads(path.read_text()) if "reward" in h] if path.exists() else []
        column = 1
    records.sort(key=lambda r: r["step"])
    keys = {name: k[column] for name, k in METRICS.items()}
    if side == "TRL":
        keys["kl_unclamped"] = TRL_UNCLAMPED_KL
    return {name: [float(r[key]) for r in records] for name, key in keys.items()
            if records and all(key in r for r in records)}


def run_all(args, trl_python: Path, model: Path) -> float:
    script = args.workdir / "trl_grpo.py"  # not trl.py: it would shadow the trl package
    script.write_text(TRL_SCRIPT)
    env = child_env(args.threads)
    todo = []
    for setting in args.settings:
        for seed in args.seeds:
            for side in SIDES:
                out_dir = run_dir(args.workdir, setting, side, seed)
                cmd = (ours_command(args, model, out_dir / "run", setting, seed) if side == "ours"
                       else trl_command(trl_python, script, args, model, out_dir, setting, seed))
                # A run is kept when it finished every step with this very command.
                done = out_dir / "command.json"
                if (not args.fresh and done.exists() and json.loads(done.read_text()) == cmd
                        and len(load_curves(out_dir, side).get("reward", [])) == args.steps):
                    continue
                shutil.rmtree(out_dir, ignore_errors=True)
                out_dir.mkdir(parents=True)
                todo.append((setting, side, seed, out_dir, cmd))
    print(f"{len(todo)} run(s) to do, {args.jobs} at a time", flush=True)

    def one(job):
        setting, side, seed, out_dir, cmd = job
        # Ours runs from the tree this script is in (``-m`` imports verl from the working directory), so a
        # snapshot of the repository (git archive) measures that snapshot's verl, whatever is installed.
        elapsed, cpu, _ = timed_run(cmd, REPO if side == "ours" else out_dir, env, args.timeout, out_dir / "log.txt")
        steps = len(load_curves(out_dir, side).get("reward", []))
        print(f"  {setting:<13} {side:<4} seed {seed}: {steps} steps, {elapsed:.0f}s wall, {cpu:.0f}s CPU", flush=True)
        if steps != args.steps:
            raise SystemExit(f"{out_dir}: {steps} steps logged, not {args.steps} (see log.txt)")
        (out_dir / "command.json").write_text(json.dumps(cmd))
        return elapsed

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, todo))
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- report

def analyse(args) -> dict:
    """Per setting and metric: the per-step curves over seeds and the verdict."""
    out = {}
    for setting in args.settings:
        loaded = {side: [load_curves(run_dir(args.workdir, setting, side, s), side) for s in args.seeds]
                  for side in SIDES}
        out[setting] = {}
        for metric in METRICS:
            seeds = {side: [c[metric] for c in loaded[side] if metric in c] for side in SIDES}
            if any(len(seeds[side]) != len(args.seeds) for side in SIDES):
                continue  # not logged by a side in this setting (KL without a KL term)
            steps = min(len(c) for side in SIDES for c in seeds[side])
            seeds = {side: [c[:steps] for c in seeds[side]] for side in SIDES}
            out[setting][metric] = {"per_step": {side: per_step(seeds[side]) for side in SIDES},
                                    "seeds": seeds, **metric_verdict(seeds["ours"], seeds["TRL"], args.window,
                                                                      args.min_fraction)}
            unclamped = [c["kl_unclamped"][:steps] for c in loaded["TRL"] if "kl_unclamped" in c]
            if metric == "kl" and len(unclamped) == len(args.seeds):
                out[setting][metric]["trl_unclamped"] = unclamped
    return out


def print_report(results: dict, args) -> bool:
    all_agree = True
    for setting, metrics in results.items():
        print(f"\n=== {setting}: {SETTINGS[setting]['title']} ===")
        for metric, res in metrics.items():
            w = res["windows"]
            print(f"{metric}: windows of {args.window} steps, mean over seeds (range over seeds)")
            print(f"  {'steps':>9} {'ours':>18} {'TRL':>18} {'gap':>9} {'spread':>8}  agree")
            for r in w + [res["whole"]]:
                label = f"{r['first_step']}-{r['last_step']}" + (" all" if r is res["whole"] else "")
                print(f"  {label:>9} {r['ours']:>9.4f} ({r['ours_spread']:.4f})"
                      f" {r['trl']:>9.4f} ({r['trl_spread']:.4f})"
                      f" {r['gap']:>+9.4f} {r['spread']:>8.4f}  {'yes' if r['agree'] else 'NO'}")
            if "trl_unclamped" in res:
                means = [statistics.fmean(s) for s in res["trl_unclamped"]]
                print(f"  (TRL's own kl, k3 not clamped: {statistics.fmean(means):.4f} over the whole run, seeds "
                      f"{min(means):.4f}-{max(means):.4f})")
            verdict = "AGREE" if res["agree"] else "DIFFER"
            print(f"  -> {verdict}: {res['windows_agree']}/{len(w)} windows, whole run "
                  f"{'agrees' if res['whole']['agree'] else 'differs'}")
            all_agree &= res["agree"]
    return all_agree


def write_outputs(results: dict, args) -> None:
    with open(args.workdir / "curves.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["setting", "metric", "step", "ours_mean", "ours_min", "ours_max", "trl_mean", "trl_min",
                         "trl_max"])
        for setting, metrics in results.items():
            for metric, res in metrics.items():
                for i, (o, t) in enumerate(zip(res["per_step"]["ours"], res["per_step"]["TRL"])):
                    writer.writerow([setting, metric, i + 1, *(f"{x:.6g}" for x in o + t)])
    summary = {s: {m: {k: r[k] for k in ("windows", "whole", "windows_agree", "agree", "seeds")} for m, r in ms.items()}
               for s, ms in results.items()}
    (args.workdir / "summary.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                           "results": summary}, indent=1))
    plot(results, args.workdir / "parity_trl.png", smooth=max(1, args.window // 2))


def moving_average(values: list[float], n: int) -> list[float]:
    """Trailing mean of the last ``n`` values (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - n] if i >= n else 0.0)
        out.append(total / min(i + 1, n))
    return out


def plot(results: dict, path: Path, smooth: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(METRICS)
    fig, axes = plt.subplots(len(results), len(names), figsize=(4 * len(names), 3.2 * len(results)), squeeze=False)
    for row, (setting, metrics) in enumerate(results.items()):
        for col, metric in enumerate(names):
            ax = axes[row][col]
            ax.set_title(f"{setting}: {metric}", fontsize=9)
            if metric not in metrics:
                ax.text(0.5, 0.5, "no KL term", ha="center", va="center", transform=ax.transAxes)
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            for side, colour in zip(SIDES, ("tab:blue", "tab:orange")):
                seeds = [moving_average(s, smooth) for s in metrics[metric]["seeds"][side]]
                band = per_step(seeds)
                x = range(1, len(band) + 1)
                ax.fill_between(x, [b[1] for b in band], [b[2] for b in band], color=colour, alpha=0.25, lw=0)
                ax.plot(x, [b[0] for b in band], color=colour, lw=1.4, label=f"{side} ({len(seeds)} seeds)")
            if "trl_unclamped" in metrics[metric]:
                mean = per_step([moving_average(s, smooth) for s in metrics[metric]["trl_unclamped"]])
                ax.plot(range(1, len(mean) + 1), [b[0] for b in mean], color="tab:orange", ls="--", lw=1,
                        label="TRL, k3 not clamped")
                ax.legend(fontsize=7)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
            if col == 0:
                ax.legend(fontsize=7)
    fig.suptitle(f"verl vs TRL GRPOTrainer: mean over seeds and min-max band ({smooth}-step trailing mean)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(args.threads)
    trl_python = None if args.analyse_only else ensure_trl(args.trl_venv, force=False)
    print("\n".join(machine_lines(trl_python)))
    print(f"setup: {PROMPTS_PER_STEP} prompts x {SAMPLES_PER_PROMPT} samples per step, <= {MAX_NEW_TOKENS} new "
          f"tokens, lr {args.lr}, {args.steps} steps, seeds {args.seeds}, settings {args.settings}", flush=True)
    if not args.analyse_only:
        model = warm_start_model(args.workdir / "model")
        wall = run_all(args, trl_python, model)
        print(f"runs: {wall:.0f}s wall", flush=True)
    results = analyse(args)
    agree = print_report(results, args)
    write_outputs(results, args)
    print(f"\nverdict: {'every metric agrees' if agree else 'SOME METRIC DIFFERS'} within the seed-to-seed spread")
    print(f"per-step curves: {args.workdir / 'curves.csv'}\nfigure: {args.workdir / 'parity_trl.png'}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
