"""Two-digit addition: ``37+48=`` -> ``85``. The built-in demo task.

Every pair (a, b) with 10 <= a, b <= 99 is either a training or a held-out pair, decided by a
fixed hash of the pair, so held-out accuracy measures generalisation to sums never trained on.
"""

from __future__ import annotations

import random
from typing import Callable

DATA_SOURCE = "builtin/addition"
HELD_OUT_FRACTION = 0.1


def is_held_out_pair(a: int, b: int, fraction: float = HELD_OUT_FRACTION) -> bool:
    # A fixed multiplicative hash: the split never depends on the seed or on Python's hash salt.
    return ((a * 7919 + b * 104729) % 1000) < fraction * 1000


def split_pairs(split: str, a_range: range, b_range: range) -> list[tuple[int, int]]:
    """All (a, b) pairs of ``split`` ("train" or "test") over the two ranges, in a fixed order."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    want_test = split == "test"
    return [(a, b) for a in a_range for b in b_range if is_held_out_pair(a, b) == want_test]


def pairs(split: str) -> list[tuple[int, int]]:
    """All (a, b) pairs of ``split`` ("train" or "test"), in a fixed order."""
    return split_pairs(split, range(10, 100), range(10, 100))


def prompt_text(a: int, b: int) -> str:
    return f"{a}+{b}="


def make_rows(split: str, n: int | None = None, seed: int = 0) -> list[dict]:
    """Rows in verl's layout. ``n`` rows sampled without replacement (all pairs when None)."""
    return pair_rows(pairs(split), split, n, seed, DATA_SOURCE, prompt_text, lambda a, b: a + b)


def pair_rows(chosen: list[tuple[int, int]], split: str, n: int | None, seed: int, data_source: str,
              prompt: Callable[[int, int], str], answer: Callable[[int, int], int]) -> list[dict]:
    """verl-layout rows of arithmetic on pairs (a, b): ``n`` of ``chosen`` sampled without replacement
    (all when None), each asking ``prompt(a, b)`` with ground truth ``answer(a, b)``."""
    if n is not None:
        chosen = random.Random(seed).sample(chosen, min(n, len(chosen)))
    return [
        {
            "data_source": data_source,
            "prompt": [{"role": "user", "content": prompt(a, b)}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(answer(a, b))},
            "extra_info": {"split": split, "index": i, "a": a, "b": b},
        }
        for i, (a, b) in enumerate(chosen)
    ]


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """1.0 when the response is exactly the sum (surrounding whitespace ignored), else 0.0."""
    return 1.0 if solution_str.strip() == str(ground_truth).strip() else 0.0
