"""The sandbox's Landlock layer (verl/rewards/sandbox_landlock.py) on its own, below the audit hook and the filter.

The attack tests (sandbox_attacks.py) run it together with the other layers; here a process confines itself with
``_child_landlock`` alone and then tries to reach the test's process (its parent) with signals: by ``kill`` and as
the owner of a pipe (F_SETOWN), whom the kernel signals when the parent reads from it. Without Landlock both reach
the parent (the control); with it (ABI 6, Linux >= 6.12: scoped signals) neither does."""

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import ctypes, fcntl, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if sys.argv[2] == "landlock":
    namespace = {}
    exec(open(os.path.join(sys.argv[1], "verl/rewards/sandbox_landlock.py")).read(), namespace)
    libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))  # no new privs
    assert namespace["_child_landlock"](libc, [os.getcwd()])
write_end, parent = int(sys.argv[3]), os.getppid()
try:
    os.kill(parent, 0)  # permission is checked as for a real signal
    print("kill allowed", flush=True)
except PermissionError:
    print("kill refused", flush=True)
fcntl.fcntl(write_end, fcntl.F_SETOWN, parent)
fcntl.fcntl(write_end, 10, int(sys.argv[4]))  # F_SETSIG: this signal instead of SIGIO
fcntl.fcntl(write_end, fcntl.F_SETFL, fcntl.fcntl(write_end, fcntl.F_GETFL) | os.O_ASYNC)
os.write(write_end, b"x")
sys.stdin.read()  # until the parent has read from the pipe
"""


def _landlock_abi() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(ctypes.c_long(444), ctypes.c_void_p(None), ctypes.c_size_t(0), ctypes.c_uint32(1))


def _signals_reaching_the_parent(mode: str, tmp_path) -> tuple[str, list]:
    got = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: got.append("SIGUSR1"))
    read_end, write_end = os.pipe()
    try:
        child = subprocess.Popen([sys.executable, "-I", "-c", CHILD, str(REPO), mode, str(write_end),
                                  str(int(signal.SIGUSR1))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, pass_fds=(write_end,), cwd=tmp_path)
        os.close(write_end)
        said = child.stdout.readline()
        assert os.read(read_end, 1) == b"x"  # the kernel signals the owner of the write end (if it may)
        child.communicate("", timeout=30)
        assert child.returncode == 0
        return said.strip(), got
    finally:
        os.close(read_end)
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.skipif(sys.platform != "linux", reason="Landlock is Linux only")
def test_landlock_keeps_signals_from_reaching_processes_outside_the_run_by_kill_or_as_a_file_owner(tmp_path):
    if _landlock_abi() < 6:
        pytest.skip("this kernel's Landlock has no scoped signals (ABI 6, Linux >= 6.12)")
    assert _signals_reaching_the_parent("control", tmp_path) == ("kill allowed", ["SIGUSR1"])  # can fail
    assert _signals_reaching_the_parent("landlock", tmp_path) == ("kill refused", [])
