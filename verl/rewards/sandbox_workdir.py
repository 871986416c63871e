"""A sandbox run's working directory: the trainer's clean-up (:func:`remove_tree`), whatever the run
left in it (directories of mode 000, any depth, symbolic links, never followed), and, in weak mode,
where it is a host directory that no tmpfs bounds, the watch kept on it while the run lasts
(:func:`_child_watch_workdir`, run by the sandbox's own stage 2, not the trainer)."""

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


def _child_watch_workdir(child: int, workdir: str, max_bytes: int, max_entries: int) -> int:
    """Weak mode, stage 2 (``sandbox_child._child_init``): wait for the sandboxed process ``child`` while
    watching its working directory, a host directory there (with namespaces it is a tmpfs of
    ``max_disk_bytes``), and SIGKILL it once the directory holds more than ``max_bytes`` (allocated or
    apparent, whichever is larger) or ``max_entries`` entries, or can no longer be listed. RLIMIT_FSIZE
    bounds each file only: a 3 s run wrote ~3.2 GB of 4 MiB files to the host's disk, which the trainer
    then took ~3.6 s to remove. Each look costs ~20 us for a few files, and the pause between looks is at
    least 20 times the last look's time, so a directory kept just under ``max_entries`` costs this
    process (not the trainer) at most ~5% of a core. Returns ``child``'s wait status. Runs in the
    sandbox's own process: it imports what it needs, and nothing from verl."""
    import os
    import select
    import signal
    import time

    try:  # wakes the pause below as soon as the child ends, rather than up to 5 ms later
        ended = os.pidfd_open(child)
    except (AttributeError, OSError):
        ended = None

    def over() -> str:
        used, entries, todo = 0, 0, [workdir]
        while todo:  # the filter refuses mkdir in weak mode: this is one directory, unless it is off
            with os.scandir(todo.pop()) as listing:
                for entry in listing:
                    entries += 1
                    if entries > max_entries:
                        return f"held more than {max_entries} entries"
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:  # removed meanwhile
                        continue
                    used += max(info.st_blocks * 512, info.st_size)
                    if used > max_bytes:
                        return f"held more than {max_bytes} bytes (max_disk_bytes)"
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
        return ""

    while True:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == child:
            return status
        if pid:  # an orphan (as a pid namespace's init, where only the private mounts failed)
            continue
        started = time.monotonic()
        try:
            why = over()
        except OSError as error:  # e.g. a mode of 000 on it: what cannot be looked at is not allowed to grow
            why = f"could not be listed ({error.strerror})"
        if why:
            os.kill(child, signal.SIGKILL)
            try:
                os.write(2, f"\nverl sandbox: killed: the working directory {why}\n".encode())
            except OSError:
                pass
            while True:
                pid, status = os.waitpid(-1, 0)
                if pid == child:
                    return status
        pause = max(0.005, 20 * (time.monotonic() - started))
        if ended is None:
            time.sleep(pause)
        else:
            select.select([ended], [], [], pause)
