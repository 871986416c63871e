"""Built-in rule scorers, looked up by a row's ``data_source``.

Every scorer has verl's reward-function signature and is called with keywords::

    fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...) -> float | dict

A dict return must hold a ``"score"``; its other keys are reported per sample. To add a task,
put its scorer in ``SCORERS`` under the ``data_source`` its rows carry.

Besides the built-in tasks: GSM8K (``gsm8k``: the number after ``####``; ``gsm8k/flexible``: the
last number), competition math (``math_answers``: the last ``\\boxed{}`` checked with math-verify),
Geometry3K (``geo3k``: the same, plus a format part, as verl weighs them), DAPO's math (``math_dapo``:
the last ``Answer: ...`` line, 1 / -1, also for data sources starting ``aime``),
format rewards (``format``: ``format/think``, ``format/boxed``) and code run against test cases
in a sandbox (``code``, ``apps``, ``taco``, ``codecontests``).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable

from verl.data.tasks import TASKS
from verl.errors import RewardError, first_few
from verl.rewards.scorers import code, geo3k, gsm8k, math_answers, math_dapo
from verl.rewards.scorers.format import boxed_format, think_format

logger = logging.getLogger(__name__)


def exact_match(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    """1.0 when the response, stripped of surrounding whitespace, equals ``str(ground_truth)``. A whole
    float answer is also matched without its ".0": pandas stores a column of integers with a gap as
    floats, and 3.0 would otherwise never match the response "3". A list of answers (aliases) matches any
    one of them."""
    accepted = list(ground_truth) if isinstance(ground_truth, (list, tuple)) else [ground_truth]  # any of several
    answers = {str(answer) for answer in accepted}
    answers |= {str(int(a)) for a in accepted if isinstance(a, float) and a.is_integer()}
    return 1.0 if solution_str.strip() in answers else 0.0


SCORERS: dict[str, Callable[..., Any]] = {
    "exact_match": exact_match,
    **{task.DATA_SOURCE: task.compute_score for task in TASKS.values()},
    "openai/gsm8k": gsm8k.compute_score,
    "gsm8k": gsm8k.compute_score,
    "gsm8k/flexible": gsm8k.compute_score_flexible,
    **dict.fromkeys(("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math"),
                    math_answers.compute_score),
    "hiyouga/geometry3k": geo3k.compute_score,  # verl's vision-language example (images in the prompts)
    # DAPO's "Answer: ..." lines, scored 1 / -1 (verl's math_dapo; also every data source starting "aime")
    **dict.fromkeys(("math_dapo", "math_dapo_reasoning"), math_dapo.compute_score),
    "format/think": think_format,
    "format/boxed": boxed_format,
    # Model-written Python run against test cases in a sandbox (verl.rewards.sandbox); async, so a
    # batch's sandboxes run concurrently.
    **dict.fromkeys(("code", "apps", "taco", "codecontests"), code.compute_score_async),
}


# Data sources scored by their first characters, as verl does: aime24, aime2025, ...
PREFIX_SCORERS: dict[str, Callable[..., Any]] = {"aime": math_dapo.compute_score}

# Scorers that judge the response alone: a row needs no ground truth for them.
NEEDS_NO_GROUND_TRUTH = frozenset({"format/think", "format/boxed"})

# Scorers whose ground truth has a form: why a row's can never be matched (None when it can).
GROUND_TRUTH_CHECKS: dict[Callable[..., Any], Callable[[Any], str | None]] = {
    gsm8k.compute_score: gsm8k.ground_truth_problem, gsm8k.compute_score_flexible: gsm8k.ground_truth_problem}


def check_builtin_rows(items, key: str, reward_fn_key: str = "data_source") -> None:
    """Before training: every row that a built-in scorer will score has a data source it knows and,
    unless the scorer judges the response alone, a ground truth; else one RewardError naming the
    row (its position in ``key``'s files) and the missing key. Without this a row missing its
    answer scores 0 whatever the model writes, for the whole run."""
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            return  # a custom dataset class with rows of its own shape: scored as it is
        row = item.get("index", position)
        source = item.get(reward_fn_key, item.get("data_source"))
        if source is None:
            raise RewardError(f"{key}: row {row} has no {reward_fn_key}, so no built-in scorer can be picked for it; "
                              f"give every row a {reward_fn_key} (e.g. 'openai/gsm8k'), or set "
                              f"custom_reward_function.path to your own compute_score")
        scorer = get_scorer(source)
        check = GROUND_TRUTH_CHECKS.get(scorer)
        problem = check(item["ground_truth"]) if check and item.get("ground_truth") is not None else None
        if problem:
            raise RewardError(f"{key}: row {row} ({reward_fn_key}={source!r}): its ground truth {problem}, so its "
                              f"built-in scorer would score every response 0. Give the final number as "
                              f"reward_model.ground_truth (examples/data_preprocess/gsm8k.py writes it), or set "
                              f"custom_reward_function.path to a compute_score of your own")
        if item.get("ground_truth") is None and source not in NEEDS_NO_GROUND_TRUTH:
            raise RewardError(
                f"{key}: row {row} ({reward_fn_key}={source!r}) has no ground truth: its built-in scorer compares "
                f"each response with reward_model.ground_truth (or a ground_truth / answer / solution column), so "
                f"every response would score 0. Add the answer to that row, drop the row, or set "
                f"custom_reward_function.path to a compute_score that needs none")


def warn_rows_without_ground_truth(items, key: str) -> int:
    """Before training with the user's reward functions: when some rows have a ground truth and others
    not, the others are most likely a gap in the data (the function gets ``ground_truth=None`` for them
    and, comparing, scores 0 whatever the model writes). Said once, with the count and the first rows;
    returns the count. Rows that all lack one are a function that needs none: nothing is said."""
    missing, total = [], 0
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            return 0  # a custom dataset class with rows of its own shape
        total += 1
        if item.get("ground_truth") is None:
            missing.append(item.get("index", position))
    if missing and len(missing) < total:
        first = first_few(missing)
        logger.warning("%s: %d of %d rows have no ground truth (row%s %s): the reward function gets ground_truth=None "
                       "for them, while the other rows have one. Fill in reward_model.ground_truth (or a ground_truth "
                       "/ answer / solution column), or drop those rows", key, len(missing), total,
                       "s" if len(missing) > 1 else "", first)
        return len(missing)
    return 0


def get_scorer(data_source: str) -> Callable[..., Any]:
    """The built-in scorer for ``data_source``; RewardError naming the known sources otherwise."""
    if data_source not in SCORERS and isinstance(data_source, str) and data_source.startswith(tuple(PREFIX_SCORERS)):
        return next(fn for prefix, fn in PREFIX_SCORERS.items() if data_source.startswith(prefix))
    try:
        return SCORERS[data_source]
    except KeyError:
        raise RewardError(
            f"no built-in reward scorer for data_source={data_source!r}; known: {sorted(SCORERS)} "
            f"(and any starting {', '.join(map(repr, PREFIX_SCORERS))}). "
            f"Write a compute_score(data_source, solution_str, ground_truth, extra_info) function "
            f"and set custom_reward_function.path to its file, or, for rows a learned reward model scores "
            f"(reward_model.style 'model', as in verl's full_hh_rlhf data), set reward_model.enable=true and "
            f"reward_model.model.path") from None


def default_compute_score(data_source: str, solution_str: str, ground_truth: Any,
                          extra_info: dict | None = None) -> Any:
    """Score with the built-in scorer registered for ``data_source`` (an async one is run to completion)."""
    result = get_scorer(data_source)(data_source=data_source, solution_str=solution_str,
                                     ground_truth=ground_truth, extra_info=extra_info)
    if inspect.isawaitable(result):
        import asyncio

        result = asyncio.run(result)
    return result
