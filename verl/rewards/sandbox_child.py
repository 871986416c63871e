"""The sandbox's child side (see :mod:`verl.rewards.sandbox`): isolation, privilege drop and the run.

None of this runs in the trainer's process: ``sandbox.run_python`` ships these functions' source
(and those of ``sandbox_hook``, ``sandbox_seccomp``, ``sandbox_landlock``, ``sandbox_codec`` and
``sandbox_workdir._child_watch_workdir``) to
``python -I -B -c``, compiled as ``<verl-sandbox>``. So each function imports what it needs, and nothing from verl.
Three processes take part, each started by a ``fork`` of the one before; each set-up function
returns only in the new process, so that no frame of an earlier stage (nor any of its ctypes
handles) is on the stack once the program runs:

1. the *launcher*, the trainer's child (``_child_launch``): reads the job's settings from its pipe (not the
   program, which only 3. reads: this process is dumpable for a while), closes every other fd, imports
   ``PRELOAD``, enters new user, mount, network, IPC and pid namespaces (``_child_namespaces``), makes itself
   non-dumpable, forks 2., and exits as 2. did;
2. the *init* of the new pid namespace (``_child_init``): builds and enters the new root
   (``_child_private_mounts``: system directories and the interpreter, read-only; a /proc of the
   new pid namespace; a private tmpfs as the working directory; nothing else), forks 3., reaps
   every orphan, and exits as 3. did; when it exits the kernel kills whatever is left in the
   namespace. Without the private working directory (weak mode) it watches the host directory instead
   (``sandbox_workdir._child_watch_workdir``): no tmpfs bounds what is written there;
3. the *sandboxed* process (``_child_drop``, then ``_child_run``): drops to its own uid (root)
   and every capability, sets no-new-privileges, non-dumpable and rlimits, confines its writes to
   its working directory (Landlock, ``sandbox_landlock._child_landlock``), installs the filter, writes the set-up
   report as the first line of the results pipe, installs the audit hook and runs the program,
   then each call, as the trainer sends it on the job's pipe, writing one JSON line per result.
"""


