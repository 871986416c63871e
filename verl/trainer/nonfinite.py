"""Stopping a run whose updates keep being skipped for a NaN/inf loss or gradient norm.

The engine skips such an optimiser step and counts it (``<prefix>/num_nonfinite_skipped``); a
trainer hands each step's metrics to :class:`NonfiniteGuard`, which warns, and after
``trainer.max_nonfinite_steps`` steps in a row raises the one-line error. The metrics are the same
on every rank (the gradient norm is all-reduced), so every rank stops alike.
"""

from __future__ import annotations

import logging

from verl.errors import VerlError

logger = logging.getLogger(__name__)


class NonfiniteGuard:
    """``stages`` maps a stage name (``update_actor``) to ``(metric prefix, learning-rate key)``."""

    def __init__(self, limit: int, stages: dict[str, tuple[str, str]], *, warn: bool = True):
        self.limit = limit
        self.stages = stages
        self.warn = warn  # on the main process only
        self.streak = 0

    def observe(self, step: int, metrics: dict, log_first=None) -> None:
        """Count this step; past the limit, ``log_first(metrics)`` (so the failing step is recorded), then raise."""
        skipped = {stage: int(metrics[f"{prefix}/num_nonfinite_skipped"])
                   for stage, (prefix, _) in self.stages.items()
                   if metrics.get(f"{prefix}/num_nonfinite_skipped", 0) > 0}
        if not skipped:
            self.streak = 0
            return
        self.streak += 1
        what = ", ".join(f"{stage} skipped {n} optimiser step{'s' * (n > 1)}" for stage, n in skipped.items())
        if self.streak > self.limit:
            if log_first is not None:
                log_first(metrics)
            first, streak = step - self.streak + 1, self.streak
            span = f"step {first}" if streak == 1 else f"steps {first}-{step}"
            lrs = " or ".join(self.stages[stage][1] for stage in skipped)
            raise VerlError(
                f"step {step}: {what} because the loss or gradient norm was NaN or inf, {streak} "
                f"step{'s' * (streak > 1)} in a row ({span}; trainer.max_nonfinite_steps={self.limit}), so training "
                f"stopped (a skipped update leaves the weights as they were). Fix: lower the learning rate "
                f"({lrs}) or the rewards' scale, check the reward function for NaN/inf scores, or raise "
                f"trainer.max_nonfinite_steps")
        if self.warn:
            logger.warning("step %d: %s because the loss or gradient norm was NaN or inf (a skipped update leaves "
                           "the weights as they were); %d step(s) in a row, more than trainer.max_nonfinite_steps=%d "
                           "stop the run", step, what, self.streak, self.limit)
