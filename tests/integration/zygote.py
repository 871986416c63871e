"""``python -m <module> args`` for the tests, started by a fork of a process that has already imported
torch, transformers and verl: the run itself is the same, its start-up is not paid again.

A tiny ``main_ppo`` run costs about 6.5 CPU-seconds as a fresh interpreter and about 1.5 when forked
from a process past its imports (torch's and transformers' imports, their first-call set-up); the
suite launches such runs about a hundred times. :func:`run_module` returns what ``subprocess.run``
returns (a ``CompletedProcess`` with the exit code, stdout and stderr as text) and runs the module as
``python -m`` does: ``sys.argv``, ``__main__``, the working folder first on ``sys.path``, a normal
interpreter exit (threads joined, ``atexit``, an uncaught exception's traceback, exit code 1).

A run goes to a fresh interpreter instead whenever the fork could differ from one: an environment
variable that a module reads when it is imported (``HF_*``, ``TRANSFORMERS_*``, ``TORCH_*``, ``OMP_*``,
``PYTHONPATH``, ...) differs from the zygote's, or the zygote could not start. Tests about the process
itself (signals, Ctrl-C, a killed run) start real processes of their own.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Read by libraries when imported (or by the interpreter at start): a run whose value differs needs a
# fresh interpreter.
IMPORT_TIME_ENV = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH_", "PYTORCH_", "OMP_", "MKL_",
                   "KMP_", "CUDA_", "PYTHON", "SAFETENSORS_", "TQDM_", "LD_")
PRELOAD = ("torch", "transformers", "transformers.models.qwen2.modeling_qwen2", "verl.trainer.main_ppo",
           "verl.trainer.ppo.build", "verl.trainer.ppo.trainer")

SERVER = r"""
import json, os, sys, threading
import torch
torch.set_num_threads(1)
import importlib
for name in PRELOAD:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
requests = os.fdopen(os.dup(0), "rb", buffering=0)
replies = os.dup(1)

def say(message):
    os.write(replies, (json.dumps(message) + "\n").encode())

def serve():
    if threading.active_count() != 1:
        say({"error": f"{threading.active_count()} threads after the imports: forking is not safe"})
        return None
    say({"ready": True})
    while True:
        line = requests.readline()
        if not line:
            return None
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            requests.close()
            os.close(replies)
            return request
        say({"pid": pid})
        _, status = os.waitpid(pid, 0)
        say({"status": status})

request = serve()
if request is None:
    sys.exit(0)
os.setpgid(0, 0)  # a group of its own, as the fresh process the test would have started
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
sys.argv = [request["target"], *request["args"]]
import runpy
if request["kind"] == "module":
    sys.path[0] = os.getcwd()  # python -m puts the working folder first
    sys.modules.pop(request["target"], None)  # preloaded: it runs afresh as __main__, as under python -m
    runpy.run_module(request["target"], run_name="__main__", alter_sys=True)
else:
    sys.path[0] = os.path.dirname(os.path.abspath(request["target"]))  # python script.py puts its folder first
    runpy.run_path(request["target"], run_name="__main__")
"""


def _import_time_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV)}


class Zygote:
    """One forking server per test process, started at its first use."""

    def __init__(self):
        self.env: dict | None = None  # the environment it started in
        self.proc: subprocess.Popen | None = None
        self.broken: str | None = None

    def start(self, env: dict) -> bool:
        if self.proc is not None or self.broken:
            return self.proc is not None
        self.env = env
        code = f"PRELOAD = {PRELOAD!r}\n" + SERVER
        self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=self.env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        first = self._read(timeout=300)
        if not first or not first.get("ready"):
            self.broken = (first or {}).get("error", "the zygote did not start")
            self.close()
            return False
        atexit.register(self.close)
        return True

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None

    def _read(self, timeout: float | None) -> dict | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def fits(self, env: dict) -> bool:
        """Whether a run in ``env`` is what a fresh interpreter would run: the zygote started (or will start)
        with the same variables that imports read."""
        return self.env is None or _import_time_env(env) == _import_time_env(self.env)

    def run(self, kind: str, target: str, args: list[str], cwd: Path, env: dict,
            timeout: float) -> subprocess.CompletedProcess:
        command = [sys.executable, *(["-m"] if kind == "module" else []), target, *args]
        with tempfile.TemporaryDirectory(prefix="zygote-") as folder:
            out, err = Path(folder) / "stdout", Path(folder) / "stderr"
            request = {"kind": kind, "target": target, "args": args, "cwd": str(cwd), "env": env,
                       "stdout": str(out), "stderr": str(err)}
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            pid = self._read(timeout=60)["pid"]
            reply = self._read(timeout=timeout)
            if reply is None:  # over time: kill the run's group, as subprocess.run kills its child
                os.killpg(pid, signal.SIGKILL)
                self._read(timeout=60)
                raise subprocess.TimeoutExpired(command, timeout, out.read_text(), err.read_text())
            code = os.waitstatus_to_exitcode(reply["status"])
            return subprocess.CompletedProcess(command, code, out.read_text(), err.read_text())


_ZYGOTE = Zygote()


def run_module(module: str, args, *, cwd: Path = REPO, env: dict | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m module args`` in ``cwd`` with ``os.environ`` + the checkout importable + one thread +
    ``env``; what ``subprocess.run(..., capture_output=True, text=True)`` returns."""
    return _run("module", module, args, cwd, env, timeout)


def run_script(script, args, *, cwd: Path = REPO, env: dict | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """``python script args``, as :func:`run_module`."""
    return _run("script", str(script), args, cwd, env, timeout)


def _run(kind, target, args, cwd, env, timeout) -> subprocess.CompletedProcess:
    args = list(map(str, args))
    full = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
    if os.environ.get("VERL_TEST_NO_ZYGOTE") != "1" and _ZYGOTE.fits(full) and _ZYGOTE.start(full):
        return _ZYGOTE.run(kind, target, args, Path(cwd), full, timeout)
    command = [sys.executable, *(["-m"] if kind == "module" else []), target, *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full)
