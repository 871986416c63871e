"""verl's ``verl.utils.reward_score``, for reward files written against verl: ``default_compute_score``
and the scorer modules :mod:`.gsm8k`, :mod:`.math`, :mod:`.math_dapo` and :mod:`.geo3k`, with verl's
names and call signatures, scoring with this project's built-in scorers (:mod:`verl.rewards.scorers`).
docs/rewards.md says where a scorer differs from verl's. verl's other scorer modules (``prime_math``,
``prime_code``, ``sandbox_fusion``, ``math_verify``, ...) are not here: importing one fails naming the
modules that are.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.errors import RewardError
from verl.rewards import scorers

logger = logging.getLogger(__name__)
_warned: set[str] = set()


class UnknownDataSource(RewardError, NotImplementedError):
    """No scorer for the data source: a :class:`~verl.errors.RewardError` that is also the
    ``NotImplementedError`` verl raises, so a reward file that catches it to fall back still works."""


def _warn_once(name: str, value: Any) -> None:
    if name not in _warned:
        _warned.add(name)
        logger.warning("default_compute_score(%s=%r): not used here; code is run in this project's own sandbox "
                       "with the limits of the row's extra_info (docs/code_reward.md)", name, value)


def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, sandbox_fusion_url=None,
                          concurrent_semaphore=None, memory_limit_mb=None, **kwargs) -> float | dict:
    """The score of ``solution_str`` by the built-in scorer of ``data_source`` (verl's function: a
    float, or the scorer's dict). A data source without one raises :class:`UnknownDataSource`."""
    for name, value in (("sandbox_fusion_url", sandbox_fusion_url), ("memory_limit_mb", memory_limit_mb)):
        if value is not None:
            _warn_once(name, value)
    try:
        scorers.get_scorer(data_source)
    except RewardError as err:
        raise UnknownDataSource(str(err)) from None
    result = scorers.default_compute_score(data_source, solution_str, ground_truth, extra_info)
    return result if isinstance(result, dict) else float(result)


_default_compute_score = default_compute_score  # verl's older name

__all__ = ["default_compute_score", "_default_compute_score", "UnknownDataSource"]
