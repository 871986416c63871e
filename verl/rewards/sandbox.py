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


# ---- The child's side. These functions are shipped as source (``python -c``), so each one imports
# what it needs and nothing from verl; set-up locals (ctypes, the job file) die with their frames.


def _child_main() -> None:
    import os
    import sys

    with os.fdopen(int(sys.argv[1]), "r+b") as job_file:
        job = _child_set_up(job_file)
    if job["limits"]["audit_hook"]:
        _child_audit_hook(os.getcwd(), job["exit_codes"]["blocked"])
    _child_run(job["code"], job["check"], job["exit_codes"])


def _child_set_up(job_file) -> dict:
    """Namespaces, preloads, privilege drop, rlimits, then the layers report; returns the job."""
    import ctypes
    import json
    import os
    import resource
    import sys

    job = json.loads(job_file.read())
    limits = job["limits"]
    libc = ctypes.CDLL(None, use_errno=True)
    is_root = os.geteuid() == 0
    layers = {"network_namespace": libc.unshare(0x40000000) == 0,  # CLONE_NEWNET
              "private_mounts": is_root and _child_private_mounts(libc),
              "own_uid": False, "no_new_privs": False, "audit_hook": limits["audit_hook"]}
    for name in job["preload"]:
        __import__(name)
    if is_root:
        uid = job["uid_base"] + os.getpid()
        for fd in (0, 1, 2):  # so that /dev/stdin, /dev/stdout, /dev/stderr can still be opened
            os.fchown(fd, uid, uid)
        os.chown(".", uid, uid)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        layers["own_uid"] = True
    one, zero = ctypes.c_ulong(1), ctypes.c_ulong(0)
    layers["no_new_privs"] = libc.prctl(38, one, zero, zero, zero) == 0  # PR_SET_NO_NEW_PRIVS
    cpu = limits["cpu_seconds"]
    for which, soft, hard in ((resource.RLIMIT_CPU, cpu, cpu + 1),
                              (resource.RLIMIT_AS, limits["memory_bytes"], None),
                              (resource.RLIMIT_FSIZE, limits["max_output_bytes"], None),
                              (resource.RLIMIT_NOFILE, limits["max_open_files"], None),
                              (resource.RLIMIT_NPROC, limits["max_processes"], None),
                              (resource.RLIMIT_CORE, 0, None)):
        resource.setrlimit(which, (soft, soft if hard is None else hard))
    job_file.seek(0)
    job_file.truncate()
    job_file.write(json.dumps({"layers": layers}).encode())
    # Forgotten, so importing them again is an audited import, which the hook refuses.
    for name in [n for n in sys.modules if n.split(".")[0] in ("ctypes", "_ctypes", "subprocess")]:
        del sys.modules[name]
    return job


def _child_private_mounts(libc) -> bool:
    """A private mount namespace: world-writable directories read-only, the cwd writable."""
    import ctypes
    import os

    ms_rdonly, ms_remount, ms_bind, ms_rec, ms_private = 1, 32, 4096, 16384, 1 << 18
    ms_keep = 2 | 4 | 8  # nosuid, nodev, noexec: the same bits in statvfs's f_flag
    if libc.unshare(0x20000) != 0:  # CLONE_NEWNS
        return False
    # Private first: otherwise the mounts below would propagate to the trainer's namespace.
    if libc.mount(None, b"/", None, ctypes.c_ulong(ms_rec | ms_private), None) != 0:
        return False
    here = os.getcwd()
    for path in ("/tmp", "/var/tmp", "/dev/shm"):
        if not os.path.isdir(path):
            continue
        flags = ms_remount | ms_bind | ms_rdonly | (os.statvfs(path).f_flag & ms_keep)
        if (libc.mount(path.encode(), path.encode(), None, ctypes.c_ulong(ms_bind | ms_rec), None) != 0
                or libc.mount(None, path.encode(), None, ctypes.c_ulong(flags), None) != 0):
            return False
    # The cwd still points at the writable original: bind it over its now read-only path.
    if libc.mount(b"/proc/self/cwd", here.encode(), None, ctypes.c_ulong(ms_bind), None) != 0:
        return False
    os.chdir(here)
    return True


