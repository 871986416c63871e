"""Run untrusted Python (a model's answer) in a throw-away subprocess and always get control back.

``run_python`` starts ``python -I -B`` in a fresh ``mkdtemp()`` directory, with a minimal environment
and a new session, and returns within about ``limits.wall_seconds``; the process group and (as root)
every process of the run's uid are then SIGKILLed and the directory removed, whatever happened.
Defence in depth; ``SandboxResult.layers`` says which layers a run got:

* parent: the wall limit, waited on with a pidfd so the leader stays unreaped and its pid (the group
  id, and the name of the run's uid) cannot be reused during the kill; then, as root, a ``/proc``
  sweep of the run's uid catches a grandchild that ``setsid()``-ed out of the group. Output goes to
  unlinked files capped by RLIMIT_FSIZE (``max_output_bytes``).
* rlimits (any user): CPU, address space (MemoryError -> ``memory``), file size, open files, no core
  dumps, and processes, counted per real uid: exact with an own uid; as a plain user the trainer's
  processes count too, so forking simply fails.
* own uid (root): once the interpreter runs (it may live where others cannot read, like pyenv under
  /root: ``PRELOAD`` is imported first, other unreadable modules are then not found), the child
  chowns its directory and drops to uid = gid = ``UID_BASE + pid``, no groups, no new privileges.
  Permissions then stop writes to the repo, /root, ... and signals to other processes. Reads of
  world-readable files and writes to world-writable places (/tmp) are not stopped by it, but by:
* private mounts (root): a mount namespace with /tmp, /var/tmp, /dev/shm read-only, except the
  working directory, bound back writable over its own path.
* network namespace (root / CAP_SYS_ADMIN): ``unshare(CLONE_NEWNET)``; its only loopback is down, so
  every connect fails, the host's 127.0.0.1 included.
* audit hook (any user, on by default; Python cannot remove it, and its helpers are bound from C so
  monkeypatching ``os`` does not change it): a refused event ends the run as ``blocked``: sockets,
  fork/exec/spawn/subprocess, os.kill, importing ctypes or _posixsubprocess, gc object walks,
  opening for writing outside the directory (symlinks resolved), opening any directory (no fd for
  ``dir_fd`` tricks), create/remove/rename/link/chmod outside it, path objects it cannot trust. It
  sees only what CPython audits: C extensions, native code and ``os.mkfifo``/``mknod`` pass it. As
  a plain user it is the only file and network barrier.

Not covered: reads of whatever the run's uid may read (a dataset's answers included), the disk
filled with many files, CPU taken from other runs. A ``check`` run's verdict is its exit status;
``sys.exit`` and ``os._exit`` cannot fake it, but code walking frames into this harness can: the
sandbox contains hostile code, it does not make grading tamper-proof.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import inspect
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from verl.rewards import sandbox_child
from verl.rewards.errors import RewardError

STATUSES = ("ok", "error", "timeout", "memory", "blocked", "killed")
# How the child tells the parent why it stopped. A program can fake one, which only ever turns its
# own run into a failure ("early": a check run whose code exited before the check finished).
EXIT_CODES = {"blocked": 97, "memory": 98, "early": 99}
# uid of a run = UID_BASE + the pid of its first process: unique while that process is unreaped,
# far above any real account, and below 2**32 - 1 for every possible pid (at most 2**22).
UID_BASE = 1 << 30
# Imported by the child before it drops privileges (see the module docstring): what solutions use,
# plus what lets a network attempt reach the audit hook rather than fail on an import.
PRELOAD = ("array", "base64", "bisect", "cmath", "collections", "copy", "dataclasses", "datetime",
           "decimal", "encodings.idna", "fractions", "functools", "hashlib", "heapq", "itertools",
           "json", "math", "numbers", "operator", "queue", "random", "re", "socket", "statistics",
           "string", "struct", "textwrap", "threading", "time", "traceback", "typing", "unicodedata")


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use."""

    wall_seconds: float = 5.0
    """Real time before the parent kills the run (status ``timeout``)."""
    cpu_seconds: int = 5
    """CPU time (RLIMIT_CPU); exceeding it also gives ``timeout``."""
    memory_bytes: int = 512 * 2**20
    """Address space (RLIMIT_AS). The interpreter itself takes about 30 MiB of it."""
    max_output_bytes: int = 4 * 2**20
    """Largest file the run may write (RLIMIT_FSIZE), stdout and stderr included."""
    max_open_files: int = 64
    """RLIMIT_NOFILE."""
    max_processes: int = 1
    """RLIMIT_NPROC for the run's uid: 1 forbids fork and threads (the audit hook refuses fork anyway)."""
    audit_hook: bool = True
    """Refuse escapes in Python (see module docstring). Off only to test that the OS layers hold alone."""

    def __post_init__(self):
        minimum = {"wall_seconds": 0.1, "cpu_seconds": 1, "memory_bytes": 64 * 2**20,
                   "max_output_bytes": 1024, "max_open_files": 8, "max_processes": 1}
        for name, low in minimum.items():
            if getattr(self, name) < low:
                raise RewardError(f"SandboxLimits.{name}={getattr(self, name)!r} is below the "
                                  f"workable minimum {low}; raise it")


