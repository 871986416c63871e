"""The zygote of the tests' launches (see zygote.py): imports torch, transformers and verl once, then
serves a Unix socket. Each connection is one run, ``python ARGS`` as a client asks for it: the client
sends its standard input, output and error, then its arguments, working folder and environment.

    server --fork--> keeper (one per run) --fork--> the run

The keeper tells the client the run's pid, passes on the signals the client forwards (to the run's
process group, as torchrun's and a terminal's signals reach a process and its children), kills the
run if the client goes away, and sends the run's wait status when it ends. The run itself is a
process of its own session, with the client's files as 0, 1 and 2, that runs the module or script as
``python -m``/``python script`` would; where that could differ (other interpreter options, or an
environment variable read at import time that differs from the server's) it becomes a fresh
interpreter instead (``execve``), with the same pid, files and keeper.

Usage: ``python zygote_server.py SOCKET_PATH MODULE,MODULE,...``; it prints ``{"ready": true}`` once it
serves and ends when its standard input closes.
"""

import fcntl
import io
import json
import os
import select
import signal
import socket
import struct
import sys
import threading

# Read by libraries when imported (or by the interpreter at start): a run whose value differs needs a
# fresh interpreter. Variables a launcher sets that nothing reads at import are left out.
IMPORT_TIME_ENV = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH_", "PYTORCH_", "OMP_", "MKL_",
                   "KMP_", "CUDA_", "PYTHON", "SAFETENSORS_", "TQDM_", "LD_", "VLLM_", "TRITON_")
RUN_TIME_ENV = ("PYTHON_EXEC", "TORCH_NCCL_")  # torchrun's: the ranks' interpreter, NCCL's error handling
MAX_FDS = 253  # the kernel's limit on the files of one message (SCM_MAX_FD)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def import_time_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV) and not k.startswith(RUN_TIME_ENV)}


def send(conn: socket.socket, message: dict) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


def receive_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """The client's open files (sent with the first byte; the request's ``fds`` says which numbers they had
    there, 0, 1 and 2 by default), then a length-prefixed JSON request."""
    _, fds, _, _ = socket.recv_fds(conn, 1, MAX_FDS)
    (size,) = struct.unpack("!Q", _exactly(conn, 8))
    return json.loads(_exactly(conn, size)), fds


def _exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(min(1 << 20, size - len(data)))
        if not chunk:
            raise EOFError("the client went away")
        data += chunk
    return data


def serve(address: str, preload: list[str]):
    """Import, listen, fork a keeper per connection. Returns in a run's process only (its request's
    kind and target); in the server when its standard input closes (None)."""
    import torch

    torch.set_num_threads(1)
    import importlib

    started = dict(os.environ)
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    warm()
    # A run is compared with the environment this process started with, and gets what the imports set (vLLM's
    # sets TORCHINDUCTOR_*, LD_LIBRARY_PATH, ...), as its own imports in a fresh interpreter would.
    set_by_imports = {k: v for k, v in os.environ.items() if started.get(k) != v}
    forced = import_time_env(set_by_imports)  # what the imports set, whatever the run had: they would set it again
    base = {"started": import_time_env(started), "forced": forced,
            "defaults": {k: v for k, v in set_by_imports.items() if k not in forced}}
    if threading.active_count() != 1:
        print(json.dumps({"error": f"{threading.active_count()} threads after the imports: forking is not safe"}),
              flush=True)
        return None
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(128)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the keepers
    print(json.dumps({"ready": True}), flush=True)
    while True:
        ready = select.select([listener, 0], [], [])[0]
        if 0 in ready and not os.read(0, 4096):
            return None
        if listener in ready:
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                return keep(conn, base)
            conn.close()


