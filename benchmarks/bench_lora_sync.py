"""What a weight sync of a LoRA policy costs an asynchronous run: merged weights against the adapters
alone (``actor_rollout_ref.model.lora.merge``, docs/async.md "Weight sync").

    python benchmarks/bench_lora_sync.py [--hidden 896] [--layers 24] [--inter 4864] [--vocab 151936]
                                         [--rank 8] [--dtype bfloat16] [--repeats 3]

The defaults are Qwen2.5-0.5B's shape (random weights; about 494M parameters). For each way, one sync
as the run does it: the trainer turns its state dict into the message (merging the adapters in, or
picking them out) and packs it for the rollout process (``shm``: a copy into shared memory); the
rollout turns the message into full weights (for adapters: merged into the base it got once) and
loads them into its model. Printed: bytes sent, the trainer's and the rollout's seconds (median of
``--repeats``), one thread. A measurement: nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace


def build(args):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl.models.lora import apply_lora

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=args.hidden, num_hidden_layers=args.layers, intermediate_size=args.inter,
                         vocab_size=args.vocab, num_attention_heads=max(1, args.hidden // 64),
                         num_key_value_heads=max(1, args.hidden // 448), tie_word_embeddings=True)
    dtype = getattr(torch, args.dtype)
    plain = Qwen2ForCausalLM(config).to(dtype).requires_grad_(False)
    settings = SimpleNamespace(lora_adapter_path=None, target_modules="all-linear", exclude_modules=None,
                               lora_rank=args.rank, lora_alpha=2 * args.rank, enable_gradient_checkpointing=False)
    import copy

    policy = apply_lora(copy.deepcopy(plain), settings)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.01)  # trained adapters: B is no longer zero
    return plain, policy


def median_seconds(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def measure(args) -> dict[str, tuple[int, float, float]]:
    import torch

    from verl.distributed.weight_sync import WeightSender, unpack
    from verl.models.lora import merged_weights
    from verl.models.lora_sync import AdapterMerger, adapter_state

    torch.set_num_threads(1)
    plain, policy = build(args)
    sender = WeightSender("shm")
    state = policy.state_dict()
    rows = {}

    def trainer_merged():
        return sender.pack(merged_weights(policy, state), 1)[0]

    seconds, message = median_seconds(trainer_merged, args.repeats)
    load = lambda: plain.load_state_dict(unpack(message))  # noqa: E731
    rows["merged"] = (message.nbytes, seconds, median_seconds(load, args.repeats)[0])

    merger = AdapterMerger()
    merger.weights(unpack(sender.pack(adapter_state(policy, state, with_base=True), 0)[0]))  # the first sync

    def trainer_adapters():
        return sender.pack(adapter_state(policy, state, with_base=False), 1)[0]

    seconds, message = median_seconds(trainer_adapters, args.repeats)
    load = lambda: plain.load_state_dict(merger.weights(unpack(message)))  # noqa: E731
    rows["adapters"] = (message.nbytes, seconds, median_seconds(load, args.repeats)[0])
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--inter", type=int, default=4864)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rows = measure(args)
    print(f"LoRA rank {args.rank} on every linear layer; hidden {args.hidden}, {args.layers} layers, {args.dtype}")
    print(f"{'sync':<10}{'bytes sent':>14}{'trainer s':>12}{'rollout s':>12}")
    for name, (nbytes, trainer_s, rollout_s) in rows.items():
        print(f"{name:<10}{nbytes:>14,}{trainer_s:>12.3f}{rollout_s:>12.3f}")
    merged, adapters = rows["merged"], rows["adapters"]
    print(f"{'adapters/merged':<16}{adapters[0] / merged[0]:>8.4f}{adapters[1] / merged[1]:>12.3f}"
          f"{adapters[2] / merged[2]:>12.3f}")
    return rows


if __name__ == "__main__":
    main()
