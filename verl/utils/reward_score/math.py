"""verl's ``verl.utils.reward_score.math`` (competition math, ``\\boxed{}`` answers), with verl's
signatures. Answers are compared by this project's scorer (:mod:`verl.rewards.scorers.math_answers`,
math-verify), where verl compares normalised strings: ``0.5`` and ``\\frac{1}{2}`` are equal here."""

from __future__ import annotations

from verl.rewards.scorers import math_answers as _math


def last_boxed_only_string(string: str) -> str | None:
    """The last ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed x``) of ``string``, box included, as
    :func:`remove_boxed` takes it; None when there is none, it never closes or it is empty."""
    box = _math.last_box(string)
    return box[0] if box is not None and box[1].strip() else None


def remove_boxed(s: str) -> str:
    """The content of a box that :func:`last_boxed_only_string` returned."""
    for command in ("\\boxed ", "\\boxed{", "\\fbox{"):
        if s.startswith(command):
            return s[len(command):-1] if command.endswith("{") and s.endswith("}") else s[len(command):]
    raise ValueError(f"not a boxed answer: {s!r}")


def is_equiv(str1: str | None, str2: str | None, verbose: bool = False) -> bool:
    """Whether two answers (box contents) are the same answer."""
    if str1 is None or str2 is None:
        return str1 is None and str2 is None
    return _math.is_equivalent(str1, str2)


def compute_score(solution_str: str, ground_truth) -> float:
    """1.0 when the last boxed answer equals ``ground_truth``, else 0.0 (no box: 0.0)."""
    return float(_math.compute_score(None, solution_str, ground_truth)["score"])
