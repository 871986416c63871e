"""tests/integration/zygote.py: a forked launch is what ``python -m`` would have run (argv, working folder,
environment, output, exit code, traceback, timeout), and a run whose import-time environment differs
gets a fresh interpreter. Its launchers (``python``, ``torchrun``) stand in for the run they start:
standard input and output, signals, exit code or signal, and their own death."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zygote import _ZYGOTE, REPO, launchers, run_module, run_torchrun

PROBE = '''
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "flag": os.environ.get("PROBE_FLAG"),
                  "forked": sys.orig_argv[1] != "-m", "main": __name__, "rank": os.environ.get("RANK")}),
      flush=True)
print("to stderr", file=sys.stderr)
what = sys.argv[1]
if what == "exit":
    sys.exit(3)
if what == "raise":
    raise RuntimeError("the probe failed")
if what == "stdin":
    print(sys.stdin.read().upper())
if what in ("sleep", "interrupt"):
    import time
    with open(sys.argv[2], "w") as f:
        f.write(str(os.getpid()))
    try:
        time.sleep(60)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
'''


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "zprobe.py").write_text(PROBE)
    return tmp_path


def _seen(done) -> dict:
    return json.loads(done.stdout.splitlines()[0])


def test_a_forked_run_sees_its_argv_folder_and_environment_and_exits_as_python_m_would(probe):
    done = run_module("zprobe", ["ok", "x=1"], cwd=probe, env={"PROBE_FLAG": "on"})
    seen = _seen(done)
    assert done.returncode == 0 and done.stderr.strip() == "to stderr"
    assert seen == {"argv": ["ok", "x=1"], "cwd": str(probe), "flag": "on", "forked": True, "main": "__main__",
                    "rank": None}
    assert run_module("zprobe", ["exit"], cwd=probe).returncode == 3
    failed = run_module("zprobe", ["raise"], cwd=probe)
    assert failed.returncode == 1
    assert "Traceback" in failed.stderr and "RuntimeError: the probe failed" in failed.stderr
    with pytest.raises(subprocess.TimeoutExpired):
        run_module("zprobe", ["sleep", probe / "pid"], cwd=probe, timeout=2)
    assert _seen(run_module("zprobe", ["ok"], cwd=probe))["forked"]  # the zygote serves on after a kill


def test_a_different_import_time_variable_gets_a_fresh_interpreter(probe):
    run_module("zprobe", ["ok"], cwd=probe)  # the zygote is started
    done = run_module("zprobe", ["ok"], cwd=probe, env={"TRANSFORMERS_VERBOSITY": "error"})
    assert done.returncode == 0 and not _seen(done)["forked"]
    assert _ZYGOTE.proc is not None


def _launch(probe, *args, **kwargs):
    python = launchers() / "python"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([str(python), "-m", "zprobe", *map(str, args)], cwd=probe, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_plain_signals, **kwargs)


def _plain_signals():
    """A launcher started as from a shell: no signal blocked or ignored (whatever the test process inherited)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for_pid(path, launched) -> int:
    deadline = time.monotonic() + 60
    while not (path.exists() and path.read_text()) and time.monotonic() < deadline:
        assert launched.poll() is None, launched.communicate()
        time.sleep(0.05)
    return int(path.read_text())


