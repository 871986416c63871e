"""The sandbox attacks on the host's resources (issues 9 and 22, and the rounds after): limits raised, threads,
processes and mappings past them, and what a run can hold outside RLIMIT_AS or leave behind (directories, memory
in its output streams, kernel objects). Data only, imported by ``sandbox_escape_programs`` into its ``ATTACKS``."""

# Limits cannot be raised, and no second thread or process, and no mapping past RLIMIT_AS.
RESOURCES = r"""
import os, resource, threading
for which in (resource.RLIMIT_NPROC, resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_FSIZE):
    try:
        resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        print("LEAK raised limit", which)
    except (ValueError, OSError):
        pass
try:
    import mmap
    mapped = mmap.mmap(-1, 4 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0))
    print("LEAK mapped 4 GiB")
except (ImportError, OSError, MemoryError, OverflowError):
    pass
try:
    threading.Thread(target=lambda: None).start()
    print("LEAK started a thread")
except (RuntimeError, OSError):
    pass
try:
    if os.fork() == 0:
        os._exit(0)
    print("LEAK forked")
except OSError:
    pass
"""
# Directories cost the host's file system ~10 times more to remove than to make: in weak mode (a host
# working directory) 11,000 made in a 2 s run took the trainer ~19 s to remove. The filter refuses
# mkdir there; with namespaces the private tmpfs caps the count (its nr_inodes) and goes with the run.
MANY_DIRECTORIES = r"""
import os
print("WORKDIR", os.getcwd(), flush=True)
made = 0
try:
    while made < 100000:
        os.mkdir("d%d" % made)
        made += 1
except OSError as error:
    print(type(error).__name__)
print("MADE", made)
"""

# Memory outside RLIMIT_AS: the run's stdout and stderr are memfds, and fallocate with
# FALLOC_FL_KEEP_SIZE allocates pages without growing the file. RLIMIT_FSIZE bounds the range (EFBIG).
FALLOCATE_STREAMS = r"""
import os, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
for fd in (1, 2):
    try:
        os.posix_fallocate(fd, 0, 1 << 30)
        print("LEAK allocated 1 GiB on fd", fd)
    except OSError:
        pass
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for fd in (1, 2):
    for mode in (0, 1, 3):  # 1: FALLOC_FL_KEEP_SIZE, 3: and PUNCH_HOLE
        if libc.fallocate(fd, mode, ctypes.c_long(1 << 20), ctypes.c_long(1 << 30)) == 0 and mode != 3:
            print("LEAK allocated 1 GiB on fd", fd, "mode", mode)
print("done")
"""

# Kernel memory outside RLIMIT_AS, in objects a run may make without limit of its own: the queues of unix
# socket pairs (socketpair is not socket: 29 pairs held 227 MiB in a run of 256 MiB), and POSIX timers,
# bounded only by RLIMIT_SIGPENDING, counted per uid (96,367 timers here, shared with the trainer's uid in
# a plain user's runs).
SOCKET_PAIRS = r"""
import socket
try:
    pair = socket.socketpair()
    print("LEAK made a socket pair:", pair)
except OSError as error:
    print("refused:", error)
"""
POSIX_TIMERS = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
timer = ctypes.c_void_p()
made = 0
while made < 4096 and libc.timer_create(1, None, ctypes.byref(timer)) == 0:  # CLOCK_MONOTONIC
    made += 1
print(("LEAK made %d POSIX timers" if made == 4096 else "made %d POSIX timers") % made)
"""
