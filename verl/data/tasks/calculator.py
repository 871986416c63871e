"""Multiplication with a calculator: ``123*45=`` -> ``5535``. The built-in agentic task.

A 3-digit times a 2-digit number is beyond the tiny model, but not with the ``calculator`` tool
(:mod:`verl.tools.builtin`): the model calls it, reads the result and answers. Its warm start
teaches the tool-use conversations (:func:`sft_messages`), then mostly direct answers
(:func:`direct_messages`); RL then learns to call the tool. Every pair (a, b) is either a training or a
held-out pair, by a fixed hash of the pair.
"""

from __future__ import annotations

import json
import random

from verl.data.tasks.addition import pair_rows, split_pairs

DATA_SOURCE = "builtin/calculator"
TRAIN_ROWS, TEST_ROWS = 4000, 200  # of 81,000 pairs: plenty for training; a quick validation


def pairs(split: str) -> list[tuple[int, int]]:
    """The (a, b) pairs of ``split`` (a fixed sample of them, in a fixed order); a pair is held out by
    the addition task's fixed hash, so the split never depends on a seed."""
    chosen = split_pairs(split, range(100, 1000), range(10, 100))
    return random.Random(0).sample(chosen, TEST_ROWS if split == "test" else TRAIN_ROWS)


def tool_call(a: int, b: int) -> str:
    """The call the model learns to write (Hermes format)."""
    return "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": f"{a}*{b}"}}) + "</tool_call>"


def make_rows(split: str, n: int | None = None, seed: int = 0) -> list[dict]:
    return pair_rows(pairs(split), split, n, seed, DATA_SOURCE, lambda a, b: f"{a}*{b}=", lambda a, b: a * b)


def sft_messages(row: dict) -> list[dict]:
    """The worked conversation after the prompt: the call, the tool's result, the answer."""
    a, b = row["extra_info"]["a"], row["extra_info"]["b"]
    product = str(a * b)
    return [{"role": "assistant", "content": tool_call(a, b)}, {"role": "tool", "content": product},
            {"role": "assistant", "content": product}]


def direct_messages(row: dict) -> list[dict]:
    """The product answered at once, without the tool: what a model tuned without tools is taught (the
    tiny model cannot compute it, so it learns to guess). The warm start's second phase mixes these
    with :func:`sft_messages` so that RL starts from a model that seldom calls the tool."""
    return [{"role": "assistant", "content": str(row["extra_info"]["a"] * row["extra_info"]["b"])}]


def final_answer(solution_str: str) -> str:
    """The last line of the response, without an ``A:`` marker: the answer after any tool results."""
    lines = solution_str.strip().splitlines()
    last = lines[-1].strip() if lines else ""
    return last[2:].strip() if last.startswith("A:") else last


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """1.0 when the final answer is exactly the product, else 0.0 (a call alone earns nothing)."""
    answer = final_answer(solution_str)
    return 1.0 if "<tool_call>" not in answer and answer == str(ground_truth).strip() else 0.0
