"""Step time and bytes moved per step: one process vs torchrun vs Ray with 2 ranks, on the demo task.

    python benchmarks/bench_scaleout.py [--steps 12] [--out outputs/bench_scaleout]

Runs the built-in demo (the cached SFT warm start, then GRPO with 32 prompts x 8 samples) for
``--steps`` steps in each placement and prints one table: the mean of ``timing_s/step`` and of
each stage over the steps after the first (the first pays one-off costs), and
``perf/bytes_moved`` (tensor bytes that crossed between processes per step: the ranks' all-gathers
under torchrun; the shares sent to the actors and the results back under Ray, also shown apart as
``perf/bytes_to_workers`` / ``perf/bytes_from_workers``). Placements:

* local, 1 thread and local, 2 threads: plain ``python -m verl.trainer.main_ppo``;
* torchrun-2: ``torchrun --nproc_per_node=2``, one thread per rank;
* ray-2: ``trainer.backend=ray trainer.n_gpus_per_node=2`` (a local Ray; 2 actors of one thread each,
  and the driver), when Ray is installed.

On a 2-core CPU machine torchrun-2 and local-2-threads use the same cores; the comparison says
what data parallelism costs or gains there, not on GPUs. A measurement: nothing is asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor")


def run(placement: str, steps: int, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    args = [f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={out}", "trainer.test_freq=-1",
            "trainer.val_before_train=false", "trainer.progress_bar=false", "trainer.logger=[jsonl]"]
    threads = {"local-1": "1", "local-2": "2", "torchrun-2": "1", "ray-2": "1"}[placement]
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"] if placement == "torchrun-2" else []
    if placement == "ray-2":
        args += ["trainer.backend=ray", "trainer.n_gpus_per_node=2"]
    env = {**os.environ, "OMP_NUM_THREADS": threads, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *launcher, "-m", "verl.trainer.main_ppo", *args], cwd=REPO, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{placement} failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps_rows = [r for r in rows if "timing_s/step" in r][1:]

    def mean(key):
        values = [r[key] for r in steps_rows if r.get(key) is not None]
        return sum(values) / len(values) if values else float("nan")

    return {"placement": placement, "wall": wall, "step": mean("timing_s/step"),
            "bytes": mean("perf/bytes_moved"), "to": mean("perf/bytes_to_workers"),
            "from": mean("perf/bytes_from_workers"), **{s: mean(f"timing_s/{s}") for s in STAGES}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", default="outputs/bench_scaleout")
    args = parser.parse_args()
    # Warm the cache (warm start, task data) once, so that no placement pays for it.
    run("local-2", 1, Path(args.out) / "warmup")
    placements = ["local-1", "local-2", "torchrun-2"]
    if importlib.util.find_spec("ray") is not None:
        placements.append("ray-2")
    else:
        print("ray-2 left out: Ray is not installed (pip install 'verl[ray]')")
    results = [run(p, args.steps, Path(args.out) / p) for p in placements]
    header = (f"{'placement':<12}{'s/step':>8}" + "".join(f"{s:>14}" for s in STAGES)
              + f"{'bytes moved/step':>18}{'to workers':>14}{'from workers':>14}")
    print(f"demo task, {args.steps} steps (mean over steps 2..{args.steps}), {os.cpu_count()} CPUs")
    print(header)
    for r in results:
        print(f"{r['placement']:<12}{r['step']:>8.3f}" + "".join(f"{r[s]:>14.3f}" for s in STAGES)
              + f"{r['bytes']:>18,.0f}{r['to']:>14,.0f}{r['from']:>14,.0f}")


if __name__ == "__main__":
    main()
