"""The errors a user's input can cause: one base class and a type per area.

Entry points catch :class:`VerlError` and print its message alone: the message names the
problem and the fix, so a traceback would only hide it.
"""

import contextlib
import difflib
import errno
import shutil
from pathlib import Path


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


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def first_few(items, most: int = 5) -> str:
    """The first ``most`` of ``items`` (rows, positions) for a message, with ", ..." when there are more."""
    return ", ".join(map(str, items[:most])) + (", ..." if len(items) > most else "")


def closest_name(value, names, *, cutoff: float = 0.6, synonyms=(), containing: bool = False) -> str | None:
    """The name among ``names`` that ``value`` most likely meant, for a "did you mean" hint, or None: the
    first of ``synonyms`` (names it is often given under) that is there; the same name in other letter case
    (GRPO, vLLM); with ``containing``, a name that holds it or is held in it (``worker`` for
    ``actor_rollout_ref_worker``); else the closest spelling at ``cutoff`` or above (difflib's ratio)."""
    names, value = [str(n) for n in names], str(value)
    close = ([n for n in synonyms if n in names] or [n for n in names if n.lower() == value.lower()]
             or (containing and [n for n in names if value in n or n in value])
             or difflib.get_close_matches(value, names, n=1, cutoff=cutoff))
    return close[0] if close else None


@contextlib.contextmanager
def naming_the_file(path):
    """Within the block, an OSError that names no file (``f.write``, ``Path.write_text``) names ``path``,
    so that a full disk is said with the folder (:func:`disk_full_message`)."""
    try:
        yield
    except OSError as error:
        if error.filename is not None or error.errno is None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from error


def disk_full_message(error: OSError) -> str | None:
    """One line for an OSError of a full disk (or quota): the file, its folder's free space, the ways out;
    None for any other error."""
    if error.errno not in DISK_FULL:
        return None
    where = ""
    if error.filename is not None:
        folder = Path(error.filename).parent
        free = shutil.disk_usage(folder).free if folder.exists() else None
        where = f" writing {error.filename}"
        if free is not None:
            where += f" ({free / 2**20:.1f} MiB free in {folder})"
    return (f"no space left on the device{where}. Fix: free space there, or give another trainer.default_local_dir; "
            f"then run the same command again (the checkpoints already written are complete)")