def test_the_python_launcher_passes_its_files_and_exits_as_the_run_did(probe):
    launched = _launch(probe, "stdin", stdin=subprocess.PIPE)
    out, err = launched.communicate("shout\n", timeout=60)
    assert launched.returncode == 0 and json.loads(out.splitlines()[0])["forked"]
    assert out.splitlines()[1] == "SHOUT" and err.strip() == "to stderr"
    failed = _launch(probe, "raise")
    _, err = failed.communicate(timeout=60)
    assert failed.returncode == 1 and "RuntimeError: the probe failed" in err


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, -signal.SIGTERM)])
def test_a_signal_to_the_launcher_reaches_the_run(probe, sig, code):
    launched = _launch(probe, "interrupt", probe / "pid")
    run = _wait_for_pid(probe / "pid", launched)
    assert run != launched.pid  # the run is a fork of the zygote, not the launcher
    launched.send_signal(sig)
    try:
        out, _ = launched.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # what the run started with, to tell why it did not end
        state = Path(f"/proc/{run}/status").read_text() if Path(f"/proc/{run}").exists() else "gone"
        raise AssertionError(f"the run {run} did not end: {state}") from None
    assert launched.returncode == code
    assert ("interrupted" in out) == (sig == signal.SIGINT)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_run_ended_by_a_signal_ends_its_launcher_by_the_same_signal(probe, sig):
    launched = _launch(probe, "sleep", probe / "pid")
    os.kill(_wait_for_pid(probe / "pid", launched), sig)
    _, err = launched.communicate(timeout=60)
    assert launched.returncode == -sig and "Traceback" not in err


def test_the_run_inherits_the_signals_its_launcher_blocks_or_ignores(probe):
    """As a fresh interpreter would (exec keeps both): here SIGINT ignored, SIGUSR1 blocked."""
    def ignoring():
        signal.pthread_sigmask(signal.SIG_SETMASK, [signal.SIGUSR1])
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    python = launchers() / "python"
    code = ("import signal, sys; print(sys.orig_argv[1] != '-m', signal.getsignal(signal.SIGINT) == signal.SIG_IGN, "
            "sorted(map(int, signal.pthread_sigmask(signal.SIG_BLOCK, []))), flush=True)")
    (probe / "zsignals.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for launcher in (python, sys.executable):  # the fork, and a fresh interpreter started the same way
        done = subprocess.run([str(launcher), "-m", "zsignals"], cwd=probe, env=env, capture_output=True, text=True,
                              preexec_fn=ignoring, timeout=60)
        forked = str(launcher == python)
        assert done.stdout.split(None, 2) == [forked, "True", f"[{int(signal.SIGUSR1)}]\n"], (launcher, done)


def test_a_killed_launcher_takes_its_run_along(probe):
    launched = _launch(probe, "sleep", probe / "pid")
    run = _wait_for_pid(probe / "pid", launched)
    launched.kill()
    launched.wait(timeout=10)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{run}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{run}")


def test_torchrun_ranks_are_forks_and_the_job_ends_as_torchrun_would(probe):
    done = run_torchrun(["--standalone", "--nproc_per_node=2", probe / "zprobe.py", "ok"], cwd=probe)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = sorted((json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")),
                  key=lambda s: s["rank"])
    assert [(s["rank"], s["forked"], s["argv"]) for s in seen] == [("0", True, ["ok"]), ("1", True, ["ok"])]
    failed = run_torchrun(["--standalone", "--nproc_per_node=2", probe / "zprobe.py", "exit"], cwd=probe)
    assert failed.returncode != 0 and "exitcode  : 3" in failed.stderr, failed.stderr[-2000:]


SPAWNER = '''
import json, multiprocessing, os, sys


def child(queue, code):
    queue.put({"forked": "torch" in sys.modules, "parent_alive": multiprocessing.parent_process().is_alive()})
    sys.exit(code)


if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=child, args=(queue, 7))
    process.start()
    seen = queue.get(timeout=120)
    process.join()
    print(json.dumps({**seen, "exitcode": process.exitcode}))
'''


def test_multiprocessing_spawns_from_a_run_are_forks_with_their_pipes(tmp_path):
    # multiprocessing passes its pipes to a spawned process by number (-c 'spawn_main(pipe_handle=N)'):
    # through the launcher the process is a fork too, with those pipes, its parent's pipe open, its exit code.
    (tmp_path / "spawner.py").write_text(SPAWNER)
    done = run_module("spawner", [], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"forked": True, "parent_alive": True, "exitcode": 7}
