"""Asynchronous RL's failures (``async_training.enable``): a rollout process or rank that dies or hangs ends
the run with one line naming it, its checkpoints intact; a trainer that dies takes its rollout along;
Ctrl-C stops after the step with its checkpoint while the rollout runs ahead; rollout ranks outside
torchrun are refused before anything loads."""

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO
from zygote import run_module
from rl_compare import GRPO, ASYNC, ONE_STEP_OFF, RANKS, make_data_dir, run_args

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_data_dir(tmp_path_factory.mktemp("async-failure-data"))


def test_a_rollout_rank_that_dies_ends_the_job_with_one_line_naming_it(tiny_model_dir, data_dir, tmp_path):
    out = tmp_path / "dies"
    args = run_args(tiny_model_dir, data_dir, out, *GRPO, *ONE_STEP_OFF, *RANKS, "trainer.total_training_steps=200",
                    "trainer.test_freq=-1", "trainer.dist_timeout_s=60")
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                            "-m", "verl.trainer.main_ppo", *args], cwd=REPO, text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    _wait_for(out / "global_step_2", job)  # training (a death at start-up is torchrun's to report)
    (rollout,) = [pid for pid in _children(job.pid) if b"RANK=1\0" in open(f"/proc/{pid}/environ", "rb").read()]
    os.kill(rollout, signal.SIGKILL)
    _, err = job.communicate(timeout=60)
    assert job.returncode != 0
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and f"the rollout on rank 1 of the torchrun job (pid {rollout} on " in lines[0] and \
        "closed its connection (it died or left the job) while generating step" in lines[0], err[-3000:]
    assert "run the same command again to resume" in lines[0]
    assert int((out / "latest_checkpointed_iteration.txt").read_text()) >= 2  # what it had saved is intact


@pytest.mark.parametrize("launch", [["-m", "verl.trainer.main_ppo"],
                                    ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                                     "verl.trainer.main_ppo", *RANKS]], ids=["process", "ranks"])
def test_ctrl_c_stops_after_the_step_with_its_checkpoint_while_the_rollout_runs_ahead(tiny_model_dir, data_dir,
                                                                                        tmp_path, launch):
    # A terminal's Ctrl-C reaches the whole process group, the rollout's process (or torchrun's ranks) too:
    # the rollout must outlive it, to answer what the trainer still asks before its checkpoint.
    out = tmp_path / "interrupted"
    args = run_args(tiny_model_dir, data_dir, out, *GRPO, *ONE_STEP_OFF, "trainer.total_training_steps=200",
                    "trainer.test_freq=-1", "trainer.dist_timeout_s=60")
    job = subprocess.Popen([sys.executable, *launch, *args], cwd=REPO, text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, start_new_session=True,
                           env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    _wait_for(out / "global_step_2", job)
    os.killpg(job.pid, signal.SIGINT)
    _, err = job.communicate(timeout=60)
    stopped = [line for line in err.splitlines() if line.startswith("interrupted: stopped after step")]
    assert len(stopped) == 1 and "error:" not in err, err[-3000:]
    step = int(stopped[0].split("step ")[1].split(",")[0])
    assert (out / f"global_step_{step}" / "state.pt").exists()
    assert int((out / "latest_checkpointed_iteration.txt").read_text()) == step


def test_rollout_ranks_are_refused_outside_torchrun_before_anything_loads(tiny_model_dir, data_dir, tmp_path):
    # (a torchrun job with no rank left to train: tests/unit/test_async_config.py)
    args = run_args(tiny_model_dir, data_dir, tmp_path / "alone", *GRPO, *ASYNC, *RANKS)
    done = run_module("verl.trainer.main_ppo", args)
    assert done.returncode == 2 and "not started by torchrun: start it with torchrun --nproc_per_node=T+1" \
        in done.stderr, done.stderr[-2000:]
    assert "Memory plan" not in done.stdout


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _rollout_pids(pid: int) -> list[int]:
    """The rollout processes under ``pid``, in the order they were started."""
    found = []
    for child in _children(pid):
        cmdline = open(f"/proc/{child}/cmdline", "rb").read()
        if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            found.append(child)
    assert found, f"no rollout process under {pid}"
    return sorted(found)


def _rollout_pid(pid: int) -> int:
    return _rollout_pids(pid)[0]


def _start_long_run(tiny_model_dir, data_dir, out, timeout_s=60, *extra):
    args = run_args(tiny_model_dir, data_dir, out, *GRPO, *ONE_STEP_OFF, "trainer.total_training_steps=200",
                    "trainer.test_freq=-1", f"trainer.dist_timeout_s={timeout_s}", *extra)
    return subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})


