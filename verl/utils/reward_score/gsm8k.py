"""verl's ``verl.utils.reward_score.gsm8k``: the number after ``####`` (``method="strict"``) or the last
number (``"flexible"``), with verl's signatures, scored by :mod:`verl.rewards.scorers.gsm8k`."""

from __future__ import annotations

from verl.rewards.scorers import gsm8k as _gsm8k


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The final answer of ``solution_str`` as a plain number string, or None."""
    return _gsm8k.extract_solution(solution_str, method)


def compute_score(solution_str: str, ground_truth, method: str = "strict", format_score: float = 0.0,
                  score: float = 1.0) -> float:
    """``score`` for the right answer, ``format_score`` for a wrong one, 0.0 when there is none."""
    return _gsm8k.compute_score(None, solution_str, ground_truth, method=method, format_score=format_score,
                                score=score)