def warm() -> None:
    """Fill the pure-Python caches that every run fills on its first use, once, before any fork: the config
    schema's field tables (``typing.get_type_hints`` of ~570 string annotations), Hydra's override parser and
    its lexer's states, transformers' table of checkpoint renamings (~1,000 regular expressions, built on a
    model's first ``from_pretrained``). About 0.3 CPU-s a forked run. No thread starts and no value a run
    computes changes: each cache holds what the run would build itself."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    from verl.config import TrainerConfig

    get_checkpoint_conversion_mapping("qwen2")
    TrainerConfig.from_cli(["actor_rollout_ref.actor.optim.lr=1e-6", "trainer.logger=['console']",
                            "data.train_files=/tmp/train.parquet", "+actor_rollout_ref.model.override_config.x=0.1",
                            "trainer.experiment_name='a run'", "critic.enable=null"]).to_yaml()


def keep(conn: socket.socket, base: dict):
    """The keeper of one run: starts it, forwards signals, reports its end. Returns in the run only."""
    try:
        request, fds = receive_request(conn)
    except (OSError, EOFError, ValueError):
        os._exit(1)
    pid = os.fork()
    if pid == 0:
        conn.close()
        return prepare(request, fds, base)
    for fd in fds:
        os.close(fd)
    try:
        send(conn, {"pid": pid})
    except OSError:
        pass
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    watched, pending = [conn, *([pidfd] if pidfd is not None else [])], b""
    while True:
        ready = select.select(watched, [], [], None if pidfd is not None else 0.05)[0]
        if pidfd is None or pidfd in ready:
            done, status = os.waitpid(pid, 0 if pidfd is not None else os.WNOHANG)
            if done:
                try:
                    send(conn, {"status": status})
                except OSError:
                    pass
                os._exit(0)
        if conn in ready:
            try:
                data = conn.recv(4096)
            except OSError:
                data = b""
            if not data:  # the client is gone: so is its run
                watched.remove(conn)
                _signal_group(pid, signal.SIGKILL)
                continue
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                _signal_group(pid, int(line))


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def open_fds() -> list[int]:
    """The files open in this process (not the one that lists them)."""
    listed = sorted(int(name) for name in os.listdir("/proc/self/fd"))
    out = []
    for fd in listed:
        try:
            os.fstat(fd)
            out.append(fd)
        except OSError:
            pass
    return out


def parse(argv: list[str]):
    """``[-u] [-B]`` then ``-m MODULE ARGS``, ``-c CODE ARGS`` (as multiprocessing starts its processes)
    or ``SCRIPT ARGS`` -> (kind, target, args, options), ``options`` the set of ``-u`` / ``-B`` given; None
    for any other interpreter command line."""
    i = 0
    while i < len(argv) and argv[i] in ("-u", "-B"):
        i += 1
    options = set(argv[:i])
    if i + 1 < len(argv) and argv[i] in ("-m", "-c"):
        return {"-m": "module", "-c": "code"}[argv[i]], argv[i + 1], argv[i + 2:], options
    if i < len(argv) and not argv[i].startswith("-"):
        return "script", argv[i], argv[i + 1:], options
    return None


def prepare(request: dict, fds: list[int], base: dict):
    """The run's process: the client's files, folder, environment and arguments."""
    os.setsid()  # a session and group of its own, as a launcher's fresh process has
    targets = request.get("fds", [0, 1, 2])
    # A file the client had at a number this process already uses (for something a preloaded library
    # opened) cannot be put there without breaking that: such a run gets a fresh interpreter.
    taken = set(open_fds()) - set(fds) - {0, 1, 2}
    clash = bool(taken & set(targets))
    above = max([*targets, *taken, *fds]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, above) for fd in fds]  # out of the way of every target first
    for fd in fds:
        os.close(fd)
    for fd, target in zip(moved, targets):
        os.dup2(fd, target)  # inheritable, as the client's were
        os.close(fd)
    env, argv = request["env"], request["argv"]
    os.chdir(request["cwd"])
    # What the client's fresh interpreter would have started with: its blocked and ignored signals
    # (both survive exec), Python's own KeyboardInterrupt handler otherwise.
    signal.pthread_sigmask(signal.SIG_SETMASK, request.get("blocked", []))
    for sig in FORWARDED:
        if sig in request.get("ignored", []):
            signal.signal(sig, signal.SIG_IGN)
        else:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    job = parse(argv)
    if job is None or clash or import_time_env(env) != base["started"]:
        os.execve(sys.executable, [sys.executable, *argv], env)
    env = {**base["defaults"], **env, **base["forced"]}
    kind, target, args, options = job
    unbuffered = "-u" in options
    if "-B" in options:  # no .pyc files written (multiprocessing passes on its process's -B)
        sys.dont_write_bytecode = True
    if request.get("launcher"):  # multiprocessing's processes start through the launcher too
        import multiprocessing

        multiprocessing.set_executable(request["launcher"])
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["-c" if kind == "code" else target, *args]
    encoding, errors = sys.stdout.encoding, sys.stdout.errors
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=encoding)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.FileIO(fd, "w", closefd=False)
        if unbuffered:  # python -u: no buffer at all
            stream = io.TextIOWrapper(raw, encoding=encoding, errors=errors, write_through=True)
        else:  # a terminal's and standard error's lines go out as they end
            stream = io.TextIOWrapper(io.BufferedWriter(raw), encoding=encoding, errors=errors,
                                      line_buffering=raw.isatty() or name == "stderr")
        setattr(sys, name, stream)
    return kind, target


if __name__ == "__main__":
    job = serve(sys.argv[1], [name for name in sys.argv[2].split(",") if name])
    if job is None:
        sys.exit(0)
    kind, target = job
    import runpy

    if kind == "module":
        sys.path[0] = os.getcwd()  # python -m puts the working folder first
        sys.modules.pop(target, None)  # preloaded: it runs afresh as __main__, as under python -m
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif kind == "code":
        import types

        sys.path[0] = ""  # python -c puts the working folder first, as ''
        main = sys.modules["__main__"] = types.ModuleType("__main__")
        exec(compile(target, "<string>", "exec"), vars(main))
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(target))  # python script.py puts its folder first
        runpy.run_path(target, run_name="__main__")
