"""Competition-math answers: the last ``\\boxed{...}`` of a response, checked with math-verify.

The answer is taken out of the response here (so the logged ``pred`` is exactly what was graded),
then both it and the ground truth are parsed by math-verify as a boxed LaTeX expression and
compared symbolically: ``\\frac12``, ``0.5`` and ``\\dfrac{1}{2}`` are the same answer, as are
``2x+1`` and ``1+2x``.

Timeouts: math-verify bounds each parse and comparison with ``signal.alarm``, which Python allows
only in the main thread. There the scorer keeps math-verify's timeout (``timeout_s``); in any other
thread it turns the timeout off instead of failing, so a pathological expression can then run
long. Score in the main thread (verl's reward manager does) to keep the bound.

The module is named ``math_answers`` rather than ``math`` so that it can never be mistaken for the
standard library's ``math``. It imports nothing from ``verl.data``.
"""

from __future__ import annotations

import threading

from verl.errors import RewardError

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _math_verify():
    try:
        import math_verify
    except ImportError:
        raise RewardError("the math scorer needs the math-verify library: pip install math-verify "
                          "(or pip install 'verl[math]')") from None
    return math_verify


def _braced(text: str, start: int) -> str | None:
    """The text inside the brace group opening at ``text[start] == "{"``; None when it never closes."""
    depth = 0
    i = start
    while i < len(text):
        char = text[i]
        if char == "\\":  # an escaped brace (\{ \}) does not open or close a group
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1:i]
        i += 1
    return None


def last_box(text: str) -> tuple[str, str] | None:
    """The last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x`` in ``text`` as ``(the box as written, its
    content)``: ``("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}")``, ``("\\boxed 5", "5")``. None when there is no
    box or it never closes."""
    start, command = max((text.rfind(c), c) for c in _BOX_COMMANDS)
    if start < 0:
        return None
    rest = start + len(command)
    if text.startswith("{", rest):
        content = _braced(text, rest)
        return None if content is None else (text[start:rest + len(content) + 2], content)
    if text.startswith(" ", rest):
        # "\boxed 5": the argument is the next run of characters up to a space or the closing "$".
        words = text[rest:].split("$")[0].split()
        return (f"{command} {words[0]}", words[0]) if words else None
    return None


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x`` in ``text``.

    Nested braces are kept whole (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``). None when there is
    no box, the box never closes, or it is empty.
    """
    box = last_box(text)
    content = box[1].strip() if box is not None else ""
    return content or None


def _timeout_s(timeout_s: int | None) -> int | None:
    # signal.alarm raises in any thread but the main one; there, run without math-verify's bound.
    return timeout_s if threading.current_thread() is threading.main_thread() else None


def is_equivalent(pred: str, gold: str, timeout_s: int | None = 5) -> bool:
    """Whether two LaTeX answers (box contents, without ``\\boxed``) are the same math-verify answer."""
    math_verify = _math_verify()
    timeout_s = _timeout_s(timeout_s)
    parsed_gold = math_verify.parse(f"$\\boxed{{{gold}}}$", parsing_timeout=timeout_s)
    parsed_pred = math_verify.parse(f"$\\boxed{{{pred}}}$", parsing_timeout=timeout_s)
    return bool(math_verify.verify(parsed_gold, parsed_pred, timeout_seconds=timeout_s))


def compute_score(data_source, solution_str: str, ground_truth, extra_info=None,
                  timeout_s: int | None = 5) -> dict:
    """``{"score": 1.0 or 0.0, "pred": the last boxed answer or None}``.

    ``ground_truth`` is the answer itself (``"\\frac{1}{2}"``), as the MATH preprocessing writes it.
    A response with no box scores 0.0.
    """
    pred = extract_boxed(solution_str)
    if pred is None:
        return {"score": 0.0, "pred": None}
    return {"score": 1.0 if is_equivalent(pred, str(ground_truth).strip(), timeout_s) else 0.0, "pred": pred}
