"""One process: the actor's update with its model plain (what ``parallelize`` does over one rank when FSDP
would change no number) against the same model wrapped in FSDP2 over the one-rank group.

    .venv/bin/python benchmarks/bench_one_rank.py                      # the built-in model, 256 and 32 rows
    .venv/bin/python benchmarks/bench_one_rank.py --rows 64 --threads 2

Each update is a forward and backward over ``rows`` x 22 tokens (the demo's 16-token prompts and 6-token
responses) and an AdamW step; the two models start from the same weights and take the same steps, so
the benchmark also prints the largest weight difference between them at the end (0 when they compute
the same numbers). Times are wall seconds per update, the median of the timed updates after 3 untimed
ones, the two ways alternated.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch


def build(rows: int, seed: int = 0):
    from verl.models.tiny import builtin_model_path
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(builtin_model_path(), dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (rows, 22))
    return model, ids


def trainer(model, ids):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        start = time.perf_counter()
        logits = model(input_ids=ids, use_cache=False).logits[:, 15:-1]
        loss = -torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 16:, None]).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - start

    return step


def measure(rows: int, steps: int) -> dict:
    from verl.config import TrainerConfig
    from verl.distributed.fsdp import full_state_dict, parallelize

    fsdp_config = TrainerConfig().actor_rollout_ref.actor.fsdp_config
    base, ids = build(rows)
    models = {"plain": parallelize(copy.deepcopy(base), fsdp_config, device="cpu"),
              "fsdp": parallelize(copy.deepcopy(base), fsdp_config, device="cpu", plain_when_alone=False)}
    steps_of = {name: trainer(model, ids) for name, model in models.items()}
    times = {name: [] for name in models}
    for i in range(3 + steps):
        for name, step in steps_of.items():
            took = step()
            if i >= 3:
                times[name].append(took)
    plain, fsdp = (full_state_dict(models[name]) for name in ("plain", "fsdp"))
    diff = max((plain[k] - fsdp[k]).abs().max().item() for k in plain)
    return {"plain": statistics.median(times["plain"]), "fsdp": statistics.median(times["fsdp"]), "diff": diff}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[256, 32])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10, help="timed updates per way")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from verl.distributed.process_group import ensure_process_group

    ensure_process_group()
    print(f"torch {torch.__version__}, {args.threads} thread(s), wall seconds per update, median of {args.steps}")
    print("| rows x tokens | plain | FSDP2 over one rank | FSDP / plain | max weight difference |")
    print("|---|---|---|---|---|")
    for rows in args.rows:
        r = measure(rows, args.steps)
        print(f"| {rows} x 22 | {r['plain']:.4f} s | {r['fsdp']:.4f} s | {r['fsdp'] / r['plain']:.2f}x | {r['diff']:.1e} |",
              flush=True)


if __name__ == "__main__":
    main()
