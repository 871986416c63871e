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


def compute_score(data_source, solution_str: str, ground_truth, extra_info=None, method: str = "strict",
                  format_score: float = 0.0, score: float = 1.0) -> float:
    """``score`` for the right answer, ``format_score`` for a wrong one, 0.0 when none is found."""
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return float(score) if _same_number(answer, _normalise(str(ground_truth).strip())) else float(format_score)


def compute_score_flexible(data_source, solution_str: str, ground_truth, extra_info=None) -> float:
    """:func:`compute_score` with ``method="flexible"``: the last number in the response counts."""
    return compute_score(data_source, solution_str, ground_truth, extra_info, method="flexible")