def _wait_for(path, proc, seconds=120):
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


def _kill_and_check_the_rollout_follows(trainer: subprocess.Popen, rollout: int) -> None:
    """SIGKILL the trainer; its rollout process ``rollout`` is gone (or a zombie) within 10 s."""
    trainer.kill()
    trainer.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{rollout}") and time.monotonic() < deadline:
        time.sleep(0.1)
    state = open(f"/proc/{rollout}/stat").read().split()[2] if os.path.exists(f"/proc/{rollout}") else "gone"
    assert state in ("gone", "Z"), f"the rollout process {rollout} outlived its trainer (state {state})"


def test_a_dead_or_hung_rollout_ends_the_run_with_one_line_and_a_dead_trainer_takes_the_rollout_along(
        tiny_model_dir, data_dir, tmp_path):
    out = tmp_path / "rollout-killed"
    proc = _start_long_run(tiny_model_dir, data_dir, out)
    _wait_for(out / "global_step_2", proc)
    os.kill(_rollout_pid(proc.pid), signal.SIGKILL)
    killed = time.monotonic()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0 and time.monotonic() - killed < 20
    assert "the rollout process (pid" in stderr and "died (was killed by signal 9) while generating step" in stderr
    assert "checkpoints in trainer.default_local_dir are intact" in stderr
    assert (out / "global_step_2" / "state.pt").exists()

    # One process of a pool of two dies: the run ends naming which one.
    out = tmp_path / "pool-member-killed"
    proc = _start_long_run(tiny_model_dir, data_dir, out, 60, "rollout.n_gpus_per_node=2")
    _wait_for(out / "global_step_2", proc)
    _, second = _rollout_pids(proc.pid)
    os.kill(second, signal.SIGKILL)
    killed = time.monotonic()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0 and time.monotonic() - killed < 20
    assert f"the rollout process 2 of 2 (pid {second}) died (was killed by signal 9) while generating step" in stderr
    assert "checkpoints in trainer.default_local_dir are intact" in stderr
    assert (out / "global_step_2" / "state.pt").exists()

    # A rollout that hangs (stopped here) ends the run once it has sent nothing for trainer.dist_timeout_s.
    out = tmp_path / "rollout-hung"
    proc = _start_long_run(tiny_model_dir, data_dir, out, timeout_s=8)
    _wait_for(out / "global_step_2", proc)
    os.kill(_rollout_pid(proc.pid), signal.SIGSTOP)
    stopped = time.monotonic()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0 and time.monotonic() - stopped < 8 + 12
    assert "sent nothing for 8 s (trainer.dist_timeout_s) while generating step" in stderr

    out = tmp_path / "trainer-killed"
    proc = _start_long_run(tiny_model_dir, data_dir, out)
    _wait_for(out / "global_step_2", proc)
    rollout = _rollout_pid(proc.pid)
    _kill_and_check_the_rollout_follows(proc, rollout)


WRAPPED_TRAINER = '''
import multiprocessing, os, sys, time

from verl.distributed.rollout_server import _exit_with_parent


def rollout(parent_pid, pids):
    import threading

    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    pids.put(os.getpid())
    time.sleep(600)


if __name__ == "__main__":
    multiprocessing.set_executable(sys.argv[1])  # the rollout's parent is the wrapper, not this process
    ctx = multiprocessing.get_context("spawn")
    pids = ctx.Queue()
    ctx.Process(target=rollout, args=(os.getpid(), pids), daemon=True).start()
    print(pids.get(timeout=120), flush=True)
    time.sleep(600)
'''


def test_a_rollout_started_through_a_wrapper_executable_still_ends_with_its_trainer(tmp_path):
    # multiprocessing.set_executable(wrapper): the rollout's parent is then the wrapper, which outlives
    # the trainer; the rollout watches multiprocessing's parent pipe, which closes when the trainer dies.
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\n"{sys.executable}" "$@"\nexit $?\n')  # sh stays the parent (no exec)
    wrapper.chmod(0o755)
    (tmp_path / "trainer.py").write_text(WRAPPED_TRAINER)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "trainer.py"), str(wrapper)], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    rollout = int(proc.stdout.readline())
    assert open(f"/proc/{rollout}/status").read().count(f"PPid:\t{proc.pid}\n") == 0  # the wrapper is its parent
    time.sleep(1.5)  # the rollout's watch runs (it ends nothing while the trainer lives)
    assert os.path.exists(f"/proc/{rollout}")
    _kill_and_check_the_rollout_follows(proc, rollout)
