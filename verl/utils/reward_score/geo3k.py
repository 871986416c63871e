"""verl's ``verl.utils.reward_score.geo3k`` (Geometry3K), with verl's signature: the answer checked
by math-verify (:mod:`verl.rewards.scorers.geo3k`), weighted with the ``<think>...</think>`` format."""

from __future__ import annotations

from verl.rewards.scorers import geo3k as _geo3k
from verl.rewards.scorers.math_answers import is_equivalent


def compute_score(predict_str: str, ground_truth, use_boxed: bool = True, format_score: float = 0.1) -> float:
    """``(1 - format_score) x correct + format_score x format``; with ``use_boxed=False`` the whole
    response is the answer."""
    parts = _geo3k.compute_score(None, predict_str, ground_truth)
    correct = parts["acc"] if use_boxed else float(is_equivalent(predict_str.strip(), str(ground_truth).strip()))
    return (1 - format_score) * correct + format_score * parts["format"]
