"""verl against TRL's GRPOTrainer: the same tiny GRPO run, whole processes, time per step and start-up.

    python benchmarks/bench_vs_trl.py [--steps 10] [--repeats 2] [--ours hf native] [--trl-venv PATH]
    python benchmarks/bench_vs_trl.py --setup-only      # just build TRL's virtualenv

Both sides train the same randomly initialised tiny Qwen2 (``verl.models.tiny.make_tiny_model_folder``:
4 layers, hidden 128, byte-level tokenizer, written once to a temporary folder that both load) on
the built-in addition task: the training prompts of ``verl.data.tasks.addition`` (``37+48=``) and its
``compute_score`` as the reward. One step = 4 prompts x 8 samples, at most 32 new tokens, temperature
1, one optimizer step over all 32 samples, AdamW at the same learning rate (constant, no warm-up, no
weight decay, gradient clip 1.0), no KL term and no reference model (beta 0), fp32, CPU, 1 thread.

* ours: ``python -m verl.trainer.main_ppo key=value ...`` with the model folder as
  ``actor_rollout_ref.model.path`` (so the demo preset and its SFT warm start do not apply), no
  validation, no checkpoints, no resume, no run report (TRL writes none). ``--ours`` lists the rollout
  engines to run (one row each).
* TRL: a script written to a temporary folder, run with the python of a separate virtualenv
  (``--trl-venv``, default /tmp/verl-bench-trl; made on first use, or with ``--setup``), that builds a
  ``datasets.Dataset`` of the same prompts and runs ``trl.GRPOTrainer`` with the same settings.

Each side runs S and 3S steps, alternated (ours S, TRL S, ours 3S, TRL 3S; ``--repeats`` times); a
run is timed from launch to exit. Per step = (t(3S) - t(S)) / 2S; start-up = t(S) - S x per step
(imports, model and data loading, anything done once, and the exit). The numbers are medians over
the repeats, from wall time and, steadier on a shared machine, from each process's CPU time (user +
system); the in-process stage times of both sides follow (ours: the ``timing_s/*`` metrics; TRL: its
``step_time`` and timers put on ``generate`` and ``_generate_and_score_completions``). Every run
reports the optimizer steps it took and the completions it generated per step, and the benchmark
stops if a side did not do 32 per step. Nothing is asserted about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # trl_side, also when loaded by path (tests)
from trl_side import TRL_SCRIPT, ensure_trl, trl_versions  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ADDITION_PY = REPO / "verl" / "data" / "tasks" / "addition.py"
DEFAULT_TRL_VENV = Path("/tmp/verl-bench-trl")

PROMPTS_PER_STEP = 4
SAMPLES_PER_PROMPT = 8
MAX_NEW_TOKENS = 32
MAX_PROMPT_TOKENS = 16  # the addition prompts are 13 tokens with the chat template ("Q: 37+48=\nA: ")


# ----------------------------------------------------------------------------- arithmetic

def cost_split(t_short: float, t_long: float, short_steps: int, long_steps: int) -> tuple[float, float]:
    """(seconds per step, start-up seconds) from the wall times of a short and a long run.

    Both runs pay the same start-up; the long one pays ``long_steps - short_steps`` more steps.
    """
    if long_steps <= short_steps:
        raise ValueError(f"the long run must have more steps ({long_steps} <= {short_steps})")
    per_step = (t_long - t_short) / (long_steps - short_steps)
    return per_step, t_short - short_steps * per_step


def summarise(times: dict[str, list[tuple[float, float]]], short_steps: int, long_steps: int) -> dict[str, dict]:
    """Per side: the (per step, start-up) of each repeat, their medians, and under ``best`` the split of
    the fastest short and fastest long run (the least disturbed by other work on the machine).

    ``times[side]`` holds one (t_short, t_long) pair per repeat.
    """
    out = {}
    for side, pairs in times.items():
        splits = [cost_split(ts, tl, short_steps, long_steps) for ts, tl in pairs]
        best = cost_split(min(p[0] for p in pairs), min(p[1] for p in pairs), short_steps, long_steps)
        out[side] = {"per_step": statistics.median(s[0] for s in splits),
                     "startup": statistics.median(s[1] for s in splits),
                     "splits": splits, "best": {"per_step": best[0], "startup": best[1]}}
    return out


def format_table(summary: dict[str, dict], reference: str) -> str:
    """One line per side; ratios are the side's over ``reference``'s (below 1: faster)."""
    ref = summary.get(reference)
    head = f"{'side':<16} {'per step (s)':>12} {'start-up (s)':>12} {'step / ' + reference:>12} {'start-up / ' + reference:>16}"
    lines = [head, "-" * len(head)]
    for side, s in summary.items():
        if ref is None:
            step_ratio = start_ratio = "n/a"
        else:
            step_ratio = f"{s['per_step'] / ref['per_step']:.2f}x" if ref["per_step"] > 0 else "n/a"
            start_ratio = f"{s['startup'] / ref['startup']:.2f}x" if ref["startup"] > 0 else "n/a"
        lines.append(f"{side:<16} {s['per_step']:>12.3f} {s['startup']:>12.2f} {step_ratio:>12} {start_ratio:>16}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="S: the short run's steps; the long run has 3S")
    parser.add_argument("--repeats", type=int, default=2, help="alternated rounds of (S, 3S) runs per side")
    parser.add_argument("--ours", nargs="+", default=["hf", "native"], choices=["hf", "native"],
                        help="our rollout engines to run, one row each (actor_rollout_ref.rollout.name)")
    parser.add_argument("--lr", type=float, default=1e-4, help="learning rate of both sides")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every process (OMP_NUM_THREADS)")
    parser.add_argument("--trl-venv", type=Path, default=DEFAULT_TRL_VENV,
                        help="virtualenv holding TRL (made there when missing)")
    parser.add_argument("--setup", action="store_true", help="(re)install TRL into --trl-venv before running")
    parser.add_argument("--setup-only", action="store_true", help="install TRL into --trl-venv and stop")
    parser.add_argument("--no-trl", action="store_true", help="run our side only")
    parser.add_argument("--no-warmup", action="store_true",
                        help="skip the untimed 1-step run of each side (fills the page cache, .pyc files, datasets' cache)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before a run is killed")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the runs' files here (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw times and the summary here")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--steps, --repeats and --threads must be at least 1")
    return args


# ----------------------------------------------------------------------------- runs

# Our side's keys for a run that only trains: no warm start, no validation, checkpoints, resume, progress
# bar, loggers or run report (metrics.jsonl is written whatever the loggers; TRL, with report_to=[] and
# save_strategy="no", writes no report either), on the CPU. parity_trl.py uses them too.
BARE_RUN_KEYS = (
    "sft_warmstart.enable=false",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.resume_mode=disable",
    "trainer.progress_bar=false",
    "trainer.logger=[]",
    "trainer.write_report=false",
    "trainer.device=cpu",
)


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_HUB_DISABLE_TELEMETRY="1", PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    return env


def ours_command(args, model: Path, out_dir: Path, steps: int, rollout: str) -> list[str]:
    keys = [
        f"actor_rollout_ref.model.path={model}",  # a folder: not the demo, so no preset and no SFT warm start
        "actor_rollout_ref.model.dtype=float32",
        f"actor_rollout_ref.rollout.name={rollout}",
        f"data.train_batch_size={PROMPTS_PER_STEP}",
        f"actor_rollout_ref.rollout.n={SAMPLES_PER_PROMPT}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"data.max_response_length={MAX_NEW_TOKENS}",
        f"data.max_prompt_length={MAX_PROMPT_TOKENS}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS_PER_STEP}",  # one optimizer step per RL step
        "actor_rollout_ref.actor.ppo_epochs=1",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.actor.optim.warmup_style=constant",
        "actor_rollout_ref.actor.grad_clip=1.0",
        "actor_rollout_ref.actor.use_kl_loss=false",  # no reference model
        "algorithm.use_kl_in_reward=false",
        "algorithm.adv_estimator=grpo",
        *BARE_RUN_KEYS,
        f"trainer.seed={args.seed}",
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={out_dir}",
    ]
    return [str(REPO / ".venv" / "bin" / "python"), "-m", "verl.trainer.main_ppo", *keys]


def trl_command(trl_python: Path, script: Path, args, model: Path, out_dir: Path, steps: int) -> list[str]:
    cfg = {"model": str(model), "addition_py": str(ADDITION_PY), "steps": steps, "lr": args.lr, "seed": args.seed,
           "threads": args.threads, "output_dir": str(out_dir), "prompts_per_step": PROMPTS_PER_STEP,
           "samples_per_prompt": SAMPLES_PER_PROMPT, "max_new_tokens": MAX_NEW_TOKENS}
    return [str(trl_python), str(script), json.dumps(cfg)]


def timed_run(cmd: list[str], cwd: Path, env: dict, timeout: float, log: Path) -> tuple[float, float, str]:
    """Run ``cmd`` to its exit: (wall seconds from launch to exit, CPU seconds, its output).

    The CPU seconds are the process's user + system time (all its threads, from ``wait4``): with one
    torch thread they equal the wall time on an idle machine, and they move much less than the wall
    time when other jobs share the cores.
    """
    start = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT)
        killer = threading.Timer(timeout, proc.kill)
        killer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.perf_counter() - start
    text = log.read_text(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"run failed (exit {proc.returncode}): {' '.join(cmd[:3])} ...\n{text[-4000:]}")
    return elapsed, usage.ru_utime + usage.ru_stime, text


def ours_work(out_dir: Path) -> dict:
    """What our run did, from its metrics.jsonl: RL steps, optimizer steps and samples per step, stage times."""
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    samples = []
    for r in records:
        # total tokens = sum over samples of (prompt + response) = samples x (mean prompt + mean response)
        per_sample = r["prompt_length/mean"] + r["response_length/mean"]
        samples.append(round(r["perf/total_num_tokens"] / per_sample))
    timings = [{k.split("/", 1)[1]: v for k, v in r.items() if k.startswith("timing_s/")} for r in records]
    # One optimizer step per mini-batch (ppo_mini_batch_size = train_batch_size) and epoch (ppo_epochs = 1).
    optimizer_steps = len(records)
    return {"rl_steps": len(records), "optimizer_steps": optimizer_steps,
            "completions_per_step": sorted(set(samples)), "timings": timings,
            "response_length": statistics.mean(r["response_length/mean"] for r in records)}


def trl_work(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("BENCH_RESULT "):
            return json.loads(line[len("BENCH_RESULT "):])
    raise SystemExit("TRL's run printed no BENCH_RESULT line:\n" + text[-4000:])


def check_work(side: str, work: dict, steps: int) -> str:
    want = PROMPTS_PER_STEP * SAMPLES_PER_PROMPT
    per_step = work["completions_per_step"]
    per_step = per_step if isinstance(per_step, list) else [per_step]
    line = f"optimizer steps {work['optimizer_steps']}, completions per step {per_step}"
    if work["optimizer_steps"] != steps or any(abs(c - want) > 1e-9 for c in per_step):
        raise SystemExit(f"{side} did not do the same work: {line}; want {steps} steps of {want} completions")
    return line


# ----------------------------------------------------------------------------- machine

def machine_lines(trl_python: Path | None) -> list[str]:
    import torch
    import transformers

    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [f"machine: {platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores ({usable} usable), "
             f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}",
             f"ours: python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}"]
    if trl_python is not None:
        v = trl_versions(trl_python)
        lines.append("TRL:  " + ", ".join(f"{k} {v[k]}" for k in ("torch", "transformers", "trl", "datasets", "accelerate")
                                         if k in v))
    return lines


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    trl_python = None
    if not args.no_trl or args.setup_only:
        trl_python = ensure_trl(args.trl_venv, force=args.setup or args.setup_only)
        if args.setup_only:
            return 0

    import torch

    torch.set_num_threads(args.threads)
    own_tmp = args.workdir is None
    work = Path(tempfile.mkdtemp(prefix="bench-vs-trl-")) if own_tmp else args.workdir
    work.mkdir(parents=True, exist_ok=True)
    try:
        return _run(args, trl_python, work)
    finally:
        if own_tmp:
            shutil.rmtree(work, ignore_errors=True)


def _run(args, trl_python: Path | None, work: Path) -> int:
    from verl.models.tiny import make_tiny_model_folder

    model = make_tiny_model_folder(work / "model", seed=0, max_position_embeddings=2048)
    script = work / "trl_grpo.py"
    script.write_text(TRL_SCRIPT)
    env = child_env(args.threads)
    short, long = args.steps, 3 * args.steps
    sides = [f"ours ({r})" for r in args.ours] + ([] if trl_python is None else ["TRL"])

    print("\n".join(machine_lines(trl_python)))
    print(f"setup: {PROMPTS_PER_STEP} prompts x {SAMPLES_PER_PROMPT} samples per step, <= {MAX_NEW_TOKENS} new tokens, "
          f"temperature 1, lr {args.lr}, beta 0, fp32, CPU, {args.threads} thread(s); runs of {short} and {long} steps, "
          f"{args.repeats} repeat(s), alternated", flush=True)

    def run_side(side: str, steps: int, tag: str) -> tuple[float, float, dict]:
        out_dir = work / f"{tag}-{side.replace(' ', '').replace('(', '-').replace(')', '')}-{steps}"
        shutil.rmtree(out_dir, ignore_errors=True)
        out_dir.mkdir(parents=True)
        if side == "TRL":
            cmd = trl_command(trl_python, script, args, model, out_dir, steps)
        else:
            cmd = ours_command(args, model, out_dir / "run", steps, side[len("ours ("):-1])
        elapsed, cpu, text = timed_run(cmd, out_dir, env, args.timeout, out_dir / "log.txt")
        done = trl_work(text) if side == "TRL" else ours_work(out_dir / "run")
        return elapsed, cpu, done

    if not args.no_warmup:
        for side in sides:
            elapsed, _, _ = run_side(side, 1, "warmup")
            print(f"warm-up  {side:<14} 1 step: {elapsed:.1f}s (not counted)", flush=True)

    times: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    cpu_times: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    stage_records: dict[str, list[dict]] = {side: [] for side in sides}
    for rep in range(args.repeats):
        pair = {side: [] for side in sides}
        cpu_pair = {side: [] for side in sides}
        for steps in (short, long):
            for side in sides:
                elapsed, cpu, done = run_side(side, steps, f"r{rep}")
                pair[side].append(elapsed)
                cpu_pair[side].append(cpu)
                line = check_work(side, done, steps)
                # Step 1 pays one-off costs (first forward/backward, allocator): left out of the stage means.
                if side == "TRL":
                    st = done["stage_times"]
                    stage_records[side].extend(
                        {"step": t, "generate": g, "generate_and_score": gs, "loss_fwd_bwd": t - gs}
                        for t, g, gs in list(zip(done["step_times"], st["generate"], st["generate_and_score"]))[1:])
                else:
                    stage_records[side].extend(done["timings"][1:])
                line += f", mean response length {done['response_length']:.1f}"
                print(f"repeat {rep + 1}  {side:<14} {steps:>3} steps: {elapsed:6.1f}s wall, {cpu:6.1f}s CPU  "
                      f"({line})", flush=True)
        for side in sides:
            times[side].append(tuple(pair[side]))
            cpu_times[side].append(tuple(cpu_pair[side]))

    summary = summarise(times, short, long)
    cpu_summary = summarise(cpu_times, short, long)
    reference = "TRL" if "TRL" in summary else sides[0]
    for name, table, raw in (("wall", summary, times), ("CPU", cpu_summary, cpu_times)):
        print(f"\n=== {name} seconds, launch to exit ===")
        print("raw: " + "; ".join(f"{side}: " + ", ".join(f"{a:.1f}/{b:.1f}" for a, b in raw[side])
                                  for side in sides) + f"   (t({short}) / t({long}) per repeat)")
        for side in sides:
            print(f"  {side:<14} per repeat (per step, start-up): "
                  + ", ".join(f"({p:.3f}, {s:.2f})" for p, s in table[side]["splits"]))
        print(f"median over repeats ({name}):")
        print(format_table(table, reference))
        print(f"from the fastest t({short}) and the fastest t({long}) of each side ({name}):")
        print(format_table({side: s["best"] for side, s in table.items()}, reference))
    print()
    for side, records in stage_records.items():
        if not records:
            continue
        keys = [k for k in records[0] if k != "step"]
        means = {k: statistics.mean(r.get(k, 0.0) for r in records) for k in keys}
        step = statistics.mean(r["step"] for r in records)
        parts = ", ".join(f"{k} {v:.3f}" for k, v in means.items())
        label = "step_time and timed stages" if side == "TRL" else "timing_s/* stages"
        print(f"{side:<14} in-process {label}, mean of steps 2..N over all runs ({len(records)} steps): "
              f"step {step:.3f}s" + (f" = {parts}" if parts else "")
              + f"; median step {statistics.median(r['step'] for r in records):.3f}s")
    if args.json:
        args.json.write_text(json.dumps({"times": times, "summary": summary, "cpu_times": cpu_times,
                                         "cpu_summary": cpu_summary, "stages": stage_records,
                                         "short_steps": short, "long_steps": long}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
