"""The sandbox's system-call filter (seccomp), a layer below the audit hook that native code cannot pass.

A program that loads native code (a C extension written to a memfd or its working directory and
loaded with ``_imp.create_dynamic``, which no audit event sees) is past the audit hook. What it
can then do is bounded by the kernel: the namespaces, its uid, its rlimits, and this filter, which
the sandboxed process installs on itself (after no-new-privileges, before the program runs) and
can never remove. The filter applies to the exact architecture of the trainer (x86_64 or
aarch64; x86's 32-bit and x32 entry points are refused outright):

* ``KILL``: the process dies of SIGSYS (status ``blocked``), for calls no solution makes and that
  reach what the sandbox hides: the kernel keyrings (keyctl, add_key, request_key), anonymous
  memory files that escape RLIMIT_AS and carry native code (memfd_create, memfd_secret), other
  processes (ptrace, process_vm_readv/writev, pidfd_open, pidfd_getfd, pidfd_send_signal, kcmp,
  process_madvise), the kernel's attack surface (bpf, perf_event_open, io_uring_*, userfaultfd,
  open_by_handle_at, name_to_handle_at, kexec_*, *_module, syslog, personality, lookup_dcookie,
  modify_ldt, uselib, iopl, ioperm), namespaces and mounts (mount, umount2, unshare, setns,
  pivot_root, chroot, fsopen, fsconfig, fsmount, fspick, move_mount, open_tree, mount_setattr,
  and clone with any CLONE_NEW* flag), SysV IPC segments outside RLIMIT_AS (shmget, shmat,
  shmctl, msgget, semget), Linux AIO contexts (io_setup: one run took 32,767 of the host's 65,536
  ``fs.aio-max-nr``, which every process of the machine shares, for as long as it ran) and POSIX message
  queues (mq_open: in weak mode, where the IPC namespace is the host's, a queue outlives the run, held
  against the uid's RLIMIT_MSGQUEUE and the host's ``fs.mqueue.queues_max``), administration (acct,
  swapon, swapoff, reboot, quotactl, vhangup), leaving
  the run's process group (setsid, setpgid: where neither a pid namespace nor an own uid ends the
  run, a plain user's weak mode, the group kill is what does, and a process outside it outlived the
  run, asleep or stopped, holding its memory), and
  special files (mknod, mknodat: ``os.mkfifo`` and ``os.mknod`` make files with no audit event, and
  opening a fifo blocks, which the hook's path check races with);
* signals, limits and scheduling only to itself: kill, tkill, tgkill, rt_sigqueueinfo and rt_tgsigqueueinfo
  must name the process's own pid; prlimit64, sched_setaffinity, sched_setscheduler, sched_setparam,
  sched_setattr, migrate_pages and move_pages its own pid or 0; setpriority and ioprio_set its own process
  (PRIO_PROCESS, IOPRIO_WHO_PROCESS) by its pid or 0; anything else is ``KILL``. A process may renice, pin to
  one CPU or make SCHED_IDLE any other of its uid with no capability (``setpriority(PRIO_USER, 0, 19)``: all
  of them at once): a run in a plain user's weak mode (the trainer's uid, no pid namespace) left the trainer
  at nice 19, SCHED_IDLE, on one CPU, after the run;
* ``ioctl`` with TIOCSTI or TIOCLINUX (typing into a terminal), FIOSETOWN or SIOCSPGRP (F_SETOWN, below) is
  ``KILL``;
* ``EACCES``: socket and socketpair (no new sockets at all; libc's own probes, e.g. for nscd, fail quietly).
  A pair of unix sockets reaches nothing, but its queues are kernel memory outside RLIMIT_AS: 29 pairs held
  227 MiB (at ``net.core.wmem_max`` = 4 MiB) in a run limited to 256 MiB;
* ``ENOSYS``: clone3, whose flags a filter cannot read (libc falls back to clone, checked above);
* ``EPERM``: fcntl F_SETOWN, F_SETOWN_EX and F_SETSIG. The owner of a file is the process the kernel signals
  (SIGIO, or any signal F_SETSIG names, SIGKILL included) when I/O on it becomes possible, with no ``kill``
  to filter: a run that made the trainer the owner of its end of the results pipe (pure Python, ``fcntl``) had
  the trainer killed by its own next read of results, in a plain user's weak mode (same uid, no pid namespace);
* ``EACCES``: inotify_init, inotify_init1, fanotify_init; ``EPERM``: fcntl F_SETPIPE_SZ. Where the run has
  no uid of its own (a plain user's runs, with or without namespaces), its inotify instances and pipe
  buffers count against the trainer's uid: three runs of 60 inotify instances each took all 128 of
  ``fs.inotify.max_user_instances`` (the trainer's own ``inotify_init1`` failed, EMFILE), and three of 30
  pipes of 1 MiB passed ``fs.pipe-user-pages-soft`` (the trainer's pipes got 2 pages, and F_SETPIPE_SZ
  failed for it). A run's pipes now keep their default 16 pages;
* success without effect: sync, syncfs. They write back every dirty page of the machine (or of a host
  file system), the trainer's included, and wait for it uninterruptibly: with 2 GB dirty on the host, a
  run blocked in ``os.sync()`` outlived its 2 s wall limit, and the trainer waits up to 10 s to reap one.
  Nothing a run writes outlives it, so there is nothing to make durable;
* ``EACCES`` where the working directory is a host directory (weak mode): mkdir, mkdirat. Nothing
  counts what a run makes there, and the trainer removes it afterwards: directories cost the
  host's file system ~10 times more to remove than to make (11,000 made in a 2 s run took ~19 s to
  remove, on ext4), while files and links cost no more to remove than to make.

This module's ``_child_seccomp`` runs in the sandbox (shipped as source, stdlib only); the table
is read in the trainer and sent in the job.
"""

