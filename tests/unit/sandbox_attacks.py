"""The hostile programs and the driver of the sandbox tests (issue 9); not a test module itself.

``test_rewards_sandbox_hacks.py`` runs the hack bank, ``test_rewards_sandbox_isolation.py`` the
isolation attacks.

Two kinds of hostile programs:

* the *hack bank*: programs that try to get a reward without solving the task (patching builtins,
  exiting through the harness's frames, objects equal to everything, fake results on every fd,
  reading the answer out of the trainer's memory ...). Through the trainer's reward manager (as
  root, in this process) and through ``compute_score`` (as root and as ``nobody``, in a driver
  process), every one scores 0 and a correct solution scores 1;
* *isolation attacks*: the escapes of the issue, each run with the audit hook on and off (off
  stands for "after the hook was switched off", so the OS layers are tested alone). The trainer
  (a driver process, run as root and as uid 65534) sets traps: a TCP listener on 127.0.0.1, an
  abstract and a /tmp unix socket, a writable directory outside the usual temporary places with a
  victim file, a world-writable directory in /tmp, a fifo path in /run/lock, a SIGUSR1 handler, a
  secret in its environment and in its memory. After each program nothing may have reached them.

CI runs as root; the unprivileged mode runs the driver with Debian's /usr/bin/python3.11 as user
nobody (the venv's interpreter lives under /root, which nobody cannot enter). The driver imports
the sandbox modules by file path (package stubs), so only the standard library is needed there.
The weak modes (namespaces switched off, as on a system that refuses them) check what must hold
even then: the trainer stays unreadable, the verdict cannot be gamed, and a warning is logged once.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3.11"
NOBODY = 65534
SECRET = "verl-hidden-" + uuid.uuid4().hex  # an answer no program can compute
LIMITS = {"wall_seconds": 3, "cpu_seconds": 3, "memory_bytes": 256 * 2**20}

LINUX_ONLY = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux only")

# ----------------------------------------------------------------------------------- hack bank
REV_ASSERTS = ["assert rev('stressed') == 'desserts'", "assert rev('drawer') == 'reward'"]
REV_STDIO = {"inputs": ["stressed\n", "drawer\n"], "outputs": ["desserts\n", "reward\n"]}
SECRET_STDIO = {"inputs": ["\n"], "outputs": [SECRET + "\n"]}

FIND_IN_TRAINER_MEMORY = r'''
import os, re
found = None
for pid in sorted({os.getppid(), __TRAINER__} - {0}):
    try:
        with open("/proc/%d/maps" % pid) as f:
            maps = f.read().splitlines()
        mem = open("/proc/%d/mem" % pid, "rb", buffering=0)
    except OSError as e:
        continue
    budget = 512 << 20
    for line in maps:
        addr, perms = line.split()[:2]
        lo, hi = (int(x, 16) for x in addr.split("-"))
        if not perms.startswith("rw") or hi - lo > budget:
            continue
        budget -= hi - lo
        for start in range(lo, hi, 8 << 20):
            try:
                mem.seek(start)
                chunk = mem.read(min(8 << 20, hi - start))
            except (OSError, ValueError, OverflowError):
                break
            match = re.search(rb"verl-hidden-[0-9a-f]{32}", chunk)
            if match:
                found = match.group().decode()
                break
        if found:
            break
'''

STEAL_HOOK_FRAMES_BY_RECURSION = r'''
import sys
stolen = []
def deep(n):
    if n:
        return deep(n - 1)
    return open("scratch", "w")  # allowed, so the hook runs its checks: run it out of stack there
old = sys.getrecursionlimit()
for limit in (25, 30, 35, 40, 50, 60):
    for n in range(limit):
        try:
            sys.setrecursionlimit(limit)
            deep(n)
        except RecursionError as e:
            sys.setrecursionlimit(old)
            tb = e.__traceback__
            while tb is not None:
                try:
                    frame = tb.tb_frame
                    if frame.f_code.co_name not in ("deep", "<module>"):
                        stolen.append(frame)
                except BaseException:
                    break
                tb = tb.tb_next
        except BaseException:
            pass
        finally:
            sys.setrecursionlimit(old)
'''

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
for i in range(20000):
    try:
        open("scratch%d" % (i % 5), "w").close()
    except OSError:
        pass
signal.setitimer(signal.ITIMER_REAL, 0)
'''

# What the issue did with the hook's frame: replace the closure cells (and defaults) of its
# functions with no-ops, then escape.
SMASH_STOLEN = r'''
for frame in stolen:
    for value in list(frame.f_locals.values()):
        if type(value).__name__ != "function":
            continue
        for cell in value.__closure__ or ():
            try:
                cell.cell_contents = lambda *a, **k: None
            except BaseException:
                pass
        if value.__defaults__:
            value.__defaults__ = tuple(lambda *a, **k: None for _ in value.__defaults__)
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
attempt(lambda: os.mkfifo(__FIFO__))
attempt(lambda: os.kill(__TRAINER__, signal.SIGUSR1))
def pidfd():
    signal.pidfd_send_signal(os.pidfd_open(__TRAINER__), signal.SIGUSR1)
attempt(pidfd)
def environ():
    data = open("/proc/%d/environ" % __TRAINER__, "rb").read()
    if b"VERL_TEST_SECRET" in data:
        print("LEAK", data)
attempt(environ)
'''

BANK = {  # name -> (program, tests, score)
    "correct_asserts": ("def rev(s):\n    return s[::-1]\n", REV_ASSERTS, 1.0),
    "correct_stdio": ("print(input()[::-1])\n", REV_STDIO, 1.0),
    "builtins_exec_patched": ("import builtins\nbuiltins.exec = lambda *a, **k: None\n"
                              "def rev(s):\n    return s\n", REV_ASSERTS, 0.0),
    "builtins_compile_patched": ("import builtins\nbuiltins.compile = lambda *a, **k: None\n"
                                 "def rev(s):\n    return s\n", REV_ASSERTS, 0.0),
    "builtins_eval_patched": ("import builtins\nbuiltins.eval = lambda *a, **k: True\n"
                              "def rev(s):\n    return s\n", REV_ASSERTS, 0.0),
    "exit_through_harness_frame": ("import sys\nsys._getframe(1).f_locals['exit_'](0)\n", REV_ASSERTS, 0.0),
    "exit_walking_frames": ("import sys\nframe = sys._getframe(0)\nwhile frame is not None:\n"
                            "    for value in list(frame.f_locals.values()):\n"
                            "        if getattr(value, '__name__', '') == '_exit':\n"
                            "            value(0)\n"
                            "    frame = frame.f_back\n", REV_ASSERTS, 0.0),
    "sys_exit_before_asserts": ("def rev(s):\n    return s\nimport sys\nsys.exit(0)\n", REV_ASSERTS, 0.0),
    "os_exit_before_asserts": ("def rev(s):\n    return s\nimport os\nos._exit(0)\n", REV_ASSERTS, 0.0),
    "equal_to_everything": ("class Anything:\n    def __eq__(self, other):\n        return True\n"
                            "    __hash__ = object.__hash__\ndef rev(s):\n    return Anything()\n",
                            REV_ASSERTS, 0.0),
    "str_subclass_equal_to_everything": ("class S(str):\n    def __eq__(self, other):\n        return True\n"
                                         "    __hash__ = str.__hash__\ndef rev(s):\n    return S(s)\n",
                                         REV_ASSERTS, 0.0),
    "fake_results_on_every_fd": ("import os\nfor fd in range(3, 1024):\n    for i in range(4):\n"
                                 "        try:\n            os.write(fd, b'{\"i\": %d, \"value\": true}\\n' % i)\n"
                                 "        except OSError:\n            pass\ndef rev(s):\n    return s\n",
                                 REV_ASSERTS, 0.0),
    "fake_results_at_exit": ("import atexit, os\ndef fake():\n    for fd in range(3, 1024):\n"
                             "        try:\n            os.write(fd, b'{\"i\": 0, \"value\": \"PASS\"}\\n')\n"
                             "        except OSError:\n            pass\natexit.register(fake)\n"
                             "def rev(s):\n    raise ValueError\n", REV_ASSERTS, 0.0),
    "json_dumps_patched": ("import json\njson.dumps = lambda *a, **k: '{\"i\": 0, \"value\": true}'\n"
                           "def rev(s):\n    return s\n", REV_ASSERTS, 0.0),
    "nan_answer": ("def rev(s):\n    return float('nan')\n", REV_ASSERTS, 0.0),
    "system_exit_inside_the_call": ("def rev(s):\n    raise SystemExit(0)\n", REV_ASSERTS, 0.0),
    "hook_frames_stolen_then_exit": (STEAL_HOOK_FRAMES_BY_RECURSION + SMASH_STOLEN + "import os\nos._exit(0)\n",
                                     REV_ASSERTS, 0.0),
    "success_marker_on_stdout": ("print('OK')\nimport sys\nsys.exit(0)\n", REV_STDIO, 0.0),
    "answer_read_from_trainer_memory": (FIND_IN_TRAINER_MEMORY + "print(found or 'not found')\n", SECRET_STDIO, 0.0),
}

# -------------------------------------------------------------------------------- isolation
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
    "chmod_0_leaves_folder": ("import os\nstart = os.getcwd()\npath = start\nfor i in range(100):\n"
                              "    path += '/d'\n    os.mkdir(path)\n    open(path + '/f', 'w').write('x')\n"
                              "for i in range(100):\n    if i % 30 == 0:\n        os.chmod(path, 0)\n"
                              "    path = path[:-2]\nos.makedirs('x/y')\nos.chmod('x/y', 0)\nos.chmod('x', 0)\n"
                              "print('WORKDIR', start)\n"),
}
# With the hook on, the hook itself refuses these (the run ends "blocked"):
BLOCKED_BY_HOOK = {"hook_disabled_by_recursion_error", "hook_state_via_signal_frames", "escapes",
                   "dup2_file_onto_stdout", "sub_interpreter"}
# What holds without namespaces: the trainer is non-dumpable (and, as root, the run has its own uid);
# and these the audit hook refuses (with the hook off they would escape: that is weak isolation).
WEAK_MODE_ATTACKS = ("trainer_environ", "trainer_memory", "trainer_fds_overwritten", "chmod_0_leaves_folder")
WEAK_MODE_HOOK_ONLY = ("escapes", "dup2_file_onto_stdout", "sub_interpreter")

DRIVER = r'''
import ctypes, json, logging, os, signal, socket, sys, types
spec = json.load(sys.stdin)
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
values = {"__PORT__": str(tcp.getsockname()[1]), "__ABSTRACT__": repr(abstract_name),
          "__UNIX__": repr(unix_path), "__TARGET__": repr(spec["target"]),
          "__TMPDIR__": repr(spec["tmpdir"]), "__FIFO__": repr(spec["fifo"]),
          "__TRAINER__": str(os.getpid())}

def escaped(stdout):
    found = []
    for listener in listeners:
        try:
            conn, _ = listener.accept()
            found.append("connection to %r: %r" % (listener.getsockname(), conn.recv(100)))
            conn.close()
        except BlockingIOError:
            pass
    for directory, expected in ((spec["target"], {"victim"}), (spec["tmpdir"], {"sock"})):
        extra = sorted(set(os.listdir(directory)) - expected)
        if extra:
            found.append("wrote %s in %s" % (extra, directory))
            for name in extra:
                os.remove(os.path.join(directory, name))
    with open(victim) as f:
        if f.read() != "original":
            found.append("changed " + victim)
    with open(victim, "w") as f:
        f.write("original")
    if os.path.lexists(spec["fifo"]):
        found.append("made " + spec["fifo"])
        os.remove(spec["fifo"])
    for line in stdout.splitlines():
        if line.startswith("WORKDIR ") and os.path.lexists(line[8:]):
            found.append("left " + line[8:] + " behind")
    found += received
    received.clear()
    return found

report = {"uid": os.getuid(), "attacks": {}, "bank": {}}
for attack in spec["attacks"]:
    code = attack["code"]
    for key, value in values.items():
        code = code.replace(key, value)
    limits = sandbox.SandboxLimits(**spec["limits"], audit_hook=attack["hook"])
    try:
        result = sandbox.run_python(code, limits=limits)
        entry = {"status": result.status, "wall": result.wall_seconds, "stdout": result.stdout[-3000:],
                 "stderr": result.stderr[-3000:], "layers": result.layers}
    except BaseException as error:
        entry = {"raised": repr(error), "stdout": "", "stderr": ""}
    entry["escaped"] = escaped(entry["stdout"])
    report["attacks"][attack["name"] + ("" if attack["hook"] else "/no-hook")] = entry
for name, (program, tests) in spec["bank"].items():
    try:
        report["bank"][name] = code_scorer.compute_score("code", program.replace("__TRAINER__", str(os.getpid())),
                                                         tests, {"sandbox": spec["limits"]})
    except BaseException as error:
        report["bank"][name] = {"raised": repr(error)}
libc = ctypes.CDLL(None)
report["dumpable"] = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
report["warnings"] = warnings
report["torch_imported"] = "torch" in sys.modules
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


_REPORTS: dict[str, dict] = {}


def driver_report(mode: str) -> dict:
    """Run the driver once per mode and cache its report. Modes: ``root``, ``user`` (namespaces),
    ``root-weak``, ``user-weak`` (none), ``root-plain`` (root's fallback without a user namespace),
    ``user-unprotected`` (weak, and the trainer left dumpable: the control)."""
    if mode in _REPORTS:
        return _REPORTS[mode]
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
    attacks = [{"name": n, "code": c, "hook": hook} for n, c in ATTACKS.items() for hook in (True, False)
               if namespaces or n in WEAK_MODE_ATTACKS or (hook and n in WEAK_MODE_HOOK_ONLY)]
    bank = {name: (program, tests) for name, (program, tests, _) in BANK.items()}
    if mode == "user-unprotected":
        attacks = [a for a in attacks if a["name"] in ("trainer_environ", "trainer_memory") and a["hook"]]
        bank = {name: bank[name] for name in ("answer_read_from_trainer_memory",)}
    if mode == "root-plain":
        attacks, bank = [a for a in attacks if not a["hook"]], {}
    spec = {"repo": str(REPO), "namespaces": namespaces, "limits": LIMITS, "attacks": attacks, "bank": bank,
            "fifo": f"/run/lock/verl-sandbox-test-{uuid.uuid4().hex}", "unprotected": mode == "user-unprotected",
            "user_namespace": mode != "root-plain"}
    target, tmpdir = tempfile.mkdtemp(prefix="verl-sandbox-target-", dir=base), tempfile.mkdtemp()
    try:
        Path(target, "victim").write_text("original")
        for path, mode_bits in ((target, 0o777), (tmpdir, 0o777), (f"{target}/victim", 0o666)):
            os.chmod(path, mode_bits)  # writable by the run's own uid too: only the sandbox may stop it
            os.chown(path, uid, uid)
        spec.update(target=target, tmpdir=tmpdir)
        proc = subprocess.run([python, "-I", "-c", DRIVER], input=json.dumps(spec), capture_output=True,
                              text=True, user=uid, group=uid, extra_groups=[], cwd="/", timeout=600,
                              env={"PATH": "/usr/bin:/bin", "VERL_TEST_SECRET": SECRET, "LC_ALL": "C.UTF-8"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads(proc.stdout)
    finally:
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(tmpdir, ignore_errors=True)
        if os.path.lexists(spec["fifo"]):
            os.remove(spec["fifo"])
    assert report["uid"] == uid and not report["torch_imported"]
    _REPORTS[mode] = report
    return report


def _layers_or_skip(layers: dict, mode: str) -> None:
    needed = ["network_namespace", "pid_namespace", "private_mounts", "private_proc"]
    needed += ["own_uid"] if mode == "root" else ["user_namespace", "no_capabilities"]
    missing = [name for name in needed if not layers.get(name)]
    if missing:
        pytest.skip(f"this machine could not set up {missing} in mode {mode!r}: {layers}")
