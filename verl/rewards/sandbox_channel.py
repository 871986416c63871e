"""The trainer's end of a sandbox run's pipes (see :mod:`verl.rewards.sandbox`): the job and its calls go
in on one, results come out on the other, both written by a hostile process on the far side, so every
read is capped and the calls are released one at a time (``_supervise``)."""

from __future__ import annotations

import os
import select
import time
from typing import TYPE_CHECKING

from verl.rewards.sandbox_results import MAX_EXTRA_LINES, RESULT_PREFIX

if TYPE_CHECKING:
    from verl.rewards.sandbox import SandboxLimits

TRICKLE_BYTES = 512
TRICKLE_PAUSE_S = 0.005
"""After a read of fewer than ``TRICKLE_BYTES`` results that released no call, the results pipe is not
polled for ``TRICKLE_PAUSE_S``. A program writing one byte at a time to it woke the trainer for every
byte: a 2.5 s run took ~1 s of the trainer's CPU (and its GIL), ~2 s at the default wall limit. Now at
most ~200 such reads a second; the harness's lines each release a call (or come whole, with the exit)."""


def _supervise(pid: int, job_w: int, job: bytes, call_lines: list[bytes], results_r: int,
               limits: SandboxLimits) -> tuple[bool, bytearray]:
    """Feed the job, then the calls, collect results (at most ``max_output_bytes``, the rest read and
    dropped) and wait for the child, up to the wall limit. Returns (exited, results).

    The calls go one at a time: call ``k + 1`` only once a results line of call ``k`` came back (the first
    one, which is its result, see ``sandbox_results.parse_results``). A program that walks ``f_back`` from a
    frame of its own into the harness (no audit event sees that) read every call of the job there while
    answering the first, the inputs of later asserts included; now it finds the call it is answering.

    The child is waited on with a pidfd and left unreaped, so its pid (the group id, and the name of the
    run's uid) cannot be reused before ``_kill_run``. Closes ``job_w``."""
    deadline = time.monotonic() + limits.wall_seconds
    results = bytearray()
    pidfd = os.pidfd_open(pid)
    poller = select.poll()  # not select.select: a trainer can hold more than 1024 fds
    poller.register(pidfd, select.POLLIN)
    poller.register(results_r, select.POLLIN)
    poller.register(job_w, select.POLLOUT)
    os.set_blocking(job_w, False)
    os.set_blocking(results_r, False)
    outgoing = bytearray(job + (call_lines[0] if call_lines else b""))
    released, line_start, searched = min(1, len(call_lines)), 0, 0  # calls sent; where the unread lines begin
    lines_left = [2 * len(call_lines) + MAX_EXTRA_LINES + 1]  # what parse_results looks at, the report included
    exited, writing, resume = False, True, None  # resume: when a throttled results pipe is polled again

    def stop_writing() -> None:  # the job and every call sent, or no more to be sent
        nonlocal job_w, writing
        if writing:
            poller.unregister(job_w)
            writing = False
        if job_w != -1:
            os.close(job_w)  # the harness reads the end of its calls
            job_w = -1

    try:
        while not exited:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                break
            if resume is not None and now >= resume:
                poller.register(results_r, select.POLLIN)
                resume = None
            wait = remaining if resume is None else min(remaining, resume - now)
            for fd, _ in poller.poll(max(1, int(wait * 1000) + 1)):
                if fd == pidfd:
                    exited = True
                elif fd == results_r:
                    got, was_released = _read_some(results_r, results, limits.max_output_bytes), released
                    if got is None:
                        poller.unregister(results_r)
                    elif len(results) >= limits.max_output_bytes:  # the rest would be read only to be dropped
                        poller.unregister(results_r)
                        _stop_reading(results_r)
                        stop_writing()  # no result would be read: no more calls
                        got = None
                    while job_w != -1 and released < len(call_lines):
                        found, line_start, searched = _find_line(results, line_start, searched, released - 1,
                                                                 lines_left)
                        if not found:
                            if lines_left[0] <= 0:  # no later line would be read as a result: no more calls
                                stop_writing()
                            break
                        outgoing += call_lines[released]
                        released += 1
                        if not writing:
                            poller.register(job_w, select.POLLOUT)
                            writing = True
                    if got is not None and got < TRICKLE_BYTES and released == was_released:
                        poller.unregister(results_r)  # a trickle that released no call: look again later
                        resume = time.monotonic() + TRICKLE_PAUSE_S
                elif fd == job_w:
                    try:
                        del outgoing[:os.write(job_w, outgoing[:65536])]
                    except BlockingIOError:
                        pass
                    except OSError:  # the child is gone
                        outgoing.clear()
                        released = len(call_lines)
                    if not outgoing:
                        if released >= len(call_lines):
                            stop_writing()
                        else:
                            poller.unregister(job_w)
                            writing = False
    finally:
        os.close(pidfd)
        if job_w != -1:
            os.close(job_w)
    return exited, results


def _find_line(results: bytearray, start: int, searched: int, index: int,
               lines_left: list[int]) -> tuple[bool, int, int]:
    """Whether a complete line from ``start`` on is call ``index``'s (``sandbox_results.RESULT_PREFIX``),
    looking at no more than ``lines_left[0]`` lines (lowered by those looked at: a flood of empty lines
    costs no more than the lines ``parse_results`` reads). Returns it, where the next unread line starts,
    and how far the bytes were searched for a line end (a long line coming in pieces is searched once)."""
    prefix = RESULT_PREFIX % index
    while lines_left[0] > 0:
        end = results.find(b"\n", max(start, searched))
        if end < 0:
            return False, start, len(results)
        lines_left[0] -= 1
        found = results.startswith(prefix, start, end)
        start = searched = end + 1
        if found:
            return True, start, searched
    return False, start, searched


def _read_some(fd: int, into: bytearray, cap: int) -> int | None:
    """One read into ``into`` (dropped beyond ``cap``): the bytes read, None at end of file."""
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        return 0
    if chunk:
        into += chunk[:max(0, cap - len(into))]
    return len(chunk) or None


def _stop_reading(fd: int) -> None:
    """Replace the read end of a pipe with /dev/null under the same fd number (closed as before, by
    its owner): its writers get EPIPE from now on. A program that writes to the results pipe without
    end made the trainer read and drop it as fast as it wrote (a 5 s run: ~2.4 s of trainer CPU for
    0.1 s of its own); the harness, whose results are then lost anyway, stops at the error."""
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


def _drain(fd: int, into: bytearray, cap: int) -> bool:
    """What is still in the pipe, without waiting for writers that survived; True if capped."""
    for _ in range(10_000):
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        into += chunk[:max(0, cap - len(into))]
    return len(into) >= cap
