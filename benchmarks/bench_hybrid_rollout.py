"""The hybrid engine's rollout: decoding with the actor's FSDP-sharded weights vs an unwrapped copy.

    python benchmarks/bench_hybrid_rollout.py [--prompts 8] [--n 8] [--max-new-tokens 32] [--repeats 5]

The built-in model generates with `HFRollout` four ways, alternated, and the median tokens/s of
each is printed (a measurement, never asserted):

* unwrapped: the plain model, no FSDP: the target;
* twin: the rollout of the worker (`verl.distributed.fsdp.gathered`): full weights gathered once,
  decoding with an empty twin of the model that holds the gathered tensors, no FSDP hook;
* gathered once: the FSDP module decoding with its weights unsharded for the whole rollout
  (`fsdp.unsharded`): no collective per token, but FSDP's hooks on every forward;
* per token: the FSDP module as it is, gathering (and freeing) every block's weights each token.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time

import torch

from verl.config import TrainerConfig
from verl.data.collate import collate_prompts
from verl.distributed.fsdp import gathered, parallelize, shadow_of, unsharded
from verl.models.loading import load_causal_lm, load_tokenizer
from verl.models.tiny import builtin_model_path
from verl.rollout import HFRollout, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    path = str(builtin_model_path())
    tokenizer = load_tokenizer(path)
    plain = load_causal_lm(path)
    twin = shadow_of(plain)
    wrapped = parallelize(copy.deepcopy(plain), TrainerConfig().actor_rollout_ref.actor.fsdp_config, device="cpu")
    items = [dict(input_ids=tokenizer(f"{i}+{3 * i}=")["input_ids"], raw_prompt="", data_source="b",
                  ground_truth="", extra_info={}, index=i) for i in range(args.prompts)]
    prompts = collate_prompts(items, tokenizer.pad_token_id)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, n=args.n)
    ways = {
        "unwrapped": (HFRollout(plain, tokenizer), contextlib.nullcontext),
        "twin (the worker's)": (HFRollout(twin, tokenizer, device="cpu"), lambda: gathered(wrapped, twin)),
        "FSDP, gathered once": (HFRollout(wrapped, tokenizer), lambda: unsharded(wrapped)),
        "FSDP, per token": (HFRollout(wrapped, tokenizer), contextlib.nullcontext),
    }
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, (engine, context) in ways.items():
            start = time.perf_counter()
            with context():
                out = engine.generate(prompts, params)
            rates[name].append(int(out["response_mask"].sum()) / (time.perf_counter() - start))
    base = statistics.median(rates["unwrapped"])
    print(f"batch {args.prompts} x {args.n}, up to {args.max_new_tokens} new tokens, {args.threads} thread(s), "
          f"median of {args.repeats}")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"{name:<22}{rate:>10,.0f} tokens/s {rate / base:>6.2f}x")


if __name__ == "__main__":
    main()
