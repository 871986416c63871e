"""verl's ``verl.utils.reward_score.math_dapo`` (the DAPO recipe's scorer), with verl's signatures:
the last ``Answer:`` line, Minerva-normalised (:mod:`verl.rewards.scorers.math_dapo`), or with
``strict_box_verify=True`` the last ``\\boxed{}`` of the response's end, compared as text."""

from __future__ import annotations

from verl.rewards.scorers import math_dapo as _dapo
from verl.rewards.scorers.math_answers import extract_boxed

STRICT_TAIL_CHARS = 100  # the strict check reads the last 100 characters (after the last pause token, if given)

normalize_final_answer = _dapo.normalize_answer


def compute_score(solution_str: str, ground_truth, strict_box_verify: bool = False,
                  pause_tokens_index: list[int] | None = None) -> dict:
    """``{"score": 1.0 or -1.0, "acc": bool, "pred": the answer read}``."""
    if not strict_box_verify:
        return _dapo.compute_score(None, solution_str, ground_truth)
    if pause_tokens_index is not None:
        if len(pause_tokens_index) != 4:
            raise ValueError(f"pause_tokens_index must hold 4 positions, got {pause_tokens_index!r}")
        tail = solution_str[pause_tokens_index[-1] - STRICT_TAIL_CHARS:]
    else:
        tail = solution_str[-STRICT_TAIL_CHARS:]
    pred = extract_boxed(tail)
    right = pred is not None and pred == str(ground_truth)
    return {"score": 1.0 if right else -1.0, "acc": right, "pred": pred}
