"""Run untrusted Python (a model's answer) in a throw-away sandbox and always get control back.

``run_python`` starts ``python -I -B`` (the trainer's interpreter) with a minimal environment, in a
new session, and returns within about ``limits.wall_seconds``: the process group and (as root)
every process of the run's uid are then SIGKILLed and the working directory removed, whatever
happened. The program's stdin, stdout and stderr are memfds (stdin sealed read-only, output capped
by RLIMIT_FSIZE); the job comes in on a pipe and results go out on another (no file to reopen).

The verdict is never made inside the sandbox. ``calls`` (``sandbox_verdict.Call``) are expressions
the sandbox evaluates after the program ran; their results come back as plain data that the
caller judges (``scorers/code.py`` does, with ``sandbox_verdict.judge``). Expected outputs never
enter the sandbox, so there is nothing there to read or tamper with; the calls follow the job on its
pipe one at a time, each once the previous result came back, so none is there before its turn.

Layers (``SandboxResult.layers`` says which ones a run got; ``sandbox_child`` says how):

* trainer (every run): the trainer process makes itself non-dumpable (``PR_SET_DUMPABLE`` 0,
  process-wide, once): processes of its uid cannot ptrace it or read its ``/proc/<pid>/mem``,
  ``environ`` or ``fd`` (``PROTECT_TRAINER`` turns this off). The run's processes are
  non-dumpable too.
* namespaces (``user_namespace``, ``network_namespace``, ``ipc_namespace``, ``pid_namespace``):
  new user, mount, network, IPC and pid namespaces, for root and for a plain user alike (then by
  unprivileged ``unshare``); no capability survives into the program, and it cannot create user
  namespaces of its own. Network: only a loopback that is down (abstract unix sockets included).
  Pid: the sandbox sees only its own processes, so it cannot name the trainer to signal, trace or
  read it; when the namespace's first process ends, the kernel kills the rest. Root falls back to
  the other namespaces without a user namespace where one is refused.
* filesystem (``private_mounts``, ``private_workdir``, ``private_proc``, ``private_dev``,
  ``private_shm``): a new root holding only the system directories (/usr, /bin, /lib*, /sbin, /etc)
  and the interpreter's prefixes, all read-only (checked mount by mount); a /proc of the sandbox's
  own; a minimal /dev (null, zero, full, random, urandom, the fd links, an empty private /dev/shm:
  no terminal, GPU or disk nodes, none of the trainer's shared memory); and as the
  working directory, at its usual path, a private tmpfs of ``max_disk_bytes``. The trainer's home,
  repository, data sets, /tmp, /run, /var ... are not there at all.
* own uid (root): the run drops to uid = gid = ``UID_BASE + pid``, no groups, after the
  interpreter started (``PRELOAD`` is imported first: without the new root the interpreter may be
  unreadable then). RLIMIT_NPROC then counts only the run, and the parent can sweep every
  process of it. A plain user's run keeps the trainer's uid (inside its namespaces).
* rlimits (any user): CPU, address space (MemoryError -> ``memory``), file size, open files,
  processes, no core dumps; no-new-privileges.
* keyring and system calls (any user): a fresh, empty session keyring (``own_keyring``), and a
  seccomp filter (``seccomp``, see ``sandbox_seccomp``) that kills keyring, memfd, ptrace, bpf,
  io_uring, mount and namespace calls, signals to other processes (by kill, or as a file's owner: F_SETOWN),
  their scheduling (nice, CPU affinity, policy) and leaving the process group (setsid, setpgid), even from
  native code.
* writes (any user, where the kernel has Landlock): every write, file made, removed or renamed
  outside the working directory (and /dev/null ...) fails, even from native code (``landlock``,
  see ``sandbox_landlock``); in weak mode this is what confines files, and reads are confined too (to what
  the new root would show).
* audit hook (on by default): a second layer in Python, see ``sandbox_hook``.

Where the namespaces cannot be had (a plain user on a system that refuses unprivileged user
namespaces, or root without CAP_SYS_ADMIN), the run goes on with weak isolation, and the first
such run logs a warning naming the missing layers; docs/code_reward.md says what is then exposed.
``isolation()`` reports the layers up front.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import inspect
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from verl.errors import RewardError
from verl.rewards import sandbox_child, sandbox_codec, sandbox_hook, sandbox_landlock, sandbox_seccomp
from verl.rewards.sandbox_channel import _drain, _supervise
from verl.rewards.sandbox_results import MAX_ITEMS, CallResult, parse_results
from verl.rewards.sandbox_verdict import Call
from verl.rewards.sandbox_workdir import _child_watch_workdir, remove_tree

logger = logging.getLogger(__name__)

STATUSES = ("ok", "error", "timeout", "memory", "blocked", "killed")
# How the child tells the parent why it stopped. A program can fake one, which only ever turns its
# own run into a failure.
EXIT_CODES = {"blocked": 97, "memory": 98}
# uid of a run (as root) = UID_BASE + the pid of its first process: unique while that process is
# unreaped, far above any real account, and below 2**32 - 1 for every possible pid (at most 2**22).
UID_BASE = 1 << 30
# Imported by the child before it drops privileges (see the module docstring): what solutions use,
# plus what lets a network attempt reach the audit hook rather than fail on an import.
PRELOAD = ("array", "base64", "bisect", "cmath", "collections", "copy", "dataclasses", "datetime",
           "decimal", "encodings.idna", "fractions", "functools", "hashlib", "heapq", "itertools",
           "json", "math", "numbers", "operator", "queue", "random", "re", "socket", "statistics",
           "string", "struct", "textwrap", "threading", "time", "traceback", "typing", "unicodedata")
ESSENTIAL_LAYERS = ("network_namespace", "pid_namespace", "private_mounts", "seccomp")
"""Without any of these a run has weak isolation (a warning is logged once)."""

PROTECT_TRAINER = True
"""Make the trainer process non-dumpable at the first run (see ``_protect_trainer``). Set it to
False before the first run only if something must ptrace this process or take fds from it with
``pidfd_getfd`` (a debugger, py-spy, CUDA IPC of expandable segments) and ``isolation()`` shows the
namespaces: without them, a plain user's sandbox could then read the trainer's memory."""

_SECCOMP = sandbox_seccomp.filter_spec()  # None on an architecture the filter does not know
_NAMESPACES = True  # switched off only by tests, to exercise the weak mode
_USER_NAMESPACE = True  # switched off only by tests, to exercise root's fallback without one
_LANDLOCK = True  # switched off only by tests, for the control against an unprotected trainer (Landlock also
# keeps a run from reading /proc/<pid>/environ and mem of processes outside its domain)


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
    """Largest file the run may write (RLIMIT_FSIZE), stdout and stderr included; also the most
    bytes of results read back."""
    max_open_files: int = 64
    """RLIMIT_NOFILE."""
    max_processes: int = 1
    """RLIMIT_NPROC for the run's uid: 1 forbids fork and threads (the audit hook refuses fork anyway)."""
    max_disk_bytes: int = 32 * 2**20
    """Size of the private working directory (a tmpfs; where the mount namespace is available). In weak
    mode (a host directory) the run is killed once the directory holds more, or more than 1 entry per 4 KiB
    of it (``sandbox_workdir._child_watch_workdir``)."""
    max_shm_bytes: int = 4 * 2**20
    """Size of the private, empty /dev/shm (a tmpfs; where the mount namespace is available)."""
    max_result_items: int = MAX_ITEMS
    """Most values (items, keys, containers) all call results of one run may hold together; the
    trainer's work and memory to decode them follow this, not only ``max_output_bytes``."""
    audit_hook: bool = True
    """Refuse escapes in Python (see ``sandbox_hook``). Off only to test that the OS layers hold alone."""
    seccomp: bool = True
    """The system-call filter (see ``sandbox_seccomp``). Off only to test that the other layers hold alone."""

    def __post_init__(self):
        minimum = {"wall_seconds": 0.1, "cpu_seconds": 1, "memory_bytes": 64 * 2**20,
                   "max_output_bytes": 1024, "max_open_files": 8, "max_processes": 1,
                   "max_disk_bytes": 64 * 1024, "max_shm_bytes": 64 * 1024, "max_result_items": 1}
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
    """True when stdout, stderr or the results reached ``max_output_bytes``."""
    layers: dict[str, bool] = field(default_factory=dict)
    """Which containment layers the run got (empty if it died before reporting)."""
    results: list[CallResult | None] = field(default_factory=list)
    """One per call: its plain result, the exception it raised, or None (never came back)."""
    cpu_seconds: float | None = None
    """CPU time of the run's processes, as the kernel accounted it to the trainer (None if unreaped)."""