def _child_launch() -> dict:
    """Stage 1. Returns (in stage 2 only) the state the next stages need."""
    import ctypes
    import json
    import os
    import resource
    import signal
    import sys

    job_fd, results_fd = int(sys.argv[2]), int(sys.argv[3])
    # The job's settings, to the byte (their length, a line, comes first): the program's text follows on its own
    # line, with the calls after it, and only the sandboxed process reads it. This process is dumpable until it
    # has imported PRELOAD; in a plain user's weak mode without Landlock, another run of the trainer opened its
    # /proc/<pid>/mem then and later read the program out of it (a sibling sample's solution, to run as its own).
    size = b""
    while not size.endswith(b"\n"):
        byte = os.read(job_fd, 1)
        if not byte:
            break
        size += byte
    line, left = b"", int(size or b"0")
    while left > 0:
        chunk = os.read(job_fd, left)
        if not chunk:
            break
        line, left = line + chunk, left - len(chunk)
    pending = b""
    low, high = sorted((job_fd, results_fd))  # Popen passed only these; close anything else all the same
    os.closerange(3, low)
    os.closerange(low + 1, high)
    os.closerange(high + 1, max(1 << 16, resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
    job = json.loads(line)
    # The first the kernel's OOM killer takes, before the trainer (whose resident memory is far larger:
    # many runs together, each within its limits, can exhaust the host). Inherited by every stage; the
    # program cannot lower it (its /proc is read-only, or Landlock refuses the write; as root the
    # minimum is raised with it).
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    for name in job["preload"]:  # before the privilege drop: the interpreter may be unreadable then
        __import__(name)
    libc = ctypes.CDLL(None, use_errno=True)
    is_root = os.geteuid() == 0
    uid = job["uid_base"] + os.getpid() if is_root else os.geteuid()
    gid = uid if is_root else os.getegid()
    layers = dict.fromkeys(("user_namespace", "network_namespace", "ipc_namespace", "pid_namespace",
                            "private_proc", "private_mounts", "private_dev", "private_shm", "private_workdir",
                            "own_uid", "own_keyring", "no_capabilities", "no_new_privs", "landlock", "seccomp"), False)
    layers["audit_hook"] = bool(job["limits"]["audit_hook"])
    if job["namespaces"]:
        _child_namespaces(libc, is_root, uid, gid, layers, job["user_namespace"])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    libc.prctl(4, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))  # not dumpable
    child = os.fork()
    if child == 0:
        return {"job": job, "results_fd": results_fd, "job_fd": job_fd, "pending": pending, "layers": layers,
                "uid": uid, "gid": gid, "is_root": is_root}
    os.close(results_fd)
    os.close(job_fd)
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    # Stage 2 reports a signal death of stage 3 as 128 + signal: die of it too, so the trainer sees it.
    mirrored = {signal.SIGKILL, signal.SIGXCPU, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS,
                signal.SIGFPE, signal.SIGILL, signal.SIGTERM, signal.SIGXFSZ, signal.SIGSYS,
                signal.SIGPIPE, signal.SIGINT, signal.SIGHUP, signal.SIGALRM, signal.SIGQUIT}
    sig = -code if code < 0 else code - 128
    if sig in mirrored:
        if sig != signal.SIGKILL:  # SIGKILL has no handler to reset (signal.signal raised EINVAL for it)
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(code if code >= 0 else 128 - code)


def _child_namespaces(libc, is_root: bool, uid: int, gid: int, layers: dict, user_namespace: bool) -> bool:
    """New user, mount, network, IPC and pid namespaces. The user namespace maps only the
    trainer's uid and gid (a plain user: unprivileged ``unshare``), or root and the run's own uid
    (root: a helper left outside writes that mapping, which needs CAP_SETUID in the parent
    namespace); in it, creating more user namespaces is forbidden. Root falls back to the other
    namespaces alone if a user namespace is refused (or ``user_namespace`` is False, which only
    tests ask for). False if the namespaces are refused."""
    import ctypes
    import os

    newns, newnet, newpid, newipc, newuser = 0x20000, 0x40000000, 0x20000000, 0x08000000, 0x10000000
    flags = newns | newnet | newpid | newipc
    maps = {"uid_map": (0, uid) if is_root else (uid,), "gid_map": (0, gid) if is_root else (gid,)}

    def write_maps(pid):
        if not is_root:
            with open(f"/proc/{pid}/setgroups", "w") as f:
                f.write("deny")
        for name, ids in maps.items():
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write("".join(f"{i} {i} 1\n" for i in ids))

    entered = False
    if user_namespace:
        if is_root:
            ready_r, ready_w = os.pipe()
            helper = os.fork()
            if helper == 0:
                os.close(ready_w)
                try:
                    if os.read(ready_r, 1) == b"u":
                        write_maps(os.getppid())
                    os._exit(0)
                except BaseException:  # noqa: BLE001
                    os._exit(1)
            os.close(ready_r)
        entered = libc.unshare(ctypes.c_int(flags | newuser)) == 0
        try:
            if is_root:
                os.write(ready_w, b"u" if entered else b"-")
                os.close(ready_w)
                if os.waitstatus_to_exitcode(os.waitpid(helper, 0)[1]) != 0:
                    return False
            elif entered:
                write_maps("self")
        except OSError:  # e.g. an LSM that allows the namespace but not the mapping
            return False
    if entered:
        try:  # a limit of this namespace only, not of the host
            with open("/proc/sys/user/max_user_namespaces", "w") as f:
                f.write("0")
        except OSError:
            pass
        layers["user_namespace"] = True
    elif not is_root or libc.unshare(ctypes.c_int(flags)) != 0:
        return False
    layers["network_namespace"] = layers["ipc_namespace"] = layers["pid_namespace"] = True
    return True


def _child_private_mounts(libc, workdir: str, uid: int, gid: int, disk_bytes: int,
                          shm_bytes: int) -> tuple[bool, bool, bool, bool, bool]:
    """A new root: an empty tmpfs holding read-only binds of the system directories and of the
    interpreter's prefixes only (the trainer's home, repository, data, /tmp, /run, /var ... are
    not there at all), a /proc of the new pid namespace (mounted while the old /proc is still
    visible, as the kernel requires in a user namespace), a minimal /dev (null, zero, full, random,
    urandom bound from the host, the fd links, and a private empty tmpfs of ``shm_bytes`` as
    /dev/shm: no terminals, no GPU or other device nodes, none of the host's shared memory), and a
    fresh tmpfs of ``disk_bytes`` as the working directory, at its usual path. Built on the
    (host-empty) working directory, entered with pivot_root, the old root detached.
    Returns (private_mounts, private_workdir, private_proc, private_dev, private_shm)."""
    import ctypes
    import os
    import sys

    nosuid, nodev, noexec, bind, move, rec, private = 2, 4, 8, 4096, 8192, 16384, 1 << 18

    def mount(source, target, fstype, flags, options=None):
        return libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                          ctypes.c_ulong(flags), options and options.encode()) == 0

    # Private first: otherwise the mounts below would propagate to the trainer's namespace.
    if not mount(None, "/", None, rec | private) or not mount("tmpfs", workdir, "tmpfs", nosuid | nodev,
                                                              "size=1m,nr_inodes=4096,mode=0755"):
        return False, False, False, False, False
    new = workdir
    keep = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"]
    for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        keep += [prefix, os.path.realpath(prefix)]
    kept: list[str] = []
    built = True
    for path in sorted(set(keep), key=len):
        if not os.path.lexists(path) or any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            continue
        kept.append(path)
        if os.path.islink(path) and os.path.dirname(path) == "/":  # /bin -> usr/bin (merged /usr)
            os.symlink(os.readlink(path), new + path)
            continue
        os.makedirs(new + path, exist_ok=True)
        built &= mount(os.path.realpath(path), new + path, None, bind | rec)  # rec: keeps locked submounts
    os.makedirs(new + "/proc", exist_ok=True)
    os.makedirs(new + workdir, exist_ok=True)
    proc = mount("proc", new + "/proc", "proc", 1 | nosuid | nodev | noexec)  # read-only
    os.makedirs(new + "/dev", exist_ok=True)
    dev = mount("tmpfs", new + "/dev", "tmpfs", nosuid | noexec, "size=64k,nr_inodes=64,mode=0755")
    for node in ("null", "zero", "full", "random", "urandom"):  # bound, not made: mknod needs privilege
        if dev and os.path.exists("/dev/" + node):
            open(new + "/dev/" + node, "w").close()
            dev &= mount("/dev/" + node, new + "/dev/" + node, None, bind)
    if dev:
        for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                             ("stderr", "/proc/self/fd/2")):
            os.symlink(target, new + "/dev/" + link)
        os.mkdir(new + "/dev/shm")

    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    # mount_setattr(AT_FDCWD, new, AT_RECURSIVE, {MOUNT_ATTR_RDONLY}): syscall 442 everywhere.
    attr = MountAttr(1, 0, 0, 0)
    libc.syscall(ctypes.c_long(442), ctypes.c_int(-100), new.encode(), ctypes.c_uint(0x8000),
                 ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    # Checked mount by mount (and, on a kernel without mount_setattr, done that way): each remount
    # keeps the flags a user namespace may not clear (nosuid, nodev, noexec, atime).
    read_only = True
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4].encode().decode("unicode_escape") for line in f]
    for point in points:
        if point != new and not point.startswith(new + "/"):
            continue
        flags = os.statvfs(point).f_flag
        if not flags & 1:  # ST_RDONLY
            keep = (flags & (nosuid | nodev | noexec | 1024 | 2048)) | (1 << 21 if flags & 4096 else 0)
            mount(None, point, None, 32 | bind | 1 | keep)  # MS_REMOUNT | MS_BIND | MS_RDONLY
            read_only &= bool(os.statvfs(point).f_flag & 1)
    options = f"size={disk_bytes},nr_inodes={max(64, disk_bytes // 4096)},mode=0700,uid={uid},gid={gid}"
    own = mount("tmpfs", new + workdir, "tmpfs", nosuid | nodev | noexec, options)
    shm = dev and mount("tmpfs", new + "/dev/shm", "tmpfs", nosuid | nodev | noexec,
                        f"size={shm_bytes},nr_inodes=64,mode=0700,uid={uid},gid={gid}")
    os.chdir(new)
    number = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}.get(os.uname().machine)
    if number is not None and libc.syscall(ctypes.c_long(number), b".", b".") == 0:  # pivot_root(".", ".")
        entered = libc.umount2(b".", ctypes.c_int(2)) == 0  # MNT_DETACH: the old root is gone
    else:  # the switch_root way: move the new root over /, then chroot into it
        entered = mount(".", "/", None, move) and libc.chroot(b".") == 0
    if not entered:
        return False, False, False, False, False
    os.chdir(workdir)
    return built and read_only and own and dev, own, proc, dev, shm


