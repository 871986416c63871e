"""The sandbox's audit hook: a second layer, in Python, behind the OS layers (see ``sandbox``).

Shipped as source into the sandboxed process like ``sandbox_child`` (stdlib only, imports inside).

The hook cannot be removed from Python, and its state cannot be changed from Python either: the
hook and its helpers read nothing from globals or closure cells; everything they use is bound as
*positional* default arguments (held in a tuple) and is itself immutable (builtin functions,
str, int, tuple, frozenset). Replacing the ``__code__``, ``__defaults__`` or ``__kwdefaults__`` of
a function of the harness is refused. So a program that gets hold of the hook's frame (by a
``RecursionError`` raised inside it, a signal handler's frame argument ...) finds nothing it can
modify. Every check fails closed: an exception inside the hook fails the audited operation.
"""


def _child_audit_hook(workdir: str, exit_blocked: int) -> None:
    """Install the hook. A refused event writes a line to stderr and ends the run (``blocked``);
    reading frames out of tracebacks, generators and coroutines raises RuntimeError instead, so
    that ``traceback.print_exc()`` in a solution fails that call rather than the whole sample."""
    import posix
    import stat
    import sys

    streams = set()  # the run's own stdin/stdout/stderr and /dev/null may be re-opened by path
    for fd in (0, 1, 2):
        try:
            st = posix.fstat(fd)
            streams.add((st.st_dev, st.st_ino))
        except OSError:
            pass
    st = posix.stat("/dev/null")
    streams.add((st.st_dev, st.st_ino))

    def deny(event, why, write=posix.write, exit_=posix._exit, code=exit_blocked):
        write(2, ("sandbox: refused " + event + ": " + why + "\n").encode("utf-8", "replace"))
        exit_(code)

    def as_str(event, path, deny=deny, type_=type, str_=str, bytes_=bytes):
        if type_(path) is bytes_:
            return path.decode("utf-8", "surrogateescape")
        if type_(path) is not str_:  # a path object could name one file now and another when opened
            deny(event, "paths must be str or bytes, not " + type_(path).__name__)
        return path

    def resolve(path, follow_last, getcwd=posix.getcwd, lstat=posix.lstat, readlink=posix.readlink,
                is_link=stat.S_ISLNK, oserror=OSError):
        """The absolute path the kernel would reach, symlinks followed (for a /proc/self/fd link,
        the text the kernel shows); None for a symlink loop."""
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

    def inside(target, workdir=workdir):
        return target is not None and (target == workdir or target.startswith(workdir + "/"))

    def is_directory(target, stat_=posix.stat, is_dir=stat.S_ISDIR, is_fifo=stat.S_ISFIFO, oserror=OSError):
        """A directory, or a fifo: an open of a fifo blocks, and is retried after the program's
        signal handlers ran (EINTR), without a second audit event, on whatever the path names then."""
        try:
            mode = stat_(target).st_mode if target is not None else 0
        except oserror:
            return False
        return is_dir(mode) or is_fifo(mode)

    def is_stream(path, stat_=posix.stat, streams=frozenset(streams), oserror=OSError):
        """The path (a /dev/stdout or /proc/self/fd link included) is one of the run's own streams,
        checked by inode: after ``os.dup2(file, 1)``, /dev/stdout is that file and not a stream."""
        try:
            st = stat_(path)
        except oserror:
            return False
        return (st.st_dev, st.st_ino) in streams

    refused = frozenset({
        "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
        "os.kill", "os.killpg", "signal.pthread_kill", "os.unshare", "os.setns",
        "gc.get_objects", "gc.get_referrers", "gc.get_referents",
        "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile",
        "code.__new__", "function.__new__", "sys.remote_exec", "cpython.remote_debugger_script"})
    # _posixshmem and _multiprocessing open /dev/shm files and semaphores with no audit event; readline
    # (history files), _sqlite3 (connect, ATTACH, VACUUM INTO), _tkinter (Tcl's open, file, load), _dbm
    # and _gdbm write files with no "open" event either. Checked on every part of a dotted name: an
    # extension module loads under any package name that ends in its own (``_imp.create_dynamic`` of
    # a spec named "x._testcapi" runs PyInit__testcapi).
    refused_imports = frozenset({"ctypes", "_ctypes", "_posixsubprocess", "_xxsubinterpreters",
                                 "_xxinterpchannels", "_interpreters", "_interpchannels", "_interpqueues",
                                 "_posixshmem", "_multiprocessing", "readline", "_sqlite3", "_tkinter", "_dbm",
                                 "_gdbm"})
    # Under /dev only these open (and the run's own streams): no terminal, /dev/shm, GPU or disk.
    devices = frozenset({"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"})
    frame_attributes = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
    function_attributes = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
    # event -> ((argument position, follow a final symlink), ...), positions of dir_fd arguments
    path_events = (("os.mkdir", ((0, False),), (2,)), ("os.rmdir", ((0, False),), (1,)),
                   ("os.remove", ((0, False),), (1,)), ("os.rename", ((0, False), (1, False)), (2, 3)),
                   ("os.link", ((0, True), (1, False)), (2, 3)), ("os.symlink", ((1, False),), (2,)),
                   ("os.chmod", ((0, True),), (2,)), ("os.chown", ((0, True),), (3,)),
                   ("os.utime", ((0, True),), (3,)), ("os.truncate", ((0, True),), ()),
                   ("os.setxattr", ((0, True),), ()), ("os.removexattr", ((0, True),), ()))

    def hook(event, args, deny=deny, as_str=as_str, resolve=resolve, inside=inside,
             is_directory=is_directory, is_stream=is_stream, refused=refused,
             refused_imports=refused_imports, devices=devices, frame_attributes=frame_attributes,
             function_attributes=function_attributes, path_events=path_events,
             writing=posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_TRUNC | posix.O_APPEND,
             directory=posix.O_DIRECTORY | posix.O_PATH, type_=type, str_=str, int_=int, tuple_=tuple,
             frame_type=type(sys._getframe()), function_type=type(_child_audit_hook),
             runtime_error=RuntimeError, set_lease=1024, owner_fcntls=frozenset({8, 10, 15}),
             owner_ioctls=frozenset({0x8901, 0x8902})):
        if type_(event) is not str_ or type_(args) is not tuple_:
            return  # only sys.audit() from the program itself can send these; nothing follows them
        if event == "open":
            path, flags = args[0], args[2]
            if type_(path) is int_:  # an fd this process already holds
                return
            text = as_str(event, path)
            target = resolve(text, True)
            if flags & directory or is_directory(target):  # a dir fd would make dir_fd escapes possible
                deny(event, "opening a directory or a fifo (" + str_(target) + ")")
            if target is None or target.startswith("/dev/") and target not in devices and not is_stream(text):
                deny(event, "opening " + str_(target) + ": only /dev/null, zero, full, random and urandom")
            if flags & writing and not inside(target) and not is_stream(text):
                deny(event, "writing " + str_(target) + ", outside the working directory")
        elif event in refused or event.startswith(("socket.", "ctypes.")):
            deny(event, "not allowed in the sandbox")
        elif event == "import":
            name = args[0]
            if type_(name) is not str_:
                deny(event, "module names must be str")
            for part in name.split("."):
                if part in refused_imports or part.startswith("_test"):
                    deny(event, name + " is not allowed in the sandbox")
        elif event == "fcntl.fcntl":
            if args[1] == set_lease:  # a leased file makes the program's own open of it block (see is_directory)
                deny(event, "file leases are not allowed in the sandbox")
            # F_SETOWN, F_SETSIG, F_SETOWN_EX (and FIOSETOWN, SIOCSPGRP below, by ioctl): the kernel signals a
            # file's owner when I/O on it is possible, with no kill to check (the filter refuses them too)
            if type_(args[1]) is int_ and (args[1] & 0xFFFFFFFF) in owner_fcntls:
                deny(event, "setting the owner of a file, whom the kernel signals, is not allowed in the sandbox")
        elif event == "fcntl.ioctl":
            if type_(args[1]) is int_ and (args[1] & 0xFFFFFFFF) in owner_ioctls:  # the kernel reads 32 bits
                deny(event, "setting the owner of a file, whom the kernel signals, is not allowed in the sandbox")
        elif event == "object.__getattr__":
            if type_(args[1]) is str_ and args[1] in frame_attributes:
                raise runtime_error("sandbox: reading " + str_(args[1]) + " is refused")
        elif event in ("object.__setattr__", "object.__delattr__"):
            if (type_(args[0]) is function_type and type_(args[1]) is str_ and args[1] in function_attributes
                    and args[0].__code__.co_filename == "<verl-sandbox>"):  # __code__: audited, allowed
                deny(event, "changing " + str_(args[1]) + " of a function of the sandbox's harness")
        elif event == "sys._getframe":
            frame = args[0]
            if type_(frame) is frame_type:
                filename = frame.f_code.co_filename  # f_code is audited too, and allowed
                if filename == "<verl-sandbox>" or (filename == "<string>" and frame.f_back is None):
                    deny(event, "a frame of the sandbox's harness")
        elif event == "resource.prlimit":
            if args[0] != 0:
                deny(event, "limits of another process")
        else:
            for name, paths, dir_fds in path_events:
                if event != name:
                    continue
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
