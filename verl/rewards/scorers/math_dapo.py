"""DAPO's math answers (verl's ``math_dapo`` scorer): the last ``Answer: ...`` line, normalised, equal to
the ground truth. verl picks it for the data sources ``math_dapo``, ``math_dapo_reasoning`` and every
one that starts with ``aime`` (the DAPO recipe's DAPO-Math-17k and AIME files).

As in verl:

* only the last 300 characters of the response are read;
* the answer is the text after the last ``Answer:`` (any case), up to the end of its line;
* answer and ground truth are normalised the Minerva way (Lewkowycz et al. 2022, as in EleutherAI's
  lm-evaluation-harness): the part after the last ``=``, units and filler words dropped, ``\\text{}``,
  ``\\boxed{}`` and ``$`` unwrapped, ``\\frac12`` written ``\\frac{1}{2}``, ``1,000`` written ``1000``;
  then compared as text;
* the score is 1.0 when they are equal and -1.0 otherwise (no answer included), returned as
  ``{"score", "acc", "pred"}`` (``acc``: right or not; ``pred``: the normalised answer).
"""

from __future__ import annotations

import re
from typing import Any

TAIL_CHARS = 300
ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
NO_ANSWER = "[INVALID]"

# Replaced in order, then removed (the Minerva normalisation's tables).
_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
            (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_REMOVE = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
           "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
           "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
           "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
           ",\\!", "{,}", '"', "\\dots")
# (pattern, replacement) applied in order after the tables.
_REWRITE = ((r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$"), (r"(\\text\{)(.*?)(\})", r"\2"), (r"(\\textbf\{)(.*?)(\})", r"\2"),
            (r"(\\overline\{)(.*?)(\})", r"\2"), (r"(\\boxed\{)(.*)(\})", r"\2"),
            (r"(frac)([^{])(.)", r"frac{\2}{\3}"), (r"(sqrt)([^{])", r"sqrt{\2}"))


def normalize_answer(text: str) -> str:
    """A final answer in the form two answers are compared in (see the module doc)."""
    text = text.split("=")[-1]
    for old, new in _REPLACE:
        text = text.replace(old, new)
    for word in _REMOVE:
        text = text.replace(word, "")
    for pattern, replacement in _REWRITE:
        text = re.sub(pattern, replacement, text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def compute_score(data_source, solution_str: str, ground_truth: Any, extra_info=None) -> dict:
    """``{"score": 1.0 or -1.0, "acc": bool, "pred": the normalised answer}``."""
    found = ANSWER.findall(solution_str[-TAIL_CHARS:])
    pred = normalize_answer(found[-1] if found else NO_ANSWER)
    right = pred == normalize_answer(str(ground_truth))
    return {"score": 1.0 if right else -1.0, "acc": right, "pred": pred}
