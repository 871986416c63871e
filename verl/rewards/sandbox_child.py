"""The sandbox's child side (see :mod:`verl.rewards.sandbox`): set-up, audit hook and the run.

These functions are not called in the trainer's process: ``sandbox.run_python`` ships their source
to ``python -I -B -c``. So each one imports what it needs, and nothing from verl.
"""

# Set-up locals (ctypes, the job file) die with their frames.


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
