"""The driver of the sandbox tests (issues 9 and 22); not a test module itself. The hostile programs
are in ``sandbox_hack_programs.py`` (reward hacks) and ``sandbox_escape_programs.py`` (escapes).

``test_rewards_sandbox_hacks.py`` runs the hack bank, ``test_rewards_sandbox_isolation.py`` the
isolation attacks.

Two kinds of hostile programs:

* the *hack bank*: programs that try to get a reward without solving the task (patching builtins,
  answering the expected side of an assert, exiting through the harness's frames, objects equal to
  everything, fake results on every fd, results that are costly to decode, reading the answer out
  of the trainer's memory, shared memory, terminal or keyring ...). As root and as ``nobody`` the
  driver scores them through the trainer's RuleRewardManager, with the audit hook on and off; in
  the weak modes through ``compute_score``. Every one scores 0 and the correct solutions 1;
* *isolation attacks*: the escapes of the issues, each run with the audit hook on and off (off
  stands for "after the hook was switched off", so the OS layers are tested alone), and those below
  the hook with the system-call filter off too. The trainer (a driver process, run as root and as
  uid 65534) sets traps: a TCP listener on 127.0.0.1, an abstract and a /tmp unix socket, a writable
  directory outside the usual temporary places with a victim file, a world-writable directory in
  /tmp, a fifo path in /run/lock, a SIGUSR1 handler, a secret in its environment, its memory, a
  /dev/shm file, its session keyring and typed at its terminal (a pty). After each program nothing
  may have reached them.

CI runs as root; the unprivileged mode runs the driver with Debian's /usr/bin/python3.11 as user
nobody (the venv's interpreter lives under /root, which nobody cannot enter), importing torch from
the test environment's site-packages (same Python minor version). The other drivers import the
sandbox modules by file path (package stubs), so only the standard library is needed there. All
drivers start at once, at the first report asked for. The weak modes (namespaces switched off, as
on a system that refuses them) check what must hold even then: the trainer stays unreadable, the
verdict cannot be gamed, the filter kills native code's escapes, and a warning is logged once.
"""

import base64
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from sandbox_escape_programs import (  # noqa: F401 (re-exported to the tests)
    ATTACKS, BLOCKED_BY_HOOK, BLOCKED_BY_SECCOMP, DEVICES, EVIL_C, LANDLOCK_ATTACKS, NAMESPACED_HOOK_ONLY, NATIVE,
    NO_SECCOMP_ATTACKS, SYSCALLS_KILLED, WEAK_MODE_ATTACKS, WEAK_MODE_HOOK_ONLY)
from sandbox_hack_programs import BANK, BANK_NO_HOOK, SECRET  # noqa: F401
from verl.rewards.sandbox_seccomp import _ARCHES, _NUMBERS

_COLUMN = _ARCHES.get(os.uname().machine, (0,))[0]

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3.11"
NOBODY = 65534
LIMITS = {"wall_seconds": 3, "cpu_seconds": 3, "memory_bytes": 256 * 2**20}
# Attacks run under other limits: many_directories fills its tmpfs (nr_inodes = max_disk_bytes // 4096)
# one mkdir at a time through the audit hook; 1,024 of them stay well inside the 3 s on a loaded machine
# (8,192 at the default 32 MiB once timed out under 4x oversubscription).
ATTACK_LIMITS = {"many_directories": {"max_disk_bytes": 4 * 2**20}}

LINUX_ONLY = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux only")

