"""``python -m <module> args`` for the tests, started by a fork of a process that has already imported
torch, transformers and verl: the run itself is the same, its start-up is not paid again.

A tiny ``main_ppo`` run costs about 6.5 CPU-seconds as a fresh interpreter and about 1.5 when forked
from a process past its imports (torch's and transformers' imports, their first-call set-up); the
suite launches such runs, and torchrun ranks, well over a hundred times.

* :func:`run_module` / :func:`run_script` return what ``subprocess.run`` returns (a ``CompletedProcess``
  with the exit code, stdout and stderr as text) and run the module as ``python -m`` does: ``sys.argv``,
  ``__main__``, the working folder first on ``sys.path``, a normal interpreter exit (threads joined,
  ``atexit``, an uncaught exception's traceback, exit code 1).
* :func:`launchers` is a folder of ``python`` and ``torchrun`` commands that do the same for any
  process that starts them: torchrun's ranks (``PYTHON_EXEC``, which torchrun runs its ranks with),
  the documents' bash blocks, and the processes a run starts with multiprocessing's spawn (the
  asynchronous rollout: a run's ``multiprocessing.set_executable`` is the launcher, and the launcher
  passes on every open file, as multiprocessing hands its pipes over by number). Such a command stays
  the run's stand-in: it passes its files to the run,
  forwards the signals it gets to the run's process group, exits as the run did (its code, or the
  signal that ended it), and its own death kills the run.

The server (zygote_server.py) forks each run from its imports; a run goes to a fresh interpreter
instead whenever the fork could differ from one: an environment variable that a module reads when it
is imported (``HF_*``, ``TRANSFORMERS_*``, ``TORCH_*``, ``OMP_*``, ``PYTHONPATH``, ...) differs from the
server's, or other interpreter options. Tests about the process itself (signals to a rank, a killed
torchrun, children found through /proc) start real processes of their own. ``VERL_TEST_NO_ZYGOTE=1``
turns it all off.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from zygote_server import FORWARDED

REPO = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).with_name("zygote_server.py")
# What a run imports, so that a forked run does not: the libraries, and what a run of main_ppo imports
# after its start (the run report's matplotlib, pandas, Hydra's parser, PEFT for LoRA; ~0.8 CPU-s).
PRELOAD = ("torch", "transformers", "transformers.models.qwen2.modeling_qwen2", "verl.trainer.main_ppo",
           "verl.trainer.ppo.build", "verl.trainer.warmstart", "verl.rollout.native", "verl.tracking.report",
           "verl.trainer.ppo.memory_plan", "matplotlib.figure", "matplotlib.backends.backend_agg", "pandas",
           "hydra", "peft", "vllm.entrypoints.llm")  # vLLM where installed (its test environment; ~4 s)

# A launcher: a client of the server that stands in for the run (-S -E: the standard library only, at once).
LAUNCHER = r"""#!{python} -SE
import json, os, signal, socket, struct, sys
ADDRESS, PYTHON, PREFIX, EXTRA_ENV, LAUNCHER = {address!r}, {python!r}, {prefix!r}, {extra_env!r}, {launcher!r}
argv = PREFIX + sys.argv[1:]
env = dict(os.environ, **EXTRA_ENV)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    sock.connect(ADDRESS)
except OSError:  # no server (any more): a fresh interpreter
    os.execve(PYTHON, [PYTHON, *argv], env)
def is_open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
# Every file a fresh interpreter would have (multiprocessing passes its pipes by number too).
fds = [fd for fd in sorted(int(name) for name in os.listdir("/proc/self/fd")) if fd != sock.fileno() and is_open(fd)]
socket.send_fds(sock, [b"Z"], fds)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# What a fresh interpreter started here would inherit: the blocked signals, the ignored ones. The
# others are held back while the request goes out, then forwarded (none is lost, none cuts the request).
blocked = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
ignored = [int(s) for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN]
def forward(sig, frame):
    sock.sendall(b"%d\n" % sig)
for sig in FORWARDED:
    if sig not in ignored:
        signal.signal(sig, forward)
data = json.dumps({{"argv": argv, "cwd": os.getcwd(), "env": env, "blocked": sorted(map(int, blocked)),
                   "ignored": ignored, "fds": fds, "launcher": LAUNCHER}}).encode()
sock.sendall(struct.pack("!Q", len(data)) + data)
signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
status = None
for line in sock.makefile("rb"):
    status = json.loads(line).get("status", status)
if status is None:
    os._exit(70)
