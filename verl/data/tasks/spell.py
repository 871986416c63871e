"""Spelling a number digit by digit: ``spell 4831`` -> ``four eight three one``. The built-in task
whose answers vary in length with a long tail.

Most numbers are short and a few are long (1 to 12 digits, the longer the rarer: ``LENGTH_WEIGHTS``),
so a batch's responses run from 3 to about 60 characters and its last response decides how long
generation takes: the workload asynchronous RL is for (docs/async.md, benchmarks/bench_async.py).
Each number is a training or a held-out number by a fixed hash of its digits.

Scoring (``compute_score``) is graded, word by word: the share of the answer's words that are right,
in place, over the longer of the answer and the response (``1.0`` exactly right; extra or missing
words cost as wrong ones).
"""

from __future__ import annotations

import random
import zlib

DATA_SOURCE = "builtin/spell"
HELD_OUT_FRACTION = 0.1
TRAIN_ROWS, TEST_ROWS = 4000, 200
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# Relative frequency of 1, 2, ..., 12 digits: the long tail.
LENGTH_WEIGHTS = (16, 14, 12, 10, 8, 6, 5, 4, 3, 2, 2, 2)


def is_held_out(number: str) -> bool:
    return zlib.crc32(number.encode()) % 1000 < HELD_OUT_FRACTION * 1000


def spelled(number: str) -> str:
    return " ".join(WORDS[int(d)] for d in number)


def numbers(split: str, count: int, seed: int = 0) -> list[str]:
    """``count`` numbers of ``split``, their lengths drawn by ``LENGTH_WEIGHTS`` (a short number may
    come more than once: there are only ten of one digit)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng = random.Random(f"spell-{split}-{seed}")
    chosen: list[str] = []
    while len(chosen) < count:
        digits = rng.choices(range(1, len(LENGTH_WEIGHTS) + 1), weights=LENGTH_WEIGHTS)[0]
        number = str(rng.randrange(10 ** (digits - 1) if digits > 1 else 0, 10 ** digits))
        if is_held_out(number) == (split == "test"):
            chosen.append(number)
    return chosen


def make_rows(split: str, n: int | None = None, seed: int = 0) -> list[dict]:
    count = n if n is not None else (TEST_ROWS if split == "test" else TRAIN_ROWS)
    return [{"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": f"spell {number}"}],
             "ability": "spelling", "reward_model": {"style": "rule", "ground_truth": spelled(number)},
             "extra_info": {"split": split, "index": i, "number": number}}
            for i, number in enumerate(numbers(split, count, seed))]


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """The share of the answer's words right in place, over the longer of answer and response."""
    truth, said = str(ground_truth).split(), solution_str.split()
    if not truth:
        return float(not said)
    right = sum(a == b for a, b in zip(truth, said))
    return right / max(len(truth), len(said))
