"""The trainer's clean-up of a sandbox run's working directory (:func:`remove_tree`), whatever the
run left in it: directories of mode 000, any depth, symbolic links (never followed)."""

from __future__ import annotations

import errno
import logging
import os
import stat

logger = logging.getLogger("verl.rewards.sandbox")  # said as the sandbox's, as before the split


def remove_tree(top: str, max_steps: int = 2_000_000) -> None:
    """Remove a run's directory whatever the run did to it: modes like 000 (made 700 first) and
    any depth (subdirectories are moved up to ``top`` one level at a time, so neither recursion
    nor path length grows). Never raises; gives up, with a warning, after ``max_steps`` entries
    or a round that removed nothing.
    With a private working directory (a tmpfs gone with the run) ``top`` is already empty."""
    try:
        os.rmdir(top)
        return
    except FileNotFoundError:
        return
    except OSError:
        pass
    steps, fresh = 0, 0
    try:
        os.chmod(top, 0o700)
        top_fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        logger.warning("verl sandbox: could not remove %s", top)
        return
    try:
        progress = True
        while progress and steps < max_steps:  # a round that removes nothing ends it
            names, progress = os.listdir(top_fd), False
            if not names:
                break
            for name in names:
                steps += 1
                try:
                    mode = os.stat(name, dir_fd=top_fd, follow_symlinks=False).st_mode
                    if not stat.S_ISDIR(mode):
                        os.unlink(name, dir_fd=top_fd)
                        progress = True
                        continue
                    os.chmod(name, 0o700, dir_fd=top_fd)  # a directory, not a link: no race, the run is dead
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top_fd)
                    try:
                        for child in os.listdir(sub):
                            steps += 1
                            if stat.S_ISDIR(os.stat(child, dir_fd=sub, follow_symlinks=False).st_mode):
                                os.chmod(child, 0o700, dir_fd=sub)  # moving a directory writes its ".."
                            while True:
                                fresh += 1
                                try:
                                    os.rename(child, f".verl-{fresh}", src_dir_fd=sub, dst_dir_fd=top_fd)
                                    break
                                except FileExistsError:
                                    continue
                                except OSError as e:  # that name is taken (by a directory ...)
                                    if e.errno not in (errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
                                        raise
                    finally:
                        os.close(sub)
                    os.rmdir(name, dir_fd=top_fd)
                    progress = True
                except OSError:
                    continue
        os.rmdir(top)
    except OSError:
        logger.warning("verl sandbox: could not remove %s entirely", top)
    finally:
        os.close(top_fd)