from __future__ import annotations

import os

# name: (x86_64, aarch64); aarch64 uses the kernel's generic table.
_NUMBERS = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "memfd_create": (319, 279), "memfd_secret": (447, 447), "bpf": (321, 280), "perf_event_open": (298, 241),
    "mount": (165, 40), "umount2": (166, 39), "unshare": (272, 97), "setns": (308, 268),
    "pivot_root": (155, 41), "chroot": (161, 51), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "userfaultfd": (323, 282), "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264), "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "move_mount": (429, 429), "open_tree": (428, 428), "mount_setattr": (442, 442),
    "pidfd_open": (434, 434), "pidfd_getfd": (438, 438), "pidfd_send_signal": (424, 424),
    "kcmp": (312, 272), "process_madvise": (440, 440), "shmget": (29, 194), "shmat": (30, 196),
    "shmctl": (31, 195), "msgget": (68, 186), "semget": (64, 190), "acct": (163, 89), "swapon": (167, 224),
    "swapoff": (168, 225), "reboot": (169, 142), "quotactl": (179, 60), "lookup_dcookie": (212, 18),
    "vhangup": (153, 58), "personality": (135, 92), "syslog": (103, 116), "mknodat": (259, 33),
    "setsid": (112, 157), "setpgid": (109, 154), "mq_open": (240, 180), "io_setup": (206, 0),
    "modify_ldt": (154, None), "uselib": (134, None), "iopl": (172, None), "ioperm": (173, None), "mknod": (133, None),
    # handled by the rules below, not killed outright
    "socket": (41, 198), "socketpair": (53, 199), "clone3": (435, 435), "clone": (56, 220), "kill": (62, 129),
    "tkill": (200, 130), "tgkill": (234, 131), "rt_sigqueueinfo": (129, 138), "rt_tgsigqueueinfo": (297, 240),
    "prlimit64": (302, 261), "ioctl": (16, 29), "mkdir": (83, None), "mkdirat": (258, 34),
    "sync": (162, 81), "syncfs": (306, 267), "inotify_init": (253, None), "inotify_init1": (294, 26),
    "fanotify_init": (300, 262), "fcntl": (72, 25), "setpriority": (141, 140), "ioprio_set": (251, 30),
    "sched_setparam": (142, 118), "sched_setscheduler": (144, 119), "sched_setaffinity": (203, 122),
    "sched_setattr": (314, 274), "migrate_pages": (256, 238), "move_pages": (279, 239),
}
_ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # AUDIT_ARCH_*
_RULES = frozenset({"socket", "socketpair", "clone3", "clone", "kill", "tkill", "tgkill", "rt_sigqueueinfo",
                    "rt_tgsigqueueinfo", "prlimit64", "ioctl", "mkdir", "mkdirat", "sync", "syncfs", "inotify_init",
                    "inotify_init1", "fanotify_init", "fcntl", "setpriority", "ioprio_set", "sched_setparam",
                    "sched_setscheduler", "sched_setaffinity", "sched_setattr", "migrate_pages", "move_pages"})
DENIED = tuple(sorted(set(_NUMBERS) - _RULES))
"""The calls that kill the process outright (the rules above cover the others)."""
CLONE_NAMESPACES = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
TERMINAL_IOCTLS = (0x5412, 0x541C)  # TIOCSTI, TIOCLINUX
OWNER_IOCTLS = (0x8901, 0x8902)  # FIOSETOWN, SIOCSPGRP: F_SETOWN by ioctl
F_SETPIPE_SZ = 1031
OWNER_FCNTLS = (8, 10, 15)  # F_SETOWN, F_SETSIG, F_SETOWN_EX


