"""A warning when a run's first steps score every sample alike.

Then nothing is learned: a group baseline (GRPO, RLOO, ...) makes every advantage 0, and a critic
learns only a constant. It is what a reward function that never matches (a wrong ground-truth column,
an answer format it does not parse) or a task far beyond the model looks like, and the run would
otherwise go on for hours with flat curves. Said once, on the main process; the run goes on (a hard
task may still find its first reward later).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

FIRST_STEPS = 5
"""How many steps in a row, from the first this process trains, make the warning."""


class FlatRewards:
    """Give :meth:`observe` each step's metrics (``critic/score/min`` and ``max``: the samples' scores)."""

    def __init__(self, *, warn: bool = True, steps: int = FIRST_STEPS):
        self.warn = warn
        self.steps = steps
        self.flat = 0
        """Steps so far, from the first, whose samples all scored ``score``."""
        self.score: float | None = None
        self.over = False

    def observe(self, step: int, metrics: dict) -> None:
        if self.over:
            return
        low, high = metrics.get("critic/score/min"), metrics.get("critic/score/max")
        if low is None or low != high or (self.score is not None and low != self.score):
            self.over = True  # a step that told samples apart, or no scores (distillation alone)
            return
        self.score, self.flat = low, self.flat + 1
        if self.flat < self.steps:
            return
        self.over = True
        if self.warn:
            logger.warning(
                "steps %d-%d: every sample scored %g (critic/score min = max), so the policy has nothing to learn "
                "from (a group baseline makes every advantage 0; a critic learns only a constant). Check the reward "
                "function and the ground truths on a few samples (trainer.log_val_generations=N prints validation "
                "samples with their scores); for a task this hard for the model, start from one that sometimes "
                "solves it (a supervised warm start)", step - self.flat + 1, step, self.score)