DRIVER = r'''
import ctypes, fcntl, json, logging, os, select, signal, socket, struct, sys, termios, types
spec = json.load(sys.stdin)
if spec["manager"]:  # the whole package (torch from the test environment): score through the reward manager
    sys.path[:0] = [spec["repo"], spec["site_packages"]]
else:
    for name, path in (("verl", "verl"), ("verl.rewards", "verl/rewards"),
                       ("verl.rewards.scorers", "verl/rewards/scorers")):
        module = types.ModuleType(name)  # the packages' __init__ files import torch: skip them
        module.__path__ = [os.path.join(spec["repo"], path)]
        sys.modules[name] = module
from verl.rewards import sandbox
from verl.rewards.scorers import code as code_scorer
sandbox._NAMESPACES = spec["namespaces"]
sandbox._USER_NAMESPACE = spec["user_namespace"]
if spec.get("unprotected"):  # the control: what the attacks get from a trainer left readable
    sandbox.PROTECT_TRAINER = False
    sandbox._LANDLOCK = False  # which would also keep the run off the trainer's /proc entries
warnings = []
class Catch(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
logging.getLogger("verl").addHandler(Catch())
logging.getLogger("verl").propagate = False

received = []
signal.signal(signal.SIGUSR1, lambda *a: received.append("the trainer got SIGUSR1"))
tcp = socket.socket()
tcp.bind(("127.0.0.1", 0))
abstract_name = "verl-sandbox-test-" + os.urandom(8).hex()
abstract = socket.socket(socket.AF_UNIX)
abstract.bind("\0" + abstract_name)
unix_path = os.path.join(spec["tmpdir"], "sock")
unix = socket.socket(socket.AF_UNIX)
unix.bind(unix_path)
os.chmod(unix_path, 0o777)
listeners = (tcp, abstract, unix)
for listener in listeners:
    listener.listen()
    listener.setblocking(False)
victim = os.path.join(spec["target"], "victim")
# The trainer's shared memory, terminal and session keyring, each holding the secret.
shm = "/dev/shm/verl-sandbox-test-" + os.urandom(8).hex()
with open(shm, "w") as f:
    f.write(spec["secret"])
os.chmod(shm, 0o644)
master, slave = os.openpty()
pts = os.ttyname(slave)
echo = termios.tcgetattr(slave)[3] & termios.ECHO
def type_secret():
    os.write(master, (spec["secret"] + "\n").encode())
    while select.select([master], [], [], 0.05)[0]:  # the terminal's echo of what was typed
        os.read(master, 1000)
type_secret()
assert struct.unpack("i", fcntl.ioctl(slave, termios.FIONREAD, b"\0" * 4))[0] == len(spec["secret"]) + 1
libc = ctypes.CDLL(None, use_errno=True)
keyctl = libc.syscall
keyctl(spec["nr"]["keyctl"], 1, b"verl-sandbox-test-" + os.urandom(8).hex().encode())  # join a fresh session keyring
secret = spec["secret"].encode()
session_key = libc.syscall(spec["nr"]["add_key"], b"user", b"verl-test-key", secret, len(secret), -3)
assert session_key > 0, ctypes.get_errno()
def key_intact():
    buf = ctypes.create_string_buffer(256)
    found = keyctl(spec["nr"]["keyctl"], 10, -3, b"user", b"verl-test-key", 0)
    return (found == session_key and keyctl(spec["nr"]["keyctl"], 11, session_key, buf, 256) == len(secret)
            and buf.raw[:len(secret)] == secret)
values = {"__PORT__": str(tcp.getsockname()[1]), "__ABSTRACT__": repr(abstract_name),
          "__UNIX__": repr(unix_path), "__TARGET__": repr(spec["target"]),
          "__TMPDIR__": repr(spec["tmpdir"]), "__FIFO__": repr(spec["fifo"]),
          "__SHM__": repr(shm), "__PTS__": repr(pts), "__DEVICES__": repr(tuple(spec["devices"])),
          "__EVIL__": repr(spec["evil"]), "__KEYCTL__": str(spec["nr"]["keyctl"]),
          **{"__NR_%s__" % name: str(number) for name, number in spec["nr"].items()},
          "__DATASET__": repr(os.path.join(spec["target"], "dataset.json")), "__TRAINER__": str(os.getpid())}

shm_before = set()

def scheduling():
    return os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0)), os.sched_getscheduler(0)
scheduled = scheduling()

def _owned(path):
    try:
        return os.stat(path).st_uid == os.getuid()
    except FileNotFoundError:
        return False

def _mapped_in_shm():
    """Inodes under /dev/shm that a live process maps (its semaphores; a semaphore's maps line names the
    temporary file glibc created it as, so inodes, not names): the program's are not, it has ended."""
    inodes = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/maps" % pid) as f:
                inodes.update(int(line.split()[4]) for line in f if "/dev/shm/" in line)
        except (OSError, IndexError, ValueError):
            pass
    return inodes

def _inode(path):
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None

def escaped(stdout):
    global scheduled
    found = []
    if scheduling() != scheduled:  # restored where it can be (a plain user cannot lower its nice value again)
        found.append("changed the trainer's scheduling: %r -> %r" % (scheduled, scheduling()))
        for restore in (lambda: os.sched_setaffinity(0, scheduled[1]),
                        lambda: os.sched_setscheduler(0, scheduled[2], os.sched_param(0))):
            try:
                restore()
            except OSError:
                pass
        scheduled = scheduling()
    for listener in listeners:
        try:
            conn, _ = listener.accept()
            found.append("connection to %r: %r" % (listener.getsockname(), conn.recv(100)))
            conn.close()
        except BlockingIOError:
            pass
    for directory, expected in ((spec["target"], {"victim", "dataset.json"}), (spec["tmpdir"], {"sock"})):
        extra = sorted(set(os.listdir(directory)) - expected)
        if extra:
            found.append("wrote %s in %s" % (extra, directory))
            for name in extra:
                os.remove(os.path.join(directory, name))
    with open(victim) as f:
        if f.read() != "original":
            found.append("changed " + victim)
    for path, bits in ((spec["target"], 0o777), (victim, 0o666)):
        if os.stat(path).st_mode & 0o7777 != bits:
            found.append("changed the mode of " + path)
            os.chmod(path, bits)
    with open(victim, "w") as f:
        f.write("original")
    if os.path.lexists(spec["fifo"]):
        found.append("made " + spec["fifo"])
        os.remove(spec["fifo"])
    for line in stdout.splitlines():
        if line.startswith("WORKDIR ") and os.path.lexists(line[8:]):
            found.append("left " + line[8:] + " behind")
        if line.startswith("PID "):  # the program's pid as it saw it (in a pid namespace, not this one's)
            try:
                with open("/proc/%s/stat" % line[4:]) as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                with open("/proc/%s/cmdline" % line[4:], "rb") as f:
                    sandboxed = b"<verl-sandbox>" in f.read()
            except (OSError, IndexError):
                continue
            if sandboxed and state not in "ZX":
                found.append("left process %s running (%s) after the run" % (line[4:], state))
                os.kill(int(line[4:]), signal.SIGKILL)
    found += received
    received.clear()
    with open(shm) as f:
        if f.read() != spec["secret"]:
            found.append("changed " + shm)
    # Only what appeared while the program ran, owned by the driver's uid and (a semaphore) mapped by no
    # live process: the host's /dev/shm is shared with every process of the machine (the test suite's
    # other worker spawns processes whose semaphores come and go there; the program has ended, so what it
    # made is mapped by nobody). Only the program's own file is removed, never a semaphore.
    made = sorted(set(os.listdir("/dev/shm")) - shm_before - {os.path.basename(shm)})
    made = [name for name in made if name.startswith(("verl-sandbox-made", "sem.")) and _owned("/dev/shm/" + name)]
    # A live process's semaphore is mapped by it. One that is gone by now was another process's: unlinked
    # since the listing, or by its resource tracker a moment after its process ended (multiprocessing's
    # spawned processes, of the other worker's tests, leave theirs to it): looked at again for 2 s.
    for _ in range(10):
        if not any(name.startswith("sem.") for name in made):
            break
        in_use = _mapped_in_shm()
        made = [name for name in made if not name.startswith("sem.")
                or _inode("/dev/shm/" + name) not in (None, *in_use)]
        if any(name.startswith("sem.") for name in made):
            time.sleep(0.2)
    if made:
        found.append("made %s in /dev/shm" % made)
        for name in made:
            if name.startswith("verl-sandbox-made"):
                os.remove("/dev/shm/" + name)
    if termios.tcgetattr(slave)[3] & termios.ECHO != echo:
        found.append("switched echo off on " + pts)
    try:
        if select.select([master], [], [], 0)[0]:
            found.append("wrote to %s: %r" % (pts, os.read(master, 1000)))
    except OSError:
        pass
    pending = struct.unpack("i", fcntl.ioctl(slave, termios.FIONREAD, b"\0" * 4))[0]
    if pending < len(spec["secret"]) + 1:
        found.append("read what was typed at " + pts)
        termios.tcflush(slave, termios.TCIFLUSH)
        type_secret()
    if not key_intact():
        found.append("the trainer's session key was read or removed")
    return found

report = {"uid": os.getuid(), "attacks": {}, "bank": {}}
for attack in spec["attacks"]:
    code = attack["code"]
    for key, value in values.items():
        code = code.replace(key, value)
    limits = sandbox.SandboxLimits(**{**spec["limits"], **attack.get("limits", {})}, audit_hook=attack["hook"],
                                   seccomp=attack["seccomp"])
    shm_before = set(os.listdir("/dev/shm"))
    try:
        result = sandbox.run_python(code, limits=limits)
        entry = {"status": result.status, "wall": result.wall_seconds, "stdout": result.stdout[-3000:],
                 "stderr": result.stderr[-3000:], "layers": result.layers}
    except BaseException as error:
        entry = {"raised": repr(error), "stdout": "", "stderr": ""}
    entry["escaped"] = escaped(entry["stdout"])
    suffix = "" if attack["hook"] else "/no-hook" if attack["seccomp"] else "/no-seccomp"
    report["attacks"][attack["name"] + suffix] = entry
def fill(program):
    for key, value in values.items():
        program = program.replace(key, value)
    return program
def score_through_the_reward_manager(bank, hook):
    """As the trainer scores a step: token ids in, RuleRewardManager, per-sample scores out."""
    import torch
    from verl.models.tiny import build_char_tokenizer
    from verl.protocol import Batch
    from verl.rewards import RuleRewardManager

    tok = build_char_tokenizer()
    names = list(bank)
    ids = [tok(fill(bank[n][0]), add_special_tokens=False)["input_ids"] for n in names]
    width = max(map(len, ids))
    batch = Batch({"responses": torch.tensor([row + [0] * (width - len(row)) for row in ids]),
                   "response_mask": torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])},
                  {"data_source": ["code"] * len(names), "ground_truth": [json.dumps(bank[n][1]) for n in names],
                   "extra_info": [{"sandbox": {**spec["limits"], "audit_hook": hook}}] * len(names)})
    scores, columns = RuleRewardManager(tok)(batch)
    return {name: {"score": score, "status": status}
            for name, score, status in zip(names, scores.sum(-1).tolist(), columns["status"])}
for hook in spec["bank_hooks"]:
    shm_before = set(os.listdir("/dev/shm"))
    try:
        if spec["manager"]:
            bank = {n: spec["bank"][n] for n in spec["bank"] if hook or n in spec["bank_no_hook"]}
            scored = score_through_the_reward_manager(bank, hook)
        else:
            scored = {name: code_scorer.compute_score("code", fill(program), tests, {"sandbox": spec["limits"]})
                      for name, (program, tests) in spec["bank"].items()}
    except BaseException as error:
        scored = {name: {"raised": repr(error)} for name in spec["bank"]}
    report["bank" if hook else "bank/no-hook"] = scored
    report["bank_escaped"] = report.get("bank_escaped", []) + escaped("")
libc = ctypes.CDLL(None)
report["dumpable"] = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
report["warnings"] = warnings
report["torch_imported"] = "torch" in sys.modules
os.remove(shm)
json.dump(report, sys.stdout)
'''


