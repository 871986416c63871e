"""Rollout throughput: response tokens per second of the ``hf`` and ``native`` engines (and ``vllm`` where it is installed).

    python benchmarks/bench_rollout.py [--threads 1] [--repeats 2] [--batches 16 64 256] [--n 8] [--max-new-tokens 64]
                                       [--stop-tokens 0 16]

Two randomly initialised tiny Qwen2 models: ``1M`` (4 layers, hidden 128, MLP 384: the built-in
model's shape, 0.8M parameters) and ``27M`` (8 layers, hidden 512, MLP 1408, 8 heads, 2 KV heads;
22.7M parameters); byte-level vocabulary of 259. Each batch is ``batch / n`` prompts of the built-in
addition task (left-padded, 6 to 9 tokens) times ``n`` samples, sampled at temperature 1 with per-row seeds, up to
``--max-new-tokens`` tokens. A random model seldom emits EOS, so most rows run to the limit; an RL
policy's responses end at spread-out lengths. Each ``--stop-tokens K`` is one scenario: with K > 0 the
engines also stop at K more token ids (3 .. K+2), so a row stops at each step with chance about
(K+1)/259 and lengths spread like a trained model's (K=16: about 6.6% a step, mean near 13 of 64).

Printed per engine, model and batch: wall seconds of one ``generate`` call (the fastest of
``--repeats``, after a warm-up call), response tokens (the ``response_mask`` sum), their mean per
row, tokens/s, and the achieved GFLOP/s counted as
``2 x non-embedding parameters x response tokens / s``: every weight matmul of a decoded token,
leaving out the embedding table (a lookup; it is tied to the LM head, whose small matmul is not
counted either), attention over the cache and the prefill. The machine's matmul peak is measured
in the same run: a timed fp32 ``1024 x 1024 @ 1024 x 1024`` matmul at the same thread count.
``--engines`` also takes ``native-forward``: the ``native`` engine with its fast decoder switched off
(``NativeRollout(fast=False)``: the same loop through the model's own forward), to see what the fast
decoder (:mod:`verl.rollout.fast_decoder`) adds; ``native-seqs`` (``max_num_seqs=--max-num-seqs``: at most
that many rows decode at once, waiting rows take the slots of finished ones) and ``native-waves`` (the
same bound kept by generating ``--max-num-seqs`` rows at a time, each call until its longest row ends),
to see what refilling slots (continuous batching) saves over waves. A measurement: nothing is asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time

import torch

CONFIGS = {
    "1M": dict(num_layers=4, hidden_size=128, intermediate_size=384, num_heads=4, num_kv_heads=2),
    "27M": dict(num_layers=8, hidden_size=512, intermediate_size=1408, num_heads=8, num_kv_heads=2),
}


def matmul_peak_gflops(size: int = 1024, repeats: int = 20) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e9


def non_embedding_params(model) -> int:
    embeddings = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in embeddings)


def make_prompts(tokenizer, count: int):
    from verl.data.collate import collate_prompts

    gen = torch.Generator().manual_seed(0)
    texts = [f"{a}+{b}=" for a, b in torch.randint(0, 1000, (count, 2), generator=gen).tolist()]
    items = [dict(input_ids=tokenizer(t)["input_ids"], raw_prompt=t, data_source="bench", ground_truth="0",
                  extra_info={}, index=i) for i, t in enumerate(texts)]
    prompts = collate_prompts(items, tokenizer.pad_token_id)
    prompts["rollout_seed"] = torch.arange(count, dtype=torch.int64)
    return prompts


def time_generate(engine, prompts, params, repeats: int = 1) -> tuple[float, int]:
    """The fastest of ``repeats`` calls (a shared machine only ever slows a call down), and its tokens."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = engine.generate(prompts, params)
        best = min(best, time.perf_counter() - start)
    return best, int(out["response_mask"].sum())


