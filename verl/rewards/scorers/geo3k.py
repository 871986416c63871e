"""Geometry3K (``hiyouga/geometry3k``, verl's vision-language example): the last ``\\boxed{}`` answer
checked against the ground truth (math-verify, as competition math), plus a format part.

score = 0.9 x correct + 0.1 x format, where format is 1 for a response shaped ``<think>...</think>``
then an answer holding a ``\\boxed{}``: verl's weighting of the two.
"""

from __future__ import annotations

import re

from verl.rewards.scorers.math_answers import extract_boxed, is_equivalent

FORMAT_WEIGHT = 0.1
_SHAPE = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", flags=re.DOTALL)


def compute_score(data_source, solution_str: str, ground_truth, extra_info=None, timeout_s: int | None = 5) -> dict:
    """``{"score", "acc", "format", "pred"}`` (module docstring)."""
    pred = extract_boxed(solution_str)
    correct = pred is not None and is_equivalent(pred, str(ground_truth).strip(), timeout_s)
    shaped = _SHAPE.fullmatch(solution_str) is not None
    return {"score": (1 - FORMAT_WEIGHT) * float(correct) + FORMAT_WEIGHT * float(shaped), "acc": float(correct),
            "format": float(shaped), "pred": pred}
