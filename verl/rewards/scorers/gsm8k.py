"""GSM8K answers: the number after ``####`` (strict) or the last number in the text (flexible).

GSM8K solutions end with a line ``#### 72``; a model trained on the GSM8K preprocessing prompt is
asked to do the same. Numbers are compared as exact decimals after dropping ``$`` signs and
thousands commas, so ``$1,234`` equals ``1234`` and ``3.50`` equals ``3.5``.

This module imports nothing from ``verl.data``: built-in tasks import it from their scorers.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

METHODS = ("strict", "flexible")

# A number: thousands groups (1,234,567) or plain digits, an optional fraction part. The lookahead
# keeps "1,2345" from reading as "1,234" followed by "5".
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")
_FINAL = re.compile(r"####[ \t]*(-?)[ \t]*\$?[ \t]*(-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?)")


def _normalise(number: str) -> str:
    return number.replace(",", "").replace("$", "")


def extract_solution(text: str, method: str = "strict") -> str | None:
    """The final answer of ``text`` as a plain number string (no commas or ``$``), or None.

    strict: the number right after the last ``####``. flexible: the last number anywhere.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "strict":
        matches = _FINAL.findall(text)
        if not matches:
            return None
        sign, number = matches[-1]
        return _normalise(sign + number)
    numbers = _NUMBER.findall(text.replace("$", ""))
    return _normalise(numbers[-1]) if numbers else None


def _same_number(a: str, b: str) -> bool:
    try:
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return a == b


def reference(ground_truth) -> str | None:
    """The number a response is compared with: the ground truth, or, where it is a worked solution (the raw
    ``answer`` column of openai/gsm8k, used without the preprocessing script), the number after its last ``####``."""
    text = str(ground_truth).strip()
    return extract_solution(text, "strict") if "####" in text else _normalise(text)


def ground_truth_problem(ground_truth) -> str | None:
    """Why no response can ever match ``ground_truth``, or None when one can."""
    number = reference(ground_truth)
    try:
        Decimal(number)
        return None
    except (InvalidOperation, TypeError):
        return f"{str(ground_truth)!r:.100} is not a number, nor a solution ending '#### <number>'"


def compute_score(data_source, solution_str: str, ground_truth, extra_info=None, method: str = "strict",
                  format_score: float = 0.0, score: float = 1.0) -> float:
    """``score`` for the right answer, ``format_score`` for a wrong one, 0.0 when none is found."""
    answer, expected = extract_solution(solution_str, method), reference(ground_truth)
    if answer is None or expected is None:
        return 0.0
    return float(score) if _same_number(answer, expected) else float(format_score)


def compute_score_flexible(data_source, solution_str: str, ground_truth, extra_info=None) -> float:
    """:func:`compute_score` with ``method="flexible"``: the last number in the response counts."""
    return compute_score(data_source, solution_str, ground_truth, extra_info, method="flexible")
