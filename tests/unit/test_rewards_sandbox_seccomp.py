"""The sandbox's system-call filter (verl/rewards/sandbox_seccomp.py) decides as documented.

The BPF program is run here by a small interpreter of the classic-BPF instructions it uses, for
both architectures, on every call of the table; the sandbox tests (sandbox_attacks.py) then check
on the real kernel that the filter is installed and kills."""

import struct

import pytest

from verl.rewards.sandbox_seccomp import _NUMBERS, DENIED, _child_seccomp_program, filter_spec

KILL, ALLOW = 0x80000000, 0x7FFF0000
PID = 7


def run(program, nr, args=(), arch=None, spec=None):
    """Classic BPF on a seccomp_data: nr (u32), arch (u32), ip (u64), args[6] (u64)."""
    data = struct.pack("<IIQ6Q", nr, arch if arch is not None else spec["arch"], 0,
                       *[a & (2**64 - 1) for a in (list(args) + [0] * 6)[:6]])
    accumulator, pc = 0, 0
    for _ in range(10_000):
        code, jt, jf, k = program[pc]
        if code == 0x20:
            accumulator = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:
            return k
        elif code in (0x15, 0x35, 0x45):
            taken = {0x15: accumulator == k, 0x35: accumulator >= k, 0x45: bool(accumulator & k)}[code]
            pc += jt if taken else jf
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
        pc += 1
    raise AssertionError("the program did not return")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_kills_the_denied_calls_and_allows_everything_else(machine):
    column = {"x86_64": 0, "aarch64": 1}[machine]
    spec = filter_spec(machine)
    program = _child_seccomp_program(spec, PID)
    assert max(max(jt, jf) for _, jt, jf, _ in program) < 256
    for name in DENIED:
        if _NUMBERS[name][column] is not None:
            assert run(program, _NUMBERS[name][column], spec=spec) == KILL, name
    for nr in (0, 1, 2, 3, 9, 10, 11, 60, 231):  # read/write/open/close/mmap/... (x86_64) or their twins
        if nr not in {v[column] for v in _NUMBERS.values()}:
            assert run(program, nr, spec=spec) == ALLOW, nr
    number = {name: numbers[column] for name, numbers in _NUMBERS.items()}
    assert run(program, number["socket"], (2, 1, 0), spec=spec) == 0x00050000 | 13   # EACCES
    assert run(program, number["socketpair"], (1, 1, 0), spec=spec) == 0x00050000 | 13  # a pair too
    assert run(program, number["io_setup"], (32767,), spec=spec) == KILL              # the host's aio-max-nr
    assert run(program, number["mq_open"], spec=spec) == KILL  # a queue would outlive a weak-mode run
    assert run(program, number["clone3"], spec=spec) == 0x00050000 | 38             # ENOSYS: libc falls back
    assert run(program, number["sync"], spec=spec) == 0x00050000                    # returns 0, writes nothing back
    assert run(program, number["syncfs"], (3,), spec=spec) == 0x00050000
    for name in ("inotify_init", "inotify_init1", "fanotify_init"):                # they count against the uid
        if number[name] is not None:
            assert run(program, number[name], spec=spec) == 0x00050000 | 13, name   # EACCES
    assert run(program, number["fcntl"], (5, 1031, 1 << 20), spec=spec) == 0x00050000 | 1  # F_SETPIPE_SZ: EPERM
    for cmd in (8, 10, 15, 8 + 2**32):  # F_SETOWN, F_SETSIG, F_SETOWN_EX: the kernel signals a file's owner
        assert run(program, number["fcntl"], (5, cmd, 1), spec=spec) == 0x00050000 | 1, cmd  # EPERM
    for cmd in (0, 1, 2, 3, 4, 9, 11, 16, 1032):                        # F_DUPFD ... F_GETOWN, F_GETSIG, F_GETOWN_EX
        assert run(program, number["fcntl"], (5, cmd), spec=spec) == ALLOW, cmd
    for name in ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        assert run(program, number[name], (PID, 9), spec=spec) == ALLOW, name        # itself (abort, raise)
        for other in (1, 0, -1, PID + 1, PID + 2**32):
            assert run(program, number[name], (other, 9), spec=spec) == (ALLOW if other == PID + 2**32 else KILL), (name, other)
    assert run(program, number["prlimit64"], (0,), spec=spec) == ALLOW
    assert run(program, number["prlimit64"], (PID,), spec=spec) == ALLOW
    assert run(program, number["prlimit64"], (1,), spec=spec) == KILL
    for name in ("sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr", "migrate_pages",
                 "move_pages"):  # its own scheduling and memory only: no other process of the uid
        assert run(program, number[name], (0, 5), spec=spec) == ALLOW, name
        assert run(program, number[name], (PID, 5), spec=spec) == ALLOW, name
        assert run(program, number[name], (1, 5), spec=spec) == KILL, name
        assert run(program, number[name], (PID + 1, 5), spec=spec) == KILL, name
    for name, own in (("setpriority", 0), ("ioprio_set", 1)):  # PRIO_PROCESS, IOPRIO_WHO_PROCESS
        assert run(program, number[name], (own, 0, 19), spec=spec) == ALLOW, name     # os.nice(19)
        assert run(program, number[name], (own, PID, 19), spec=spec) == ALLOW, name
        assert run(program, number[name], (own, 1, 19), spec=spec) == KILL, name       # another process
        for which in (own + 1, own + 2):                                               # its group, its uid
            assert run(program, number[name], (which, 0, 19), spec=spec) == KILL, (name, which)
    assert run(program, number["clone"], (0x01200011,), spec=spec) == ALLOW         # fork()'s flags
    for flag in (0x10000000, 0x20000000, 0x40000000, 0x00020000, 0x08000000):     # any CLONE_NEW*
        assert run(program, number["clone"], (0x01200011 | flag,), spec=spec) == KILL
    assert run(program, number["ioctl"], (0, 0x5412), spec=spec) == KILL           # TIOCSTI
    assert run(program, number["ioctl"], (0, 0x541C), spec=spec) == KILL           # TIOCLINUX
    assert run(program, number["ioctl"], (0, 0x5401), spec=spec) == ALLOW          # TCGETS
    assert run(program, number["ioctl"], (3, 0x8901), spec=spec) == KILL           # FIOSETOWN (F_SETOWN)
    assert run(program, number["ioctl"], (3, 0x8902), spec=spec) == KILL           # SIOCSPGRP (F_SETOWN)
    assert run(program, number["ioctl"], (3, 0x8903), spec=spec) == ALLOW          # FIOGETOWN
    assert run(program, 0, arch=0x40000003, spec=spec) == KILL                     # i386 entry point
    if machine == "x86_64":
        assert run(program, 0x40000000 + 1, spec=spec) == KILL                     # x32
