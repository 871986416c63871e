"""How the cost of a GRPO step grows with the model and the response length, on this machine's CPU:
peak memory (measured RSS, and the memory plan's figure) and the step's time with its generation and
update parts, for random Qwen2 models of four sizes, then for one size at several response lengths.

    python benchmarks/bench_sizes.py                                   # sizes 1M 24M 135M 494M, then lengths 32-256
    python benchmarks/bench_sizes.py --sizes 1M,24M --responses 32,128 --dtypes fp32

Each run is one process (``--threads`` threads), 4 prompts x 4 samples, a reference, micro-batch 16,
``trainer.total_training_steps=2``: the table gives the second step (the first pays one-off costs).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_memory_plan import measure, run_args  # noqa: E402

# name -> (hidden, layers, intermediate, heads, kv heads, embedding rows): Qwen2-style shapes; 135M is
# SmolLM-135M's shape, 494M Qwen2.5-0.5B's.
SHAPES = {"1M": (128, 4, 384, 4, 2, None), "24M": (512, 8, 1536, 8, 2, None),
          "135M": (576, 30, 1536, 9, 3, 49152), "494M": (896, 24, 4864, 14, 2, 151936)}


def run_one(tmp: Path, size: str, dtype: str, response: int, threads: int) -> dict:
    from verl.models.tiny import make_tiny_model_folder

    hidden, layers, intermediate, heads, kv_heads, vocab = SHAPES[size]
    model = tmp / f"model-{size}"
    if not model.exists():
        make_tiny_model_folder(model, num_layers=layers, hidden_size=hidden, intermediate_size=intermediate,
                               num_heads=heads, num_kv_heads=kv_heads, max_position_embeddings=4096, vocab_size=vocab)
    out = tmp / f"run-{size}-{dtype}-{response}"
    args = run_args(model, out, dtype, 16, response, ["trainer.total_training_steps=2"])
    planned, measured, _ = measure(args, out, threads=threads)
    last = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    params = sum(p.numel() for p in _meta_model(model).parameters())
    return {"size": size, "params_m": params / 1e6, "dtype": dtype, "response": response, "plan_gb": planned,
            "peak_gb": measured, "step_s": last["timing_s/step"], "gen_s": last["timing_s/gen"],
            "update_s": last["timing_s/update_actor"], "mean_response": last["response_length/mean"]}


def _meta_model(folder: Path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))


def table(rows: list[dict]) -> str:
    lines = ["| model | parameters | dtype | response (max / mean) | peak RSS GiB | plan GiB | s/step | gen s | "
             "update s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['size']} | {r['params_m']:.1f}M | {r['dtype']} | {r['response']} / {r['mean_response']:.0f} "
                     f"| {r['peak_gb']:.2f} | {r['plan_gb']:.2f} | {r['step_s']:.2f} | {r['gen_s']:.2f} | "
                     f"{r['update_s']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,24M,135M,494M")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--response", type=int, default=128, help="response length of the size table")
    parser.add_argument("--length-size", default="135M", help="the model of the response-length table")
    parser.add_argument("--responses", default="32,128,256", help="response lengths of the second table")
    parser.add_argument("--threads", type=int, default=2)
    opts = parser.parse_args(argv)
    rows, by_length = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for size in filter(None, opts.sizes.split(",")):
            for dtype in opts.dtypes.split(","):
                rows.append(run_one(Path(tmp), size, dtype, opts.response, opts.threads))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
        if rows:
            print("\nBy model size:\n" + table(rows))
        if opts.responses:
            for response in map(int, opts.responses.split(",")):
                done = next((r for r in rows if r["size"] == opts.length_size and r["dtype"] == "fp32"
                             and r["response"] == response), None)
                by_length.append(done or run_one(Path(tmp), opts.length_size, "fp32", response, opts.threads))
                print(table(by_length[-1:]).splitlines()[-1], flush=True)
            print(f"\nBy response length ({opts.length_size}, fp32):\n" + table(by_length))
    return rows + by_length


if __name__ == "__main__":
    main()
