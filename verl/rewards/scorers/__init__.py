"""Built-in rule scorers, looked up by a row's ``data_source``.

Every scorer has verl's reward-function signature and is called with keywords::

    fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...) -> float | dict

A dict return must hold a ``"score"``; its other keys are reported per sample. To add a task,
put its scorer in ``SCORERS`` under the ``data_source`` its rows carry.
"""

from __future__ import annotations

from typing import Any, Callable

from verl.data.tasks import TASKS
from verl.rewards.errors import RewardError


def exact_match(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    """1.0 when the response, stripped of surrounding whitespace, equals ``str(ground_truth)``."""
    return 1.0 if solution_str.strip() == str(ground_truth) else 0.0


SCORERS: dict[str, Callable[..., Any]] = {
    "exact_match": exact_match,
    **{task.DATA_SOURCE: task.compute_score for task in TASKS.values()},
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
    """Score with the built-in scorer registered for ``data_source``."""
    return get_scorer(data_source)(data_source=data_source, solution_str=solution_str,
                                   ground_truth=ground_truth, extra_info=extra_info)
