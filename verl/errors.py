"""The errors a user's input can cause: one base class and a type per area.

Entry points catch :class:`VerlError` and print its message alone: the message names the
problem and the fix, so a traceback would only hide it.
"""


# The way out when a checkpoint cannot be resumed with what was given now.
NEW_RUN = "start a new run (another trainer.default_local_dir, or trainer.resume_mode=disable to train from the start there)"


class VerlError(ValueError):
    """Bad input (config, data, model path, reward function). The message says what to change."""


class ModelLoadError(VerlError):
    """A model or tokenizer could not be loaded from the given path or hub id."""


class DeviceError(VerlError):
    """The requested device is not on this machine (``trainer.device=cuda`` without CUDA, ...)."""


class DataError(VerlError):
    """A dataset that cannot be used as configured; the message names the setting to change."""


class ConfigError(VerlError):
    """A config key or value is wrong. The message names the key, the problem and the fix."""


class RewardError(VerlError):
    """A reward function that cannot be loaded or returned an unusable value; the message says why."""