@dataclass
class SandboxResult:
    """How a run ended. ``stdout``/``stderr`` are decoded as UTF-8 (bad bytes replaced)."""

    status: str
    """One of STATUSES: ok (exit 0), error (other exit), timeout (wall or CPU), memory, blocked
    (the audit hook refused something), killed (another signal)."""
    stdout: str
    stderr: str
    returncode: int | None
    """Exit status; negative for a signal; None if the process could not even be reaped."""
    wall_seconds: float
    truncated: bool = False
    """True when stdout or stderr reached ``max_output_bytes``."""
    layers: dict[str, bool] = field(default_factory=dict)
    """Which containment layers the child set up (empty if it died before reporting)."""


def run_python(code: str, stdin: str = "", *, limits: SandboxLimits = SandboxLimits(),
               check: str | None = None) -> SandboxResult:
    """Run ``code`` with ``stdin`` in a sandbox. With ``check`` (e.g. ``"assert add(1, 2) == 3"``),
    the check runs after the code in the same namespace and the run is ``ok`` only if both finish;
    the code exiting early (``sys.exit``) then counts as an error."""
    workdir = tempfile.mkdtemp(prefix="verl-sandbox-")
    proc = None
    try:
        with contextlib.ExitStack() as files:
            job, stdin_file, out, err = (files.enter_context(tempfile.TemporaryFile()) for _ in range(4))
            for f in (out, err):  # appending: a program reopening /dev/stdout keeps what it printed
                fcntl.fcntl(f, fcntl.F_SETFL, os.O_APPEND)
            job.write(json.dumps({"code": code, "check": check, "limits": dataclasses.asdict(limits),
                                  "exit_codes": EXIT_CODES, "uid_base": UID_BASE,
                                  "preload": PRELOAD}).encode())
            stdin_file.write(stdin.encode())
            job.seek(0)
            stdin_file.seek(0)
            started = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "-c", _CHILD_SOURCE, str(job.fileno())],
                stdin=stdin_file, stdout=out, stderr=err, cwd=workdir, pass_fds=(job.fileno(),),
                env={"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LC_ALL": "C.UTF-8"},
                start_new_session=True)
            exited = _wait_unreaped(proc.pid, limits.wall_seconds)
            _kill_run(proc.pid)
            try:
                returncode = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # stuck in the kernel (D state): do not hang the trainer
                returncode = None
            wall = time.monotonic() - started
            job.seek(0)
            report = json.loads(job.read() or b"{}")
            stdout, stdout_full = _read_capped(out, limits.max_output_bytes)
            stderr, stderr_full = _read_capped(err, limits.max_output_bytes)
            return SandboxResult(_status(exited, returncode), stdout, stderr, returncode, wall,
                                 stdout_full or stderr_full, report.get("layers", {}))
    finally:
        if proc is not None and proc.returncode is None:  # an exception above: still leave nothing
            _kill_run(proc.pid)
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_unreaped(pid: int, timeout: float) -> bool:
    """True if ``pid`` exited within ``timeout``. It is not reaped (see module docstring)."""
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()  # not select.select: a trainer can hold more than 1024 fds
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(timeout * 1000))
    finally:
        os.close(pidfd)


def _kill_run(pid: int) -> None:
    """SIGKILL the run's process group, then (as root) every live process of the run's uid."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    # Repeated: a process may fork between the scan and the kill. Bounded: one stuck in the kernel
    # (D state) may take long to die, and the trainer must not wait for it.
    for _ in range(100 if os.geteuid() == 0 else 0):
        alive = _processes_of(UID_BASE + pid)
        if not alive:
            return
        for process in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process, signal.SIGKILL)
        time.sleep(0.01)


def _processes_of(uid: int) -> list[int]:
    """Live (not zombie) processes whose real uid is ``uid``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:  # exited meanwhile
            continue
        if int(fields["Uid"].split()[0]) == uid and fields["State"].split()[0] not in ("Z", "X"):
            found.append(int(entry))
    return found


def _read_capped(file, cap: int) -> tuple[str, bool]:
    file.seek(0)
    data = file.read(cap)
    return data.decode("utf-8", "replace"), len(data) >= cap


def _status(exited: bool, returncode: int | None) -> str:
    if not exited or returncode == -signal.SIGXCPU:
        return "timeout"
    named = {0: "ok", EXIT_CODES["blocked"]: "blocked", EXIT_CODES["memory"]: "memory"}
    if returncode in named:
        return named[returncode]
    return "killed" if returncode is None or returncode < 0 else "error"


# The child runs the functions of sandbox_child as ``python -c`` source (it imports nothing from verl).
_CHILD_SOURCE = "\n\n".join(inspect.getsource(f) for f in (
    sandbox_child._child_set_up, sandbox_child._child_private_mounts, sandbox_child._child_audit_hook,
    sandbox_child._child_run, sandbox_child._child_main)) + "\n_child_main()\n"
