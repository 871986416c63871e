"""The error type of the reward package."""


class RewardError(ValueError):
    """A reward function that cannot be loaded or returned an unusable value; the message says why."""