class Waves:
    """An engine run on ``rows`` rows (``rows / n`` prompts) at a time, one ``generate`` after another."""

    def __init__(self, engine, rows: int):
        self.engine, self.rows = engine, rows
        self.eos_token_ids = engine.eos_token_ids

    def generate(self, prompts, params):
        from verl.rollout import concat_rollouts

        self.engine.eos_token_ids = self.eos_token_ids
        calls = [self.engine.generate(part, params) for part in prompts.split(max(1, self.rows // params.n))]
        return concat_rollouts(calls, self.engine.pad_token_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; on a busy 2-core machine 2 threads slow small ops down many times")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per row; the fastest is kept")
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--engines", nargs="+", default=["hf", "native"],
                        help="hf, native, native-forward (native without its fast decoder), native-seqs, "
                             "native-waves, vllm")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="the row bound of native-seqs and native-waves")
    parser.add_argument("--stop-tokens", type=int, nargs="+", default=[0, 16])
    args = parser.parse_args()

    from verl.models.loading import load_causal_lm, load_tokenizer
    from verl.models.tiny import make_tiny_model_folder
    from verl.rollout import SamplingParams, build_rollout

    torch.set_num_threads(args.threads)
    peak = matmul_peak_gflops()
    print(f"machine: nproc={os.cpu_count()}, torch threads={torch.get_num_threads()}, torch {torch.__version__}; "
          f"fp32 matmul peak {peak:.1f} GFLOP/s (1024^3, same threads)")
    print(f"workload: batch/{args.n} prompts x n={args.n}, temperature 1, max_new_tokens={args.max_new_tokens}")
    engines = list(args.engines)
    if "vllm" not in engines:
        if importlib.util.find_spec("vllm") is None:
            print("vllm: not installed here; not measured (run this with .venv-vllm/bin/python: docs/vllm.md)")
        else:
            engines.append("vllm")
    print(f"{'model':>5} {'stops':>5} {'engine':>14} {'batch':>5} {'seconds':>8} {'tokens':>7} {'mean len':>8} "
          f"{'tokens/s':>9} {'GFLOP/s':>8} {'% peak':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs:
            path = make_tiny_model_folder(os.path.join(tmp, name), **CONFIGS[name])
            tokenizer = load_tokenizer(str(path))
            model = load_causal_lm(str(path)).eval()
            flops_per_token = 2 * non_embedding_params(model)
            for engine_name in engines:
                extra = {}
                if engine_name == "vllm":
                    from verl.config import TrainerConfig

                    extra = dict(model_path=str(path), rollout_config=TrainerConfig().actor_rollout_ref.rollout,
                                 max_model_len=64 + args.max_new_tokens)
                if engine_name == "native-forward":
                    from verl.rollout.native import NativeRollout

                    engine = NativeRollout(model, tokenizer, fast=False)
                elif engine_name in ("native-seqs", "native-waves"):
                    from verl.rollout.native import NativeRollout

                    engine = NativeRollout(model, tokenizer, max_num_seqs=args.max_num_seqs)
                    if engine_name == "native-waves":
                        engine = Waves(NativeRollout(model, tokenizer), args.max_num_seqs)
                else:
                    engine = build_rollout(engine_name, model, tokenizer, **extra)
                eos = list(engine.eos_token_ids)
                params = SamplingParams(max_new_tokens=args.max_new_tokens, n=args.n)
                time_generate(engine, make_prompts(tokenizer, 2), params)  # warm-up
                for stops in args.stop_tokens:
                    engine.eos_token_ids = eos + list(range(3, 3 + stops))
                    for batch in args.batches:
                        prompts = make_prompts(tokenizer, max(1, batch // args.n))
                        seconds, tokens = time_generate(engine, prompts, params, args.repeats)
                        gflops = flops_per_token * tokens / seconds / 1e9
                        print(f"{name:>5} {stops:>5} {engine_name:>14} {batch:>5} {seconds:8.2f} {tokens:7d} "
                              f"{tokens / (len(prompts) * args.n):8.1f} {tokens / seconds:9.0f} {gflops:8.2f} "
                              f"{100 * gflops / peak:5.1f}%", flush=True)


if __name__ == "__main__":
    main()
