"""Format rewards: 1.0 when a response has the expected shape, whatever its answer.

They take verl's reward-function signature and ignore the ground truth, so they can be registered
as a data source's scorer or added to a correctness score in a custom reward function.
"""

from __future__ import annotations

import re

from verl.rewards.scorers.math_answers import extract_boxed

_THINK_THEN_ANSWER = re.compile(r"\s*<think>(.*?)</think>(.*)", flags=re.DOTALL)


def think_format(data_source, solution_str: str, ground_truth=None, extra_info=None) -> float:
    """1.0 for ``<think>reasoning</think>answer``: one think block at the start, then a non-empty
    answer with no further think tags. The reasoning may be empty (a model told not to think)."""
    match = _THINK_THEN_ANSWER.fullmatch(solution_str)
    if match is None:
        return 0.0
    reasoning, answer = match.groups()
    if "<think>" in reasoning or "<think>" in answer or "</think>" in answer or not answer.strip():
        return 0.0
    return 1.0


def boxed_format(data_source, solution_str: str, ground_truth=None, extra_info=None) -> float:
    """1.0 when the response holds a non-empty ``\\boxed{...}`` (or ``\\fbox{...}``)."""
    return 0.0 if extract_boxed(solution_str) is None else 1.0
