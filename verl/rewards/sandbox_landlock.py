"""The sandbox's write confinement (Landlock), a layer below the audit hook that native code cannot pass.

Where the kernel has Landlock (Linux >= 5.13, the LSM enabled), the sandboxed process restricts itself,
after no-new-privileges and before the program runs: every write, file made, removed, renamed, linked or
truncated outside its working directory (and the private /dev/shm, /dev/null, zero, full, random,
urandom) fails, for native code too, and it can no longer reach the /proc mem and environ of processes
outside the run, nor (Linux >= 6.12) signal them, by ``kill`` or as the owner of a file (``F_SETOWN``). In
weak mode (no namespaces) this is what keeps files safe: the audit hook's path checks race with the
program's signal handlers, which run inside the hook, and reads are confined too, to the working directory,
the system directories, the interpreter and /proc (what the new root would show): a world-readable data set
on the host held the expected outputs.

This module's ``_child_landlock`` runs in the sandbox (shipped as source, stdlib only).
"""


def _child_landlock(libc, directories: list, readable: list | None = None) -> bool:
    """Confine every write of this process and its future children to ``directories`` ("." is the
    working directory) and to /dev/null, zero, full, random, urandom, with Landlock, if the kernel
    has it (Linux >= 5.13, the LSM enabled): making, removing, renaming, linking, truncating and
    writing files anywhere else fails with EACCES, for native code too. Not confined: reads, and
    metadata (chmod, utime, xattrs: Landlock has no right for them). Already open files (the run's
    streams) are not affected, and re-opening a memfd (/dev/stdout) is not a path Landlock checks.
    Landlock also denies ptrace-mode access (/proc/<pid>/mem, environ) to processes outside the run, and (ABI 6,
    Linux >= 6.12) signals to them, those the kernel sends a file's owner (``F_SETOWN``) included.
    In weak mode this is what keeps the program inside its directory; the audit hook's path checks
    alone race with the program's signal handlers, which run inside the hook. With ``readable`` (weak
    mode: no new root hides the host's files), reading files and listing directories is confined too,
    to ``directories``, ``readable`` and the /dev nodes above: the trainer's data sets (the expected
    outputs), home and repository are no longer readable. True if it took."""
    import ctypes
    import os

    # landlock_create_ruleset, landlock_add_rule, landlock_restrict_self: the same numbers on every
    # architecture. Rights: LANDLOCK_ACCESS_FS_WRITE_FILE (1 << 1), REMOVE_DIR ... MAKE_SYM (4 to 12),
    # REFER (13, ABI 2), TRUNCATE (14, ABI 3); READ_FILE (2) and READ_DIR (3) with ``readable``. Not handled,
    # so allowed: EXECUTE, and the reads without ``readable``.
    create, add, restrict = ctypes.c_long(444), ctypes.c_long(445), ctypes.c_long(446)
    abi = libc.syscall(create, ctypes.c_void_p(None), ctypes.c_size_t(0), ctypes.c_uint32(1))  # ..._VERSION
    if abi < 1:
        return False
    reads = (1 << 2 | 1 << 3) if readable is not None else 0  # READ_FILE, READ_DIR
    file_rights = 1 << 1 | (1 << 14 if abi >= 3 else 0) | (reads & 1 << 2)
    handled = file_rights | sum(1 << bit for bit in range(4, 13)) | (1 << 13 if abi >= 2 else 0) | reads

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    # ABI 6 (Linux 6.12): signals, by kill or by the owner of a file (F_SETOWN: the kernel signals the owner when
    # I/O on the file is possible), and abstract unix sockets reach no process outside the run (``scoped``).
    attr = (ctypes.c_uint64 * 3)(handled, 0, 1 << 0 | 1 << 1)  # fs, net; scoped: ABSTRACT_UNIX_SOCKET, SIGNAL
    size = ctypes.sizeof(attr) if abi >= 6 else 8
    ruleset = libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return False
    rules = [(path, handled) for path in directories] + [(path, reads) for path in readable or ()]
    rules += [("/dev/" + node, file_rights) for node in ("null", "zero", "full", "random", "urandom")]
    try:
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if os.fstat(fd).st_mode & 0o170000 != 0o040000:  # not a directory: only the rights of files
                    rights &= file_rights
                rule = PathBeneath(rights, fd)
                if libc.syscall(add, ctypes.c_long(ruleset), ctypes.c_long(1),  # LANDLOCK_RULE_PATH_BENEATH
                                ctypes.byref(rule), ctypes.c_long(0)):
                    return False
            finally:
                os.close(fd)
        return libc.syscall(restrict, ctypes.c_long(ruleset), ctypes.c_long(0)) == 0
    finally:
        os.close(ruleset)
