"""A sandbox run cannot read what a concurrent run of the same trainer prints (a sibling sample's answer).

Where every layer that separates runs is missing (a plain user's weak mode, no Landlock: all runs share the
trainer's uid and the host's pid namespace), a run's launcher is dumpable until it has imported ``PRELOAD``. An
attacking run opened ``/proc/<pid>/fd/1`` of the other runs' launchers then, and read what they printed later
(the expected output, printed by a correct sibling) or wrote over it; and, where ptrace is not restricted (no
Yama, or ptrace_scope 0), it opened their ``/proc/<pid>/mem`` then and read their program out of it later (a
solution to run as its own). The output files now come with mode 0 (the sandboxed process, never dumpable,
makes them 0200) and the pipes of the job and the results with mode 0, so that no process opens them again, and
the launcher no longer reads the program (the sandboxed process does). The driver runs as user ``nobody`` (as
``sandbox_attacks`` does)."""

import json
import os
import subprocess
import sys

import pytest

from sandbox_attacks import NOBODY, REPO, SYSTEM_PYTHON
from sandbox_hack_programs import SECRET

DRIVER = r'''
import dataclasses, json, os, sys, threading, time, types
spec = json.load(sys.stdin)
for name, path in (("verl", "verl"), ("verl.rewards", "verl/rewards")):
    module = types.ModuleType(name)  # the packages' __init__ files import torch: skip them
    module.__path__ = [os.path.join(spec["repo"], path)]
    sys.modules[name] = module
from verl.rewards import sandbox
sandbox._NAMESPACES = False  # as on a system that refuses user namespaces
sandbox._LANDLOCK = False    # and a kernel without Landlock
ATTACKER = r"""
import os, re, time
mine = {os.getpid(), os.getppid()}
held, memories, seen = [], [], set()
deadline = time.monotonic() + 2.0
while time.monotonic() < deadline and len(seen) < 3:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in mine or pid in seen:
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if b"<verl-sandbox>" not in f.read():
                    continue
            links = {fd: os.readlink("/proc/%s/fd/%s" % (pid, fd)) for fd in os.listdir("/proc/%s/fd" % pid)}
        except OSError:
            continue
        seen.add(pid)
        try:  # its memory (where ptrace is not restricted: no Yama, or ptrace_scope 0), read after the window
            memories.append((open("/proc/%s/maps" % pid), os.open("/proc/%s/mem" % pid, os.O_RDONLY)))
        except OSError:
            pass
        for fd, link in links.items():  # its output (its input is no secret), its job's and its results' pipes
            if link.startswith(("/memfd:verl-stdout", "/memfd:verl-stderr", "pipe:")):
                for flags in (os.O_RDONLY, os.O_WRONLY):  # to read it, or to write over it
                    try:
                        held.append((fd, os.open("/proc/%s/fd/%s" % (pid, fd), flags | os.O_NONBLOCK)))
                    except OSError:
                        pass
time.sleep(0.8)  # until the siblings have printed
found = set()
for name, fd in held:
    try:
        found.add(os.pread(fd, 4096, 0) if name == "1" else b"")
    except OSError:  # opened to write
        pass
found.discard(b"")
for maps, mem in memories:  # the siblings' program text holds the answer too
    try:
        lines = maps.read().splitlines()
    except OSError:  # ended already
        continue
    for line in lines:
        low, high = (int(x, 16) for x in line.split()[0].split("-"))
        if line.split()[1].startswith("rw") and high - low <= 64 << 20:
            try:
                memory = os.pread(mem, high - low, low)
                found.update(m + b"\n" for m in re.findall(rb"verl-hidden-[0-9a-f]{32}", memory))
            except OSError:
                pass
print("opened", len(held), found.pop().decode() if found else "nothing", end="")
"""
VICTIM = ("import time\ntime.sleep(0.4)\nwith open('/dev/stdout', 'a') as out:\n    out.write(%r)\ntime.sleep(1.5)\n"
          % (spec["secret"] + "\n"))  # alive while the attacker reads
limits = sandbox.SandboxLimits(wall_seconds=4, cpu_seconds=4, memory_bytes=256 * 2**20)
results = {}
def run(name, code):  # the attacker without the audit hook, as native code (the hook refuses the writing open)
    results[name] = sandbox.run_python(code, limits=dataclasses.replace(limits, audit_hook=name != "attacker"))
threads = [threading.Thread(target=run, args=("attacker", ATTACKER))]
threads[0].start()
time.sleep(0.3)  # the attacker is watching when the siblings start
for i in range(3):
    threads.append(threading.Thread(target=run, args=("sibling%d" % i, VICTIM)))
    threads[-1].start()
    time.sleep(0.05)
for thread in threads:
    thread.join()
json.dump({name: {"status": r.status, "stdout": r.stdout, "stderr": r.stderr[-2000:], "layers": r.layers}
           for name, r in results.items()}, sys.stdout)
'''


@pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux only")
def test_a_run_cannot_read_or_overwrite_a_concurrent_sibling_runs_output_or_program_without_namespaces_or_landlock(
        tmp_path):
    if os.geteuid() != 0:
        pytest.skip("this test switches users: run it as root (as CI does)")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is missing: no world-executable interpreter to run the sandbox as nobody")
    os.chmod(tmp_path, 0o777)
    done = subprocess.run([SYSTEM_PYTHON, "-I", "-c", DRIVER], input=json.dumps({"repo": str(REPO), "secret": SECRET}),
                          capture_output=True, text=True, user=NOBODY, group=NOBODY, extra_groups=[], cwd=tmp_path,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    for i in range(3):  # the siblings printed the answer (reopening /dev/stdout for writing still works)
        assert report[f"sibling{i}"]["status"] == "ok" and report[f"sibling{i}"]["stdout"] == SECRET + "\n", report
    attacker = report["attacker"]
    assert not attacker["layers"]["pid_namespace"] and not attacker["layers"]["landlock"], attacker
    assert attacker["status"] == "ok" and attacker["stdout"] == "opened 0 nothing", attacker["stderr"]


HELPER_DRIVER = r'''
import json, os, sys, threading, time, types
spec = json.load(sys.stdin)
for name, path in (("verl", "verl"), ("verl.rewards", "verl/rewards"),
                   ("verl.rewards.scorers", "verl/rewards/scorers")):
    module = types.ModuleType(name)  # the packages' __init__ files import torch: skip them
    module.__path__ = [os.path.join(spec["repo"], path)]
    sys.modules[name] = module
from verl.rewards import sandbox
from verl.rewards.scorers import code as scorer
sandbox._NAMESPACES, sandbox._LANDLOCK = False, False
os.environ["VERL_TEST_SECRET"] = spec["secret"]  # the trainer's environment: tokens, keys ...
ATTACKER = r"""
import os, time
mine, found = {os.getpid(), os.getppid()}, set()
deadline = time.monotonic() + 2.5
while time.monotonic() < deadline and not found:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in mine:
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if b"program_bindings" not in f.read():  # the helper that parses a long program
                    continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                found.update(f.read().split(b"\0"))
            with open("/proc/%s/fd/0" % pid, "rb") as f:  # the other sample's program
                found.add(f.read())
        except OSError:
            pass
print("FOUND" if any(b"verl-hidden-" in item for item in found) else "nothing", end="")
"""
attack = {}
thread = threading.Thread(target=lambda: attack.update(result=sandbox.run_python(ATTACKER, limits=sandbox.SandboxLimits(
    wall_seconds=4, cpu_seconds=4, memory_bytes=256 * 2**20))))
thread.start()
time.sleep(0.4)
long_program = "def rev(s):\n    return s[::-1]  # %s\n" % spec["secret"] + "# a long program\n" * 1000
scores = [scorer.compute_score("code", long_program + "#%d\n" % i, ["assert rev('ab') == 'ba'"],
                               {"sandbox": {"wall_seconds": 3}})["score"] for i in range(6)]
thread.join()
json.dump({"scores": scores, "status": attack["result"].status, "stdout": attack["result"].stdout,
           "stderr": attack["result"].stderr[-2000:]}, sys.stdout)
'''


@pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux only")
def test_a_run_cannot_read_the_trainers_environment_or_a_long_program_from_the_parse_helper(tmp_path):
    """A program over 8 KiB is parsed by a helper process of the trainer's (sandbox_trusted): it had the
    trainer's environment and read the program from a pipe, dumpable all along."""
    if os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"this test switches users: run it as root (as CI does), with {SYSTEM_PYTHON}")
    os.chmod(tmp_path, 0o777)
    done = subprocess.run([SYSTEM_PYTHON, "-I", "-c", HELPER_DRIVER],
                          input=json.dumps({"repo": str(REPO), "secret": SECRET}), capture_output=True, text=True,
                          user=NOBODY, group=NOBODY, extra_groups=[], cwd=tmp_path, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["scores"] == [1.0] * 6, report  # parsed by the helper all the same
    assert report["status"] == "ok" and report["stdout"] == "nothing", report