def _child_audit_hook(workdir: str, exit_blocked: int) -> None:
    """Install the audit hook. All it calls is bound here from C modules and builtins, so the code
    cannot change what the hook does by monkeypatching ``os``, ``os.path`` or ``builtins``."""
    import posix
    import stat
    import sys

    lstat, stat_, readlink, getcwd, write, exit_ = (posix.lstat, posix.stat, posix.readlink,
                                                    posix.getcwd, posix.write, posix._exit)
    is_link, is_dir, type_, str_, bytes_, int_, oserror = (stat.S_ISLNK, stat.S_ISDIR, type, str,
                                                           bytes, int, OSError)
    writing = posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_TRUNC | posix.O_APPEND
    directory = posix.O_DIRECTORY | posix.O_PATH
    streams = frozenset({"/dev/null", "/dev/stdin", "/dev/stdout", "/dev/stderr"})
    refused = frozenset({"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn",
                         "os.spawn", "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill",
                         "gc.get_objects", "gc.get_referrers", "gc.get_referents"})
    refused_imports = frozenset({"ctypes", "_ctypes", "_posixsubprocess"})
    # event -> ((argument position, follow a final symlink), ...), positions of dir_fd arguments
    path_events = {"os.mkdir": (((0, False),), (2,)), "os.rmdir": (((0, False),), (1,)),
                   "os.remove": (((0, False),), (1,)), "os.rename": (((0, False), (1, False)), (2, 3)),
                   "os.link": (((0, True), (1, False)), (2, 3)), "os.symlink": (((1, False),), (2,)),
                   "os.chmod": (((0, True),), (2,)), "os.chown": (((0, True),), (3,)),
                   "os.utime": (((0, True),), (3,)), "os.truncate": (((0, True),), ()),
                   "os.setxattr": (((0, True),), ()), "os.removexattr": (((0, True),), ())}

    def deny(event, why):
        write(2, ("sandbox: refused " + event + ": " + why + "\n").encode("utf-8", "replace"))
        exit_(exit_blocked)

    def as_str(event, path):
        if type_(path) is bytes_:
            return path.decode("utf-8", "surrogateescape")
        if type_(path) is not str_:  # a path object could name one file now and another when opened
            deny(event, "paths must be str or bytes, not " + type_(path).__name__)
        return path

    def resolve(path, follow_last=True):
        """The absolute path the kernel would reach, symlinks followed; None for a symlink loop."""
        todo = ((path if path.startswith("/") else getcwd() + "/" + path).split("/"))[::-1]
        done, hops = [], 0
        while todo:
            part = todo.pop()
            if part in ("", "."):
                continue
            if part == "..":
                done = done[:-1]
                continue
            candidate = "/" + "/".join(done + [part])
            try:
                mode = lstat(candidate).st_mode
            except oserror:  # does not exist (yet): the name is taken as it is
                mode = 0
            if is_link(mode) and (todo or follow_last):
                hops += 1
                if hops > 40:
                    return None
                target = readlink(candidate)
                done = [] if target.startswith("/") else done
                todo.extend(target.split("/")[::-1])
                continue
            done.append(part)
        return "/" + "/".join(done)

    def inside(target):
        return target is not None and (target == workdir or target.startswith(workdir + "/"))

    def is_directory(target):
        try:
            return target is not None and is_dir(stat_(target).st_mode)
        except oserror:
            return False

    def hook(event, args):
        if event == "open":
            path, flags = args[0], args[2]
            if type_(path) is int_ or path in streams:  # fds this process already holds
                return
            target = resolve(as_str(event, path))
            if flags & directory or is_directory(target):  # a dir fd would make dir_fd escapes possible
                deny(event, "opening a directory (" + str_(target) + ")")
            if flags & writing and not inside(target):
                deny(event, "writing " + str_(target) + ", outside the working directory")
        elif event in refused or event.startswith(("socket.", "ctypes.")):
            deny(event, "not allowed in the sandbox")
        elif event == "import" and args[0] in refused_imports:
            deny(event, args[0] + " is not allowed in the sandbox")
        elif event in path_events:
            paths, dir_fds = path_events[event]
            for i in dir_fds:
                if args[i] != -1:
                    deny(event, "dir_fd is not allowed in the sandbox")
            for i, follow in paths:
                if type_(args[i]) is int_ and event == "os.truncate":  # an fd opened for writing
                    continue
                if type_(args[i]) is int_:
                    deny(event, "a file descriptor instead of a path")
                target = resolve(as_str(event, args[i]), follow)
                if not inside(target):
                    deny(event, str_(target) + " is outside the working directory")

    sys.addaudithook(hook)


def _child_run(code: str, check: str | None, exit_codes: dict) -> None:
    """Execute the code as ``__main__``, then the check if there is one."""
    import builtins
    import os
    import posix
    import sys
    import traceback
    import types

    exit_, write, print_exc = posix._exit, posix.write, traceback.print_exc
    if check is not None:  # a check run passes by exiting 0, which only the end of this function does
        del os._exit, posix._exit
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    sys.argv = ["solution.py"]
    try:
        exec(compile(code, "<solution>", "exec"), main.__dict__)  # noqa: S102 (the point of the sandbox)
        if check is not None:
            exec(compile(check, "<check>", "exec"), main.__dict__)  # noqa: S102
    except MemoryError:
        write(2, b"MemoryError\n")
        exit_(exit_codes["memory"])
    except SystemExit:
        if check is None:
            raise
        write(2, b"sandbox: the code exited before its check finished\n")
        exit_(exit_codes["early"])
    except BaseException:
        if check is None:
            raise
        print_exc()
        exit_(1)
    if check is not None:
        try:
            sys.stdout.flush()
        finally:
            exit_(0)


_CHILD_SOURCE = "\n\n".join(inspect.getsource(f) for f in (
    _child_set_up, _child_private_mounts, _child_audit_hook, _child_run, _child_main)) + "\n_child_main()\n"