def _outside_directory_base() -> str | None:
    """A directory outside /tmp, /var/tmp, /dev/shm and /run that every user may traverse."""
    for base in ("/var/lib", "/var/cache", "/opt", "/srv", "/mnt", "/usr/local", "/home"):
        parts = Path(base).parts
        if os.path.isdir(base) and os.access(base, os.W_OK) and all(
                os.stat(os.path.join(*parts[:i + 1])).st_mode & 0o001 for i in range(len(parts))):
            return base
    return None


MODES = ("root", "user", "root-weak", "user-weak", "root-plain", "user-unprotected")
_REPORTS: dict = {}


def driver_report(mode: str) -> dict:
    """The driver's report for ``mode``. Modes: ``root``, ``user`` (namespaces), ``root-weak``,
    ``user-weak`` (none), ``root-plain`` (root's fallback without a user namespace),
    ``user-unprotected`` (weak, and the trainer left dumpable: the control). The first call starts
    the drivers of every mode at once (they mostly wait on their sandboxes) and caches the reports
    (or the reason a mode is skipped)."""
    if not _REPORTS:
        from concurrent.futures import ThreadPoolExecutor

        def run(name):
            try:
                return _run_driver(name)
            except BaseException as outcome:  # noqa: BLE001 (a skip or a failure, raised where it is read)
                return outcome

        evil_extension()  # once, before the threads need it
        with ThreadPoolExecutor(len(MODES)) as pool:
            _REPORTS.update(zip(MODES, pool.map(run, MODES)))
    report = _REPORTS[mode]
    if isinstance(report, BaseException):
        raise report
    return report