def run_python(code: str, stdin: str = "", *, limits: SandboxLimits = SandboxLimits(),
               calls: Sequence[Call | str] = ()) -> SandboxResult:
    """Run ``code`` with ``stdin`` in a sandbox; then, if the program ended normally, evaluate
    each of ``calls`` (expressions, e.g. ``"add(1, 2)"``) in its namespace and return their
    results as plain data in ``SandboxResult.results``. Never raises for anything the program does."""
    calls = [c if isinstance(c, Call) else Call(str(c)) for c in calls]
    _protect_trainer()
    # The settings (their length first: the launcher reads them to the byte), then the program's text on a line
    # of its own, which only the sandboxed process reads (see sandbox_child._child_launch).
    settings = (json.dumps({"calls": len(calls), "limits": dataclasses.asdict(limits), "exit_codes": EXIT_CODES,
                            "uid_base": UID_BASE, "preload": PRELOAD, "namespaces": _NAMESPACES,
                            "user_namespace": _USER_NAMESPACE, "landlock": _LANDLOCK, "seccomp": _SECCOMP})
                + "\n").encode()
    job = b"%d\n" % len(settings) + settings + (json.dumps(code) + "\n").encode()
    call_lines = [(json.dumps(dataclasses.asdict(c)) + "\n").encode() for c in calls]
    workdir = tempfile.mkdtemp(prefix="verl-sandbox-")
    proc, opened = None, []

    def own(fd: int) -> int:
        opened.append(fd)
        return fd

    try:
        stdin_fd = own(_memfd("verl-stdin", stdin.encode("utf-8", "surrogatepass")))
        out_fd, err_fd = own(_memfd("verl-stdout")), own(_memfd("verl-stderr"))
        job_r, job_w = map(own, os.pipe())
        results_r, results_w = map(own, os.pipe())
        for fd in (job_r, results_r):  # no process opens either pipe again (both ends share the inode): see _memfd
            os.fchmod(fd, 0)
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", _STUB, _CHILD_SOURCE, str(job_r), str(results_w)],
            stdin=stdin_fd, stdout=out_fd, stderr=err_fd, pass_fds=(job_r, results_w), cwd=workdir,
            env={"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LC_ALL": "C.UTF-8"},
            start_new_session=True)
        for fd in (job_r, results_w, job_w):  # the child's ends (EOF on results once the run is
            opened.remove(fd)                 # gone), and the job's, which _supervise closes
            if fd != job_w:
                os.close(fd)
        exited, results = _supervise(proc.pid, job_w, job, call_lines, results_r, limits)
        _kill_run(proc.pid)
        returncode, cpu = _reap(proc)
        wall = time.monotonic() - started
        results_full = _drain(results_r, results, limits.max_output_bytes)
        layers, values = parse_results(bytes(results), len(calls), limits.max_result_items)
        stdout, stdout_full = _read_capped(out_fd, limits.max_output_bytes)
        stderr, stderr_full = _read_capped(err_fd, limits.max_output_bytes)
        _warn_if_weak(layers, limits)
        return SandboxResult(_status(exited, returncode, cpu, limits), stdout, stderr, returncode, wall,
                             stdout_full or stderr_full or results_full, layers, values, cpu)
    finally:
        if proc is not None and proc.returncode is None:  # an exception above: still leave nothing
            _kill_run(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for fd in opened:
            with contextlib.suppress(OSError):
                os.close(fd)
        remove_tree(workdir)


def isolation(limits: SandboxLimits = SandboxLimits(wall_seconds=10)) -> dict[str, bool]:
    """The layers a run gets on this machine (runs an empty program; logs the weak-isolation
    warning if it applies). Call it at start-up to know before the first reward."""
    return run_python("pass", limits=limits).layers


# ------------------------------------------------------------------------------- the trainer's side
_lock = threading.Lock()
_state = {"protected": False, "warned": False}


def _protect_trainer() -> None:
    """Make the trainer non-dumpable, once: same-uid processes cannot ptrace it or read its
    /proc/<pid>/mem, environ or fd (they become root-owned). Side effects, process-wide: no core
    dumps, and a debugger or py-spy attaching to the trainer needs root."""
    import ctypes

    with _lock:
        if _state["protected"] or not PROTECT_TRAINER:
            return
        _state["protected"] = True
        libc = ctypes.CDLL(None, use_errno=True)
        zero = ctypes.c_ulong(0)
        if libc.prctl(4, zero, zero, zero, zero) != 0:  # PR_SET_DUMPABLE
            logger.warning("verl sandbox: could not make the trainer non-dumpable (errno %d)",
                           ctypes.get_errno())


def _warn_if_weak(layers: dict[str, bool], limits: SandboxLimits) -> None:
    missing = [name for name in ESSENTIAL_LAYERS if not layers.get(name) and (name != "seccomp" or limits.seccomp)]
    if not layers or not missing:
        return
    with _lock:
        if _state["warned"]:
            return
        _state["warned"] = True
    mode = "root" if os.geteuid() == 0 else "a plain user (unprivileged user namespaces refused?)"
    landlock = layers.get("landlock")
    # With Landlock, reads are confined too (to what the new root would show), but not a file's mode.
    native = ("change the mode (chmod) of files this uid owns" if landlock else "read and write what this uid may")
    exposed = (f"a program that loads native code may {native}" if layers.get("seccomp") else
               f"it may reach the network{'' if landlock else ', write what this uid may write,'} and signal this "
               "uid's processes")
    logger.warning(
        "verl code-reward sandbox runs with WEAK ISOLATION as %s: %s could not be set up. Only "
        "rlimits, %s%s%sthe audit hook%s contain a hostile program: %s. Rewards stay correct (they are "
        "judged outside the sandbox). See docs/code_reward.md, 'Isolation modes'.", mode, ", ".join(missing),
        "its own uid, " if layers.get("own_uid") else "", "the system-call filter, " if layers.get("seccomp") else "",
        "Landlock (writes confined to its directory, reads to it and the system directories), " if landlock else "",
        " and the trainer's non-dumpable flag" if _state["protected"] else " (the trainer is NOT protected: "
        "PROTECT_TRAINER is False)", exposed)


def _memfd(name: str, data: bytes | None = None) -> int:
    """An anonymous file; with ``data``, filled, rewound and sealed against any change. Without, an output
    file that no process can open again (mode 0): the trainer reads it through its own fd."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    if data is None:
        fcntl.fcntl(fd, fcntl.F_SETFL, os.O_APPEND)  # a program reopening /dev/stdout keeps what it printed
        # A run's launcher is dumpable until it has imported PRELOAD: in a plain user's weak mode without
        # Landlock, another run of the trainer opened its /proc/<pid>/fd/1 then and read what it printed later
        # (a sibling sample's answer), or wrote over it. The sandboxed process, never dumpable, makes it 0200
        # (sandbox_child._child_drop), so that /dev/stdout can be opened again to write. The pipes: mode 0.
        os.fchmod(fd, 0)
        return fd
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                | fcntl.F_SEAL_WRITE)
    return fd


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


def _read_capped(fd: int, cap: int) -> tuple[str, bool]:
    data = os.pread(fd, cap, 0)
    return data.decode("utf-8", "replace"), len(data) >= cap


def _reap(proc: subprocess.Popen) -> tuple[int | None, float | None]:
    """Reap the run's first process: ``(exit status, CPU seconds of the whole run)``. The rusage
    of wait4 counts the descendants each stage waited for, so it includes the program's CPU time:
    the trainer's own measure, which no program can fake. Gives up after 10 s (a process stuck in
    the kernel, D state) rather than hang the trainer."""
    deadline = time.monotonic() + 10
    while True:
        try:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere
            return proc.returncode, None
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)  # so that Popen never waits on it again
            return proc.returncode, usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            return None, None
        time.sleep(0.002)


def _status(exited: bool, returncode: int | None, cpu: float | None, limits: SandboxLimits) -> str:
    """The status, from what the trainer saw: its own clock, the CPU time the kernel accounted,
    and how the run ended. SIGXCPU without the CPU time spent is a signal the program sent itself."""
    if not exited or (returncode == -signal.SIGXCPU and cpu is not None and cpu >= limits.cpu_seconds - 0.05):
        return "timeout"
    named = {0: "ok", EXIT_CODES["blocked"]: "blocked", EXIT_CODES["memory"]: "memory", -signal.SIGSYS: "blocked"}
    if returncode in named:
        return named[returncode]
    return "killed" if returncode is None or returncode < 0 else "error"


# The child runs sandbox_child's and sandbox_hook's functions as ``python -c`` source compiled
# as <verl-sandbox> (the audit hook recognises the harness's frames by that name).
_STUB = "import sys; exec(compile(sys.argv[1], '<verl-sandbox>', 'exec'))"
_CHILD_SOURCE = "\n\n".join(inspect.getsource(f) for f in (
    sandbox_child._child_launch, sandbox_child._child_namespaces, sandbox_child._child_private_mounts,
    sandbox_child._child_init, _child_watch_workdir, sandbox_child._child_drop, sandbox_landlock._child_landlock,
    sandbox_child._child_run,
    sandbox_child._child_exit_code, sandbox_codec._child_encode, sandbox_codec._child_decode,
    sandbox_seccomp._child_seccomp_program, sandbox_seccomp._child_seccomp, sandbox_hook._child_audit_hook)) + """

_state = _child_init(_child_launch())
_child_drop(_state)
if _state["job"]["limits"]["audit_hook"]:
    _child_audit_hook(__import__("os").getcwd(), _state["job"]["exit_codes"]["blocked"])
_child_run(_state["job"], _state["results_fd"], _state["job_fd"], _state["pending"])
"""
