from verl.tracking.tracker import LOGGER_NAMES, Tracker

__all__ = ["LOGGER_NAMES", "Tracker"]