code = os.waitstatus_to_exitcode(status)
if code < 0:
    if -code != signal.SIGKILL:
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
os._exit(code)
"""


class Zygote:
    """One forking server per test process, started at its first use (with that run's environment:
    torch sets ``TORCHINDUCTOR_CACHE_DIR`` in the test process after its first model, so an environment
    taken at import would differ from every later run's)."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.broken: str | None = None
        self.folder: Path | None = None

    @property
    def address(self) -> str:
        return str(self.folder / "socket")

    def start(self, env: dict) -> bool:
        if self.proc is not None or self.broken:
            return self.proc is not None
        self.folder = Path(tempfile.mkdtemp(prefix="zygote-"))
        self.proc = subprocess.Popen([sys.executable, str(SERVER), self.address, ",".join(PRELOAD)], cwd=REPO,
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        ready, _, _ = select.select([self.proc.stdout], [], [], 300)
        first = json.loads(self.proc.stdout.readline() or "null") if ready else None
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
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def launchers(self) -> Path:
        """The folder of ``python`` and ``torchrun`` launchers (written once)."""
        folder = self.folder / "bin"
        if not folder.exists():
            folder.mkdir()
            python = folder / "python"
            for name, prefix, extra in (("python", [], {}), ("python3", [], {}),
                                        ("torchrun", ["-m", "torch.distributed.run"], {"PYTHON_EXEC": str(python)})):
                path = folder / name
                path.write_text(LAUNCHER.format(python=sys.executable, address=self.address, prefix=prefix,
                                                extra_env=extra, launcher=str(python)))
                path.chmod(0o755)
        return folder

    def run(self, argv: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
        command = [sys.executable, *argv]
        with tempfile.TemporaryDirectory(prefix="zygote-run-") as folder, \
                socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            out, err = Path(folder) / "stdout", Path(folder) / "stderr"
            files = [os.open(os.devnull, os.O_RDONLY), os.open(out, os.O_WRONLY | os.O_CREAT, 0o644),
                     os.open(err, os.O_WRONLY | os.O_CREAT, 0o644)]
            try:
                sock.connect(self.address)
                socket.send_fds(sock, [b"Z"], files)
            finally:
                for fd in files:
                    os.close(fd)
            request = {"argv": argv, "cwd": str(cwd), "env": env, "launcher": str(self.launchers() / "python"),
                       **_signal_state()}
            data = json.dumps(request).encode()
            sock.sendall(struct.pack("!Q", len(data)) + data)
            replies = sock.makefile("rb")
            pid = json.loads(replies.readline())["pid"]
            if not select.select([sock], [], [], timeout)[0]:  # over time: kill the run's group, as
                os.killpg(pid, signal.SIGKILL)                 # subprocess.run kills its child
                replies.readline()
                raise subprocess.TimeoutExpired(command, timeout, out.read_text(), err.read_text())
            code = os.waitstatus_to_exitcode(json.loads(replies.readline())["status"])
            return subprocess.CompletedProcess(command, code, out.read_text(), err.read_text())


_ZYGOTE = Zygote()


def _signal_state() -> dict:
    """The blocked and ignored signals that a process started from here inherits (through exec too)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    return {"blocked": sorted(map(int, blocked)),
            "ignored": [int(s) for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN]}


def base_env(env: dict | None = None) -> dict:
    """``os.environ`` + the checkout importable + one thread + ``env``."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}


def _serving(env: dict) -> bool:
    return os.environ.get("VERL_TEST_NO_ZYGOTE") != "1" and _ZYGOTE.start(env)


def run_module(module: str, args, *, cwd: Path = REPO, env: dict | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m module args`` in ``cwd`` with ``os.environ`` + the checkout importable + one thread +
    ``env``; what ``subprocess.run(..., capture_output=True, text=True)`` returns."""
    return _run(["-m", module, *map(str, args)], cwd, env, timeout)


def run_script(script, args, *, cwd: Path = REPO, env: dict | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """``python script args``, as :func:`run_module`."""
    return _run([str(script), *map(str, args)], cwd, env, timeout)


def run_torchrun(args, *, cwd: Path = REPO, env: dict | None = None,
                 timeout: float = 600) -> subprocess.CompletedProcess:
    """``torchrun args`` (``python -m torch.distributed.run``), its ranks started as :func:`run_module`'s runs."""
    full = base_env(env)
    if _serving(full):
        full["PYTHON_EXEC"] = str(_ZYGOTE.launchers() / "python")
    return _run(["-m", "torch.distributed.run", *map(str, args)], cwd, full, timeout)


def launchers(env: dict | None = None) -> Path | None:
    """The folder of ``python``, ``python3`` and ``torchrun`` launchers, to put first on ``PATH``; None
    where the zygote is off or could not start."""
    return _ZYGOTE.launchers() if _serving(base_env(env)) else None


def ray_worker_keys(env: dict | None = None) -> list[str]:
    """The override of verl's key for the Ray workers' interpreter (``ray_kwargs.ray_init.runtime_env.
    py_executable``) that starts a run's Ray actors as forks too; [] where the zygote is off."""
    folder = launchers(env)
    return [] if folder is None else [f"ray_kwargs.ray_init.runtime_env.py_executable={folder / 'python'}"]


def _run(argv, cwd, env, timeout) -> subprocess.CompletedProcess:
    full = base_env(env)
    if _serving(full):
        return _ZYGOTE.run(argv, Path(cwd), full, timeout)
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=full)
