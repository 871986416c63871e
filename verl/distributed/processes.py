"""What one process can learn about another from /proc: which host and pid namespace it runs in,
and whether a process (pid plus its start time, so a reused pid is not mistaken for it) still runs.
The watchdog uses it to tell a dead peer on the same host from a silent one."""

from __future__ import annotations

import os


def node_id() -> str | None:
    """This host's boot and pid namespace: processes with the same id see each other in /proc.
    None without /proc (macOS): liveness from heartbeats alone."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


def alive(peer: dict, zombie: bool = False) -> bool:
    """The peer's process still runs (or, with ``zombie``, still waits for its parent to reap it)."""
    state = process_state(peer["pid"])
    return state is not None and state[1] == peer["start"] and (zombie or state[0] not in "ZX")


def process_state(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a process, from /proc; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0], int(fields[19])
