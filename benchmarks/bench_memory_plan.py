"""The memory plan against the measured peak on this machine's CPU: a GRPO run with a reference on a
random Qwen2 of a given shape, its ``perf/cpu_memory_used_gb`` (the process's peak RSS, logged with
every actor update) beside the plan's peak (``python -m verl.trainer.main_ppo ... --plan``).

    python benchmarks/bench_memory_plan.py                       # the default shape, fp32 and bf16
    python benchmarks/bench_memory_plan.py --hidden 896 --layers 24 --intermediate 4864 --heads 14 --kv-heads 2
    python benchmarks/bench_memory_plan.py --nproc 2 --runs fp32:plain      # 2 FSDP ranks (torchrun)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

GiB = 1024**3


def run_args(model: Path, out: Path, dtype: str, micro: int, response: int, extra: list[str],
             prompts: int = 4, n: int = 4) -> list[str]:
    return [f"actor_rollout_ref.model.path={model}", f"actor_rollout_ref.model.dtype={dtype}",
            f"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype={dtype}",
            f"actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype={dtype}",
            "data.builtin_task=addition", f"data.train_batch_size={prompts}", f"actor_rollout_ref.rollout.n={n}",
            "data.max_prompt_length=32", f"data.max_response_length={response}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16", "actor_rollout_ref.rollout.temperature=1.0",
            "actor_rollout_ref.actor.use_kl_loss=true", "algorithm.adv_estimator=grpo", "trainer.total_training_steps=1",
            "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.progress_bar=false",
            "trainer.write_report=false", f"trainer.default_local_dir={out}", "trainer.device=cpu", *extra]


def measure(args: list[str], out: Path, nproc: int = 1, threads: int = 1) -> tuple[float, float, float]:
    """(plan's peak, measured peak RSS of rank 0 in GiB, seconds of the last step) of one run (the run
    prints its plan at start); ``nproc`` > 1 runs it under torchrun with that many CPU ranks."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    launcher = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                    f"--nproc_per_node={nproc}"]
    done = subprocess.run([*launcher, "-m", "verl.trainer.main_ppo", *args], capture_output=True, text=True,
                          env=env)
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
    peak_line = next(line for line in done.stdout.splitlines() if line.strip().startswith("peak "))
    planned = float(peak_line.split()[1])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/cpu_memory_used_gb" in r]
    return planned, max(r["perf/cpu_memory_used_gb"] for r in steps), steps[-1]["timing_s/step"]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--response", type=int, default=128)
    parser.add_argument("--nproc", type=int, default=1, help="CPU ranks (torchrun) of each run")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each rank")
    parser.add_argument("--vocab", type=int, default=None, help="embedding rows (default: the tokenizer's 259)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--runs", default="fp32:plain,fp32:ckpt,bf16:plain,bf16:ckpt",
                        help="dtype:variant pairs; variant plain or ckpt (gradient checkpointing)")
    opts = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from verl.models.tiny import make_tiny_model_folder

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model_folder(Path(tmp) / "model", num_layers=opts.layers, hidden_size=opts.hidden,
                                       intermediate_size=opts.intermediate, num_heads=opts.heads,
                                       num_kv_heads=opts.kv_heads, max_position_embeddings=4096, vocab_size=opts.vocab)
        print(f"{'dtype':<6}{'variant':<8}{'plan GiB':>10}{'measured GiB':>14}{'plan/measured':>15}{'s/step':>9}")
        for run in opts.runs.split(","):
            dtype, variant = run.split(":")
            extra = ["actor_rollout_ref.model.enable_gradient_checkpointing=true"] if variant == "ckpt" else []
            out = Path(tmp) / f"run-{dtype}-{variant}"
            args = run_args(model, out, dtype, opts.micro, opts.response, extra, opts.prompts, opts.n)
            planned, measured, seconds = measure(args, out, opts.nproc, opts.threads)
            results.append({"dtype": dtype, "variant": variant, "plan": planned, "measured": measured, "step_s": seconds})
            print(f"{dtype:<6}{variant:<8}{planned:>10.2f}{measured:>14.2f}{planned / measured:>15.2f}{seconds:>9.1f}",
                  flush=True)
    return results


if __name__ == "__main__":
    main()
