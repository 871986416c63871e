"""The error type of the reward package."""

from verl.errors import VerlError


class RewardError(VerlError):
    """A reward function that cannot be loaded or returned an unusable value; the message says why."""