def _child_init(state: dict) -> dict:
    """Stage 2, the pid namespace's first process. Returns (in stage 3 only) the state."""
    import ctypes
    import os

    libc = ctypes.CDLL(None, use_errno=True)
    layers = state["layers"]
    if layers["pid_namespace"]:  # the namespaces came together: a mount namespace too
        limits = state["job"]["limits"]
        (layers["private_mounts"], layers["private_workdir"], layers["private_proc"], layers["private_dev"],
         layers["private_shm"]) = _child_private_mounts(libc, os.getcwd(), state["uid"], state["gid"],
                                                        limits["max_disk_bytes"], limits["max_shm_bytes"])
        # Without the new root, hide the trainer's /proc rather than show it.
        if not layers["private_mounts"] and libc.mount(b"tmpfs", b"/proc", b"tmpfs", ctypes.c_ulong(15),
                                                       b"size=4k") != 0:
            layers["pid_namespace"] = False
    child = os.fork()
    if child == 0:
        return state
    os.close(state["results_fd"])
    os.close(state["job_fd"])
    if not layers["private_workdir"]:  # a host directory, which no tmpfs bounds: watched (no orphans here)
        limits = state["job"]["limits"]
        status = _child_watch_workdir(child, os.getcwd(), limits["max_disk_bytes"],
                                      max(64, limits["max_disk_bytes"] // 4096))
    while layers["private_workdir"]:  # as a namespace's init, reap every orphan until the sandboxed process is done
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            break
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def _child_drop(state: dict) -> None:
    """Stage 3 set-up: privileges, rlimits, then the set-up report (the first results line)."""
    import ctypes
    import json
    import os
    import resource
    import sys

    libc = ctypes.CDLL(None, use_errno=True)
    job, layers, uid, gid = state["job"], state["layers"], state["uid"], state["gid"]
    limits = job["limits"]
    zero = ctypes.c_ulong(0)
    for cap in range(64):  # empty the bounding set while allowed to (CAP_SETPCAP)
        if libc.prctl(24, ctypes.c_ulong(cap), zero, zero, zero) != 0:  # PR_CAPBSET_DROP
            break
    # stdout and stderr come with mode 0, so that nothing opened them again while the launcher was dumpable; this
    # process is not: /dev/stdout may be opened again, to write (sandbox._memfd).
    for fd in (1, 2):
        try:
            os.fchmod(fd, 0o200)
        except OSError:
            pass
    if state["is_root"]:
        if not layers["private_workdir"]:
            os.chown(".", uid, gid)
        for fd in (0, 1, 2):  # so that /dev/stdin, /dev/stdout, /dev/stderr can still be opened
            os.fchown(fd, uid, gid)
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)  # leaving uid 0 clears every capability
        layers["own_uid"] = True

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    dropped = libc.capset(ctypes.byref(Header(0x20080522, 0)), ctypes.byref((Data * 2)())) == 0  # none at all
    try:
        with open("/proc/self/status") as f:
            caps = dict(line.split(":", 1) for line in f if line.startswith(("CapPrm", "CapEff")))
        layers["no_capabilities"] = len(caps) == 2 and all(int(v, 16) == 0 for v in caps.values())
    except OSError:  # no /proc here
        layers["no_capabilities"] = dropped
    # A fresh, empty session keyring (keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)): the trainer's
    # session keys are no longer reachable, even where the filter below is not installed.
    spec = job["seccomp"]
    layers["own_keyring"] = bool(spec) and libc.syscall(ctypes.c_long(spec["keyctl"]), ctypes.c_long(1),
                                                        ctypes.c_void_p(None)) >= 0
    layers["no_new_privs"] = libc.prctl(38, ctypes.c_ulong(1), zero, zero, zero) == 0
    libc.prctl(4, zero, zero, zero, zero)  # not dumpable: no ptrace, no /proc/<pid>/mem
    cpu = limits["cpu_seconds"]
    for which, soft, hard in ((resource.RLIMIT_CPU, cpu, cpu + 1),
                              (resource.RLIMIT_AS, limits["memory_bytes"], None),
                              (resource.RLIMIT_FSIZE, limits["max_output_bytes"], None),
                              (resource.RLIMIT_NOFILE, limits["max_open_files"], None),
                              (resource.RLIMIT_NPROC, limits["max_processes"], None),
                              # Queued signals, and POSIX timers (each holds one): kernel memory outside
                              # RLIMIT_AS, counted per uid (a plain user's runs share the trainer's count).
                              (resource.RLIMIT_SIGPENDING, 64, None),
                              # No real-time scheduling and no nice value below the trainer's, whatever the
                              # trainer's own limits allow (a desktop's audio group: rtprio 95).
                              (resource.RLIMIT_RTPRIO, 0, None), (resource.RLIMIT_NICE, 0, None),
                              (resource.RLIMIT_CORE, 0, None)):
        resource.setrlimit(which, (soft, soft if hard is None else hard))
    if job["landlock"] and layers["no_new_privs"]:
        # Without the new root, reads too are confined to what it would show (the working directory, the
        # system directories, the interpreter, /proc): no data set, home or repository of the trainer's.
        readable = None if layers["private_mounts"] else ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
                                                          "/libx32", "/etc", "/proc", sys.prefix, sys.base_prefix,
                                                          sys.exec_prefix, sys.base_exec_prefix]
        layers["landlock"] = _child_landlock(libc, ["."] + ["/dev/shm"] * layers["private_shm"], readable)
    if spec and limits["seccomp"] and layers["no_new_privs"]:
        if not layers["private_workdir"]:  # a host directory: no directories made in it (see sandbox_seccomp)
            spec = {**spec, "errno": spec["errno"] + spec["weak_errno"]}
        layers["seccomp"] = _child_seccomp(libc, spec, os.getpid())
    # Forgotten, so importing them again is an audited import, which the hook refuses.
    for name in [n for n in sys.modules if n.split(".")[0] in ("ctypes", "_ctypes", "subprocess")]:
        del sys.modules[name]
    report = (json.dumps({"layers": layers}) + "\n").encode()
    while report:
        report = report[os.write(state["results_fd"], report):]