def filter_spec(machine: str | None = None) -> dict | None:
    """The filter for ``machine`` (default: this one's architecture), as the job carries it; None
    where the architecture is unknown."""
    arch = _ARCHES.get(machine or os.uname().machine)
    if arch is None:
        return None
    column, audit_arch = arch

    def number(name):
        return _NUMBERS[name][column]

    return {"arch": audit_arch, "x32": column == 0, "keyctl": number("keyctl"),  # also to join a fresh keyring
            "kill": [number(n) for n in DENIED if number(n) is not None],
            "self": [[number(n), 0] for n in ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")],
            "self_or_zero": [[number(n), 0] for n in ("prlimit64", "sched_setaffinity", "sched_setscheduler",
                                                      "sched_setparam", "sched_setattr", "migrate_pages",
                                                      "move_pages")],
            # setpriority(PRIO_PROCESS, ...), ioprio_set(IOPRIO_WHO_PROCESS, ...): [number, which]
            "own_process": [[number("setpriority"), 0], [number("ioprio_set"), 1]],
            "clone": number("clone"), "clone_mask": CLONE_NAMESPACES,
            "ioctl": number("ioctl"), "ioctl_denied": list(TERMINAL_IOCTLS + OWNER_IOCTLS),
            "errno": [[number("socket"), 13], [number("socketpair"), 13], [number("clone3"), 38],  # EACCES, ENOSYS
                      [number("sync"), 0], [number("syncfs"), 0],  # done at once: nothing of a run outlives it
                      *[[number(n), 13] for n in ("inotify_init", "inotify_init1", "fanotify_init")
                        if number(n) is not None]],
            "fcntl": number("fcntl"), "fcntl_denied": [F_SETPIPE_SZ, *OWNER_FCNTLS],  # EPERM
            "weak_errno": [[number(n), 13] for n in ("mkdir", "mkdirat") if number(n) is not None]}


def _child_seccomp_program(spec: dict, pid: int) -> list[tuple[int, int, int, int]]:
    """The classic-BPF program for ``spec`` (``filter_spec``): ``(code, jt, jf, k)`` instructions.
    Each rule tests the call number and ends in its own returns, so jumps stay short."""
    kill, allow = 0x80000000, 0x7FFF0000  # SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ALLOW
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ/JGE/JSET|K, BPF_RET|K

    def arg(i):
        return 16 + 8 * i  # the low 32 bits of seccomp_data.args[i] (little-endian)

    code = [(ld, 0, 0, 4), (jeq, 1, 0, spec["arch"]), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if spec["x32"]:
        code += [(jge, 0, 1, 0x40000000), (ret, 0, 0, kill)]
    for number in spec["kill"]:
        code += [(jeq, 0, 1, number), (ret, 0, 0, kill)]
    for number, error in spec["errno"]:
        code += [(jeq, 0, 1, number), (ret, 0, 0, 0x00050000 | error)]  # SECCOMP_RET_ERRNO
    for number, index in spec["self"]:  # the block ends in a return: nr need not be reloaded
        code += [(jeq, 0, 4, number), (ld, 0, 0, arg(index)), (jeq, 0, 1, pid), (ret, 0, 0, allow), (ret, 0, 0, kill)]
    for number, index in spec["self_or_zero"]:
        code += [(jeq, 0, 5, number), (ld, 0, 0, arg(index)), (jeq, 2, 0, 0), (jeq, 1, 0, pid), (ret, 0, 0, kill),
                 (ret, 0, 0, allow)]
    for number, which in spec["own_process"]:  # arg 0 must be ``which``, arg 1 zero or the pid
        code += [(jeq, 0, 7, number), (ld, 0, 0, arg(0)), (jeq, 0, 3, which), (ld, 0, 0, arg(1)), (jeq, 2, 0, 0),
                 (jeq, 1, 0, pid), (ret, 0, 0, kill), (ret, 0, 0, allow)]
    code += [(jeq, 0, 4, spec["clone"]), (ld, 0, 0, arg(0)), (jset, 0, 1, spec["clone_mask"]), (ret, 0, 0, kill),
             (ret, 0, 0, allow)]
    denied = spec["fcntl_denied"]  # a match jumps to the EPERM after the allow; the block ends in returns
    code += [(jeq, 0, len(denied) + 3, spec["fcntl"]), (ld, 0, 0, arg(1))]
    code += [(jeq, len(denied) - i, 0, cmd) for i, cmd in enumerate(denied)]
    code += [(ret, 0, 0, allow), (ret, 0, 0, 0x00050000 | 1)]
    denied = spec["ioctl_denied"]  # a match jumps to the kill after the allow
    code += [(jeq, 0, len(denied) + 3, spec["ioctl"]), (ld, 0, 0, arg(1))]
    code += [(jeq, len(denied) - i, 0, cmd) for i, cmd in enumerate(denied)]
    code += [(ret, 0, 0, allow), (ret, 0, 0, kill)]
    code += [(ret, 0, 0, allow)]  # every other call
    return code


def _child_seccomp(libc, spec: dict, pid: int) -> bool:
    """Install the filter for ``spec`` on this process (and its future children); True if it took.
    Needs no-new-privileges first."""
    import ctypes

    code = _child_seccomp_program(spec, pid)

    class Instruction(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Instruction))]

    instructions = (Instruction * len(code))(*[Instruction(*i) for i in code])
    program = Program(len(code), instructions)
    zero = ctypes.c_ulong(0)
    # prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program)
    return libc.prctl(22, ctypes.c_ulong(2), ctypes.byref(program), zero, zero) == 0