def _run_driver(mode: str) -> dict:
    if os.geteuid() != 0:
        pytest.skip("these tests switch users: run them as root (as CI does)")
    user, namespaces = mode.startswith("user"), mode in ("root", "user", "root-plain")
    python = SYSTEM_PYTHON if user else sys.executable
    if user and not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is missing: no world-executable interpreter to run the "
                    f"sandbox as an unprivileged user")
    base = _outside_directory_base()
    if base is None:
        pytest.skip("no writable, world-traversable directory outside the temporary places")
    uid = NOBODY if user else 0
    evil = evil_extension()
    attacks = [{"name": n, "code": c, "hook": hook, "seccomp": True} for n, c in ATTACKS.items() for hook in (True, False)
               if (namespaces or n in WEAK_MODE_ATTACKS or (hook and n in WEAK_MODE_HOOK_ONLY))
               and not (hook and n.startswith("syscall_"))  # with the hook, ctypes is refused: nothing to see
               and not (namespaces and not hook and n in NAMESPACED_HOOK_ONLY)]
    if namespaces:
        attacks += [{"name": n, "code": ATTACKS[n], "hook": False, "seccomp": False} for n in NO_SECCOMP_ATTACKS]
    for attack in attacks:
        attack["limits"] = ATTACK_LIMITS.get(attack["name"], {})
    if evil is None:  # no C compiler: the native-code attacks cannot be built here
        attacks = [a for a in attacks if a["name"] not in NATIVE]
    bank = {name: (program, tests) for name, (program, tests, _) in BANK.items()}
    bank_hooks = [True, False] if mode in ("root", "user") else [True]
    if mode == "user-unprotected":
        attacks = [a for a in attacks if a["name"] in ("trainer_environ", "trainer_memory") and a["hook"]]
        bank = {name: bank[name] for name in ("answer_read_from_trainer_memory",)}
    if mode == "root-plain":
        attacks, bank = [a for a in attacks if not a["hook"]], {}
    site_packages = sysconfig.get_paths()["purelib"]
    manager = mode in ("root", "user")
    if manager and user and not _readable_by_nobody(site_packages, REPO):
        pytest.skip(f"{site_packages} or {REPO} is not readable by user nobody: cannot import torch there")
    spec = {"repo": str(REPO), "namespaces": namespaces, "limits": LIMITS, "attacks": attacks, "bank": bank,
            "fifo": f"/run/lock/verl-sandbox-test-{uuid.uuid4().hex}", "unprotected": mode == "user-unprotected",
            "user_namespace": mode != "root-plain", "manager": manager, "site_packages": site_packages,
            "bank_hooks": bank_hooks, "bank_no_hook": BANK_NO_HOOK, "secret": SECRET, "devices": DEVICES, "evil": evil or "",
            "nr": {name: _NUMBERS[name][_COLUMN] for name in (*SYSCALLS_KILLED, "add_key")}}
    target, tmpdir = tempfile.mkdtemp(prefix="verl-sandbox-target-", dir=base), tempfile.mkdtemp()
    try:
        Path(target, "victim").write_text("original")
        # the training data, world-readable as data sets often are, expected outputs included
        Path(target, "dataset.json").write_text(json.dumps({"input": "\n", "output": SECRET + "\n"}))
        os.chmod(f"{target}/dataset.json", 0o644)
        for path, mode_bits in ((target, 0o777), (tmpdir, 0o777), (f"{target}/victim", 0o666)):
            os.chmod(path, mode_bits)  # writable by the run's own uid too: only the sandbox may stop it
            os.chown(path, uid, uid)
        spec.update(target=target, tmpdir=tmpdir)
        proc = subprocess.run([python, "-I", "-c", DRIVER], input=json.dumps(spec), capture_output=True,
                              text=True, user=uid, group=uid, extra_groups=[], cwd="/", timeout=600,
                              env={"PATH": "/usr/bin:/bin", "VERL_TEST_SECRET": SECRET, "LC_ALL": "C.UTF-8",
                                   "HOME": tmpdir, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads(proc.stdout)
    finally:
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(tmpdir, ignore_errors=True)
        if os.path.lexists(spec["fifo"]):
            os.remove(spec["fifo"])
    assert report["uid"] == uid and report["torch_imported"] == manager
    return report


_EVIL: list = []


def evil_extension() -> str | None:
    """The native-code extension (``EVIL_C``), compiled once, as base64; None without a C compiler."""
    if not _EVIL:
        compiler = shutil.which("cc") or shutil.which("gcc")
        built = None
        if compiler:
            with tempfile.TemporaryDirectory() as tmp:
                Path(tmp, "evil.c").write_text(EVIL_C)
                done = subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-I", sysconfig.get_paths()["include"],
                                       "-o", f"{tmp}/evil.so", f"{tmp}/evil.c"], capture_output=True, timeout=120)
                if done.returncode == 0:
                    built = base64.b64encode(Path(tmp, "evil.so").read_bytes()).decode()
        _EVIL.append(built)
    return _EVIL[0]


def _readable_by_nobody(*paths) -> bool:
    probe = "import os, sys; sys.exit(0 if all(os.access(p, os.R_OK | os.X_OK) for p in sys.argv[1:]) else 1)"
    return subprocess.run([SYSTEM_PYTHON, "-c", probe, *map(str, paths)], user=NOBODY, group=NOBODY,
                          extra_groups=[], cwd="/").returncode == 0


def _layers_or_skip(layers: dict, mode: str) -> None:
    needed = ["network_namespace", "pid_namespace", "private_mounts", "private_proc"]
    needed += ["own_uid"] if mode == "root" else ["user_namespace", "no_capabilities"]
    missing = [name for name in needed if not layers.get(name)]
    if missing:
        pytest.skip(f"this machine could not set up {missing} in mode {mode!r}: {layers}")