def _child_run(job: dict, results_fd: int, job_fd: int, pending: bytes) -> None:
    """Stage 3: read the program (the line after the job's settings) and run it as ``__main__``, then evaluate
    each call and write its result. The calls are read from ``job_fd`` after it (``pending``: what was read), one line
    each: the trainer sends the next only once this one's result came back (``sandbox_channel._supervise``)."""
    import atexit
    import builtins
    import json
    import posix
    import sys
    import types

    # Bound before the program runs: patching builtins, json or os later changes none of this
    # (and could only spoil the program's own results: nothing here decides a pass).
    exit_, write, read, compile_, exec_, eval_, dumps, loads = (posix._exit, posix.write, posix.read, compile, exec,
                                                                eval, json.dumps, json.loads)
    excepthook, run_exitfuncs, encode, decode, type_, str_, import_ = (
        sys.__excepthook__, atexit._run_exitfuncs, _child_encode, _child_decode, type, str, __import__)
    # A class the program defines may be named MemoryError: only the builtin classes keep their names.
    # Looked up by id: a metaclass's __eq__ and __hash__ made a class of the program's "in" a set of them.
    builtin_errors = frozenset(id(v) for v in vars(builtins).values() if isinstance(v, type) and issubclass(v, BaseException))
    id_, set_blocking, blocking_error = id, posix.set_blocking, BlockingIOError
    memory_error = MemoryError
    calls, memory_code = range(job["calls"]), job["exit_codes"]["memory"]
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    sys.argv = ["solution.py"]
    status = 0
    while b"\n" not in pending:  # the program's text, the line after the job's settings (see _child_launch)
        chunk = read(job_fd, 65536)
        if not chunk:
            break
        pending += chunk
    code, _, pending = pending.partition(b"\n")
    try:
        exec_(compile_(loads(code), "<solution>", "exec"), main.__dict__)  # noqa: S102 (the point)
    except SystemExit as stop:
        calls, status = (), _child_exit_code(stop)
    except BaseException as error:  # noqa: BLE001
        if type_(error) is memory_error:
            write(2, b"MemoryError\n")
            calls, status = (), memory_code
        else:
            excepthook(type_(error), error, error.__traceback__)
            calls, status = (), 1
    for index in calls:
        while b"\n" not in pending:
            try:
                chunk = read(job_fd, 65536)
            except blocking_error:  # the program made the pipe non-blocking: wait for the call all the same
                set_blocking(job_fd, True)
                continue
            except OSError:
                chunk = b""
            if not chunk:  # no more calls come (the trainer stopped reading results)
                break
            pending += chunk
        line, newline, pending = pending.partition(b"\n")
        if not newline:
            break
        try:
            call = loads(line)
            scope = {name: decode(value) for name, value in call["values"]}  # inputs the trainer computed
            for module in call["modules"]:
                scope[module] = import_(module)
            value = eval_(compile_(call["expression"], "<call>", "eval"), main.__dict__, scope)  # noqa: S307
            ok, payload = encode(value, call["iterate"])
            record = {"i": index, "value": payload} if ok else {"i": index, "raised": payload}
            line = dumps(record)
        except BaseException as error:  # noqa: BLE001 (SystemExit and MemoryError included)
            try:
                kind = type_(error)
                name = str_.__str__(kind.__name__) if id_(kind) in builtin_errors else "user:" + str_(kind.__name__)
                line = dumps({"i": index, "raised": name})
            except BaseException:  # noqa: BLE001
                line = '{"i": %d, "raised": "?"}' % index
        data = (line + "\n").encode()
        try:
            while data:
                data = data[write(results_fd, data):]
        except OSError:
            break
    # Python's own shutdown is skipped (its finalizers would run after the audit hooks are
    # cleared); atexit functions still run, as buffered-output templates rely on them.
    try:
        run_exitfuncs()
    except BaseException:  # noqa: BLE001
        pass
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    exit_(status)


def _child_exit_code(stop) -> int:
    """The exit status Python gives a SystemExit."""
    import sys

    code = stop.code
    if code is None:
        return 0
    if type(code) is int:
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except BaseException:  # noqa: BLE001
        pass
    return 1
