"""Shared prompts (``actor_rollout_ref.actor.use_prefix_grouper``) against the plain forward: the
actor's update and the reference's log-prob pass, side by side in one process, by shape.

    python benchmarks/bench_shared_prompts.py [--repeats 4] [--shapes demo trl calculator long]
    python benchmarks/bench_shared_prompts.py --shape 16x8x64x128        # prompts x n x prompt x response
    python benchmarks/bench_shared_prompts.py --shapes demo --compile    # + the plain update compiled

Each shape is G prompts x n samples, prompt lengths drawn in [T_prompt / 2, T_prompt] (left-padded),
response lengths in [1, T_resp] (right-padded), through the built-in tiny Qwen2 (0.8M parameters,
fp32, 1 thread): ``Actor.update`` (one mini-batch, one micro-batch: forward, backward, AdamW, with
the KL loss) and ``PolicyModel.compute_log_prob`` (no gradients), plain and shared alternated
``--repeats`` times after one warm-up each. Times are process CPU seconds (steadier than wall time on
a shared machine; with one thread they are the same on an idle one), the median over the repeats.
The two ways' log-probs are compared on every shape (max difference printed).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

SHAPES = {  # name: (prompts, samples per prompt, prompt tokens, response tokens)
    "demo": (32, 8, 16, 6),          # python -m verl.trainer.main_ppo (addition)
    "trl": (4, 8, 13, 32),           # benchmarks/bench_vs_trl.py
    "calculator": (16, 8, 32, 112),  # data.builtin_task=calculator
    "long": (8, 8, 128, 64),         # a long prompt, a short answer
}


def make_batch(groups: int, n: int, prompt: int, response: int, seed: int = 0):
    from verl.protocol import Batch

    g = torch.Generator().manual_seed(seed)
    rows = groups * n
    prompt_len = torch.randint(max(1, prompt // 2), prompt + 1, (groups,), generator=g).repeat_interleave(n)
    response_len = torch.randint(1, response + 1, (rows,), generator=g)
    ids = torch.randint(3, 250, (rows, prompt + response), generator=g)
    ids[:, :prompt] = ids[::n, :prompt].repeat_interleave(n, 0)
    mask = torch.zeros(rows, prompt + response, dtype=torch.long)
    for i in range(rows):
        mask[i, prompt - prompt_len[i]:prompt + response_len[i]] = 1
    ids = ids * mask
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
                  "responses": ids[:, prompt:], "response_mask": mask[:, prompt:].float(),
                  "advantages": torch.randn(rows, response, generator=g),
                  "old_log_probs": -5 * torch.rand(rows, response, generator=g),
                  "ref_log_prob": -5 * torch.rand(rows, response, generator=g)})


def compiled_update(shape: tuple[int, int, int, int], repeats: int) -> dict:
    """The plain update with the model under ``torch.compile`` (inductor, static shapes): seconds of the
    first call (the compilation) and the median of the following ones."""
    from verl.config import TrainerConfig
    from verl.models.loading import load_causal_lm
    from verl.models.tiny import builtin_model_path
    from verl.workers.actor import Actor

    batch = make_batch(*shape)
    actor_cfg = TrainerConfig.from_cli(["actor_rollout_ref.actor.use_kl_loss=true"]).actor_rollout_ref.actor
    torch.manual_seed(0)
    model = torch.compile(load_causal_lm(str(builtin_model_path())), dynamic=False)
    actor = Actor(model, actor_cfg, torch.device("cpu"), samples_per_mini_batch=len(batch), total_steps=None,
                  share_prompts=False)
    start = time.perf_counter()
    actor.update(batch)
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.process_time()
        actor.update(batch)
        times.append(time.process_time() - start)
    return {"compile_s": first, "update": statistics.median(times)}


def measure(shape: tuple[int, int, int, int], repeats: int) -> dict:
    from verl.config import TrainerConfig
    from verl.models.loading import load_causal_lm
    from verl.models.tiny import builtin_model_path
    from verl.workers.actor import Actor, PolicyModel

    batch = make_batch(*shape)
    actor_cfg = TrainerConfig.from_cli(["actor_rollout_ref.actor.use_kl_loss=true"]).actor_rollout_ref.actor
    cpu = torch.device("cpu")
    roles = {}
    for share in (False, True):
        torch.manual_seed(0)
        roles[share] = (Actor(load_causal_lm(str(builtin_model_path())), actor_cfg, cpu, samples_per_mini_batch=len(batch),
                              total_steps=None, share_prompts=share),
                        PolicyModel(load_causal_lm(str(builtin_model_path())), cpu, share_prompts=share))
    times = {share: {"update": [], "log_prob": []} for share in roles}
    log_probs = {}
    for repeat in range(repeats + 1):
        for share, (actor, ref) in roles.items():
            start = time.process_time()
            log_probs[share] = ref.compute_log_prob(batch)[0]
            middle = time.process_time()
            actor.update(batch)
            end = time.process_time()
            if repeat:  # the first round warms up
                times[share]["log_prob"].append(middle - start)
                times[share]["update"].append(end - middle)
    seen = batch["response_mask"].bool()
    return {"times": {share: {k: statistics.median(v) for k, v in t.items()} for share, t in times.items()},
            "max_log_prob_diff": (log_probs[True] - log_probs[False])[seen].abs().max().item(),
            "tokens": int(batch["attention_mask"].sum())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--shape", action="append", default=[], help="GxNxPxR, e.g. 16x8x64x128")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--compile", action="store_true", help="also time the plain update under torch.compile")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    shapes = [(name, SHAPES[name]) for name in args.shapes]
    shapes += [(text, tuple(int(x) for x in text.split("x"))) for text in args.shape]
    print(f"torch {torch.__version__}, 1 thread, process CPU seconds, median of {args.repeats}")
    print("| shape (prompts x n, prompt, response) | update plain | update shared | ratio "
          "| log-prob plain | log-prob shared | ratio | max log-prob diff |")
    print("|---|---|---|---|---|---|---|---|")
    for name, shape in shapes:
        result = measure(shape, args.repeats)
        plain, shared = result["times"][False], result["times"][True]
        g, n, p, r = shape
        print(f"| {name} ({g} x {n}, {p}, {r}) | {plain['update']:.3f} s | {shared['update']:.3f} s | "
              f"{shared['update'] / plain['update']:.2f}x | {plain['log_prob']:.3f} s | {shared['log_prob']:.3f} s | "
              f"{shared['log_prob'] / plain['log_prob']:.2f}x | {result['max_log_prob_diff']:.1e} |", flush=True)
        if args.compile:
            compiled = compiled_update(shape, args.repeats)
            print(f"|   torch.compile'd plain update: {compiled['update']:.3f} s "
                  f"({compiled['update'] / plain['update']:.2f}x), first call {compiled['compile_s']:.1f} s wall |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
