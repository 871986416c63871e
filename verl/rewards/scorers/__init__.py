"""Built-in rule scorers, looked up by a row's ``data_source``.

Every scorer has verl's reward-function signature and is called with keywords::

    fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...) -> float | dict

A dict return must hold a ``"score"``; its other keys are reported per sample. To add a task,
put its scorer in ``SCORERS`` under the ``data_source`` its rows carry.

Besides the built-in tasks: GSM8K (``gsm8k``: the number after ``####``; ``gsm8k/flexible``: the
last number), competition math (``math_answers``: the last ``\\boxed{}`` checked with math-verify)
format rewards (``format``: ``format/think``, ``format/boxed``) and code run against test cases
in a sandbox (``code``, ``apps``, ``taco``, ``codecontests``).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from verl.data.tasks import TASKS
from verl.errors import RewardError
from verl.rewards.scorers import code, gsm8k, math_answers
from verl.rewards.scorers.format import boxed_format, think_format


def exact_match(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    """1.0 when the response, stripped of surrounding whitespace, equals ``str(ground_truth)``."""
    return 1.0 if solution_str.strip() == str(ground_truth) else 0.0


SCORERS: dict[str, Callable[..., Any]] = {
    "exact_match": exact_match,
    **{task.DATA_SOURCE: task.compute_score for task in TASKS.values()},
    "openai/gsm8k": gsm8k.compute_score,
    "gsm8k": gsm8k.compute_score,
    "gsm8k/flexible": gsm8k.compute_score_flexible,
    **dict.fromkeys(("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math"),
                    math_answers.compute_score),
    "format/think": think_format,
    "format/boxed": boxed_format,
    # Model-written Python run against test cases in a sandbox (verl.rewards.sandbox); async, so a
    # batch's sandboxes run concurrently.
    **dict.fromkeys(("code", "apps", "taco", "codecontests"), code.compute_score_async),
}


def get_scorer(data_source: str) -> Callable[..., Any]:
    """The built-in scorer for ``data_source``; RewardError naming the known sources otherwise."""
    try:
        return SCORERS[data_source]
    except KeyError:
        raise RewardError(
            f"no built-in reward scorer for data_source={data_source!r}; known: {sorted(SCORERS)}. "
            f"Write a compute_score(data_source, solution_str, ground_truth, extra_info) function "
            f"and set custom_reward_function.path to its file") from None


def default_compute_score(data_source: str, solution_str: str, ground_truth: Any,
                          extra_info: dict | None = None) -> Any:
    """Score with the built-in scorer registered for ``data_source`` (an async one is run to completion)."""
    result = get_scorer(data_source)(data_source=data_source, solution_str=solution_str,
                                     ground_truth=ground_truth, extra_info=extra_info)
    if inspect.isawaitable(result):
        import asyncio

        result = asyncio.run(result)
    return result
