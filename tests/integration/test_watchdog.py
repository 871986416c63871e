"""A rank that dies, stalls or raises ends a torchrun job within the timeout, with one line naming it.

Two CPU ranks (gloo) run stages with an all-reduce in each, under a watchdog with a 3 s timeout.
Rank 1 (or 0) is killed (SIGKILL), stopped (SIGSTOP) or raises ValueError in a known stage; the
other rank then waits in its next all-reduce, which only the watchdog ends in time. A clean run
must end with exit 0, no error line, and a number of heartbeats set by the run's length, not by its
number of stages. The first tests run in this process: the watchdog is inert at world size 1.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from helpers import free_port

from verl.distributed.process_group import ensure_process_group
from verl.distributed.process_group import collective_timeout
from verl.distributed.watchdog import EXIT_CODE, Watchdog
from verl.errors import VerlError

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 3.0
MARGIN_S = 5.0  # detection within one heartbeat after the timeout, plus torchrun's teardown on a busy machine


# ---------------------------------------------------------------- one process
def test_at_world_size_1_the_watchdog_is_inert_and_changes_nothing_in_the_process():
    ensure_process_group()  # a one-rank group, as in the default single-process trainer
    hook, sigterm, threads = sys.excepthook, signal.getsignal(signal.SIGTERM), threading.active_count()
    watchdog = Watchdog.start(5.0)
    assert (sys.excepthook, signal.getsignal(signal.SIGTERM)) == (hook, sigterm)
    assert threading.active_count() == threads
    with pytest.raises(ValueError, match="boom"):  # an exception passes through untouched
        with watchdog.stage("reward", step=1):
            raise ValueError("boom")
    watchdog.stop()
    watchdog.stop()
    assert watchdog.beats == 0


def test_where_names_the_stage_and_step_a_report_will_show():
    watchdog = Watchdog.start(5.0)
    assert watchdog.where() == "before its first stage"
    with watchdog.stage("generate", step=3):
        assert watchdog.where() == "during stage 'generate' (step 3)"
        with watchdog.stage("weight_sync"):  # nested: the step carries on
            assert watchdog.where() == "during stage 'weight_sync' (step 3)"
        assert watchdog.where() == "during stage 'generate' (step 3)"
    assert watchdog.where() == "after stage 'generate' (step 3), between stages"
    with watchdog.stage("reward"):  # the step of the last stage carries on
        assert watchdog.where() == "during stage 'reward' (step 3)"
    with watchdog.stage("save_checkpoint", step=4):
        pass
    assert watchdog.where() == "after stage 'save_checkpoint' (step 4), between stages"


def test_the_heartbeat_interval_follows_the_timeout():
    assert Watchdog.start(3.0).interval_s == 0.75
    assert Watchdog.start(600.0).interval_s == 1.0
    assert Watchdog.start(600.0, interval_s=5.0).interval_s == 5.0
    with pytest.raises(VerlError, match="dist_timeout_s must be positive"):
        Watchdog.start(0)


def test_the_process_group_waits_longer_than_the_watchdog():
    assert collective_timeout(30) == timedelta(seconds=90)
    assert collective_timeout(600) > timedelta(seconds=600)


# ---------------------------------------------------------------- two ranks under torchrun
# Each rank runs 3 steps of 5 stages, an all-reduce in each; the victim rank acts in step 2.
RANK_SCRIPT = textwrap.dedent('''
    import json, multiprocessing, os, sys, time
    import torch
    torch.set_num_threads(1)
    import torch.distributed as dist
    import verl.distributed.processes
    from verl.distributed.process_group import ensure_process_group
    from verl.distributed.watchdog import Watchdog

    if int(os.environ["GROUP_WORLD_SIZE"]) > 1:  # each torchrun stands for a host: no look-ups in /proc across
        verl.distributed.processes.node_id = lambda: f"host{os.environ['GROUP_RANK']}"

    mode, out, timeout_s, victim = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    ensure_process_group()
    rank = dist.get_rank()
    open(f"{out}/pid{rank}", "w").write(str(os.getpid()))
    watchdog = Watchdog.start(timeout_s)
    start, stages = time.monotonic(), 0
    for step in range(1, 4):
        for name in ("generate", "reward", "log_prob", "update_actor", "weight_sync"):
            with watchdog.stage(name, step=step):
                stages += 1
                dist.all_reduce(torch.ones(1))
                if rank == victim and step == 2:
                    if mode == "raise" and name == "reward":
                        raise ValueError("boom")
                    if mode in ("kill", "stop") and name == "update_actor":
                        open(f"{out}/in_stage", "w").close()  # the test signals this rank now
                        time.sleep(120)
                    if mode == "clean" and name == "generate":
                        time.sleep(1.5 * timeout_s)  # a long stage is no stall: the heartbeat goes on
        if mode == "clean" and step == 1:  # a forked child (a data-loader worker) ended by SIGTERM is no rank
            child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
            child.start()
            child.terminate()  # at once: most often before the child has run a line of Python
            child.join()
        if mode == "clean":
            for _ in range(2000):  # stages cost no store traffic
                with watchdog.stage("noop"):
                    stages += 1
    if mode == "clean" and rank != victim:
        time.sleep(timeout_s + 0.5)  # the victim stops and exits first: no failure
    watchdog.stop()
    json.dump({"beats": watchdog.beats, "stages": stages, "seconds": time.monotonic() - start,
               "interval_s": watchdog.interval_s}, open(f"{out}/rank{rank}.json", "w"))
''')


def launch(mode: str, victim: int, nodes: int, tmp_path: Path) -> list[subprocess.Popen]:
    """The job on 2 ranks: one torchrun with 2 processes, or 2 torchruns ("nodes") with 1 each."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port, procs = free_port(), []
    for node in range(nodes):
        log = open(tmp_path / f"log{node}.txt", "w")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--node_rank={node}",
             f"--nproc_per_node={2 // nodes}", "--master_addr=127.0.0.1", f"--master_port={port}", str(script),
             mode, str(tmp_path), str(TIMEOUT_S), str(victim)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}))
    return procs


def wait_for(path: Path, proc: subprocess.Popen, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert proc.poll() is None, f"the job ended before {path.name} appeared"
        assert time.monotonic() < deadline, f"no {path.name} after {limit_s}s"
        time.sleep(0.05)


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error: ")]


@pytest.fixture
def job(tmp_path):
    """Start the job with ``job(mode, victim, nodes)``; whatever is left of it is killed afterwards."""
    procs = []

    def start(mode: str, victim: int = 1, nodes: int = 1) -> subprocess.Popen:
        procs.extend(launch(mode, victim, nodes, tmp_path))
        return procs[0]  # node 0's torchrun: the one whose output users read

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for pid_file in tmp_path.glob("pid*"):  # the ranks run in sessions of their own
        pid = int(pid_file.read_text())
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break


def run_until_signalled(job, mode: str, sig: signal.Signals, victim: int, tmp_path: Path,
                        nodes: int = 1) -> tuple[int, float, str]:
    """The victim rank reports it is inside 'update_actor' of step 2; send it ``sig``; (exit code,
    seconds from the signal to the job's end, output) of node 0."""
    proc = job(mode, victim, nodes)
    wait_for(tmp_path / "in_stage", proc)
    time.sleep(2.5 * 0.75)  # the heartbeat has carried the stage (interval 0.75 s for a 3 s timeout)
    os.kill(int((tmp_path / f"pid{victim}").read_text()), sig)
    signalled = time.monotonic()
    code = proc.wait(timeout=60)
    return code, time.monotonic() - signalled, (tmp_path / "log0.txt").read_text()


@pytest.mark.slow
def test_a_killed_rank_ends_the_job_at_once_with_one_line_naming_it_and_its_stage(job, tmp_path):
    code, seconds, output = run_until_signalled(job, "kill", signal.SIGKILL, 1, tmp_path)
    assert code != 0
    assert seconds < MARGIN_S, output  # seen in /proc on the same host: no need to wait for the timeout
    lines = error_lines(output)
    assert len(lines) == 1, output
    assert lines[0].startswith(f"error: rank 1 died during stage 'update_actor' (step 2): its process (pid "
                               f"{(tmp_path / 'pid1').read_text()} on "), lines
    assert lines[0].endswith("; the job is stopped")
    assert f"exitcode  : {EXIT_CODE}" in output  # the other rank, stopped by its watchdog


@pytest.mark.slow
def test_a_rank_killed_on_another_host_is_named_by_its_heartbeat_within_the_timeout(job, tmp_path):
    # Rank 0 sees only a broken connection in its all-reduce, and holds it back for the heartbeats.
    code, seconds, output = run_until_signalled(job, "kill", signal.SIGKILL, 1, tmp_path, nodes=2)
    assert code != 0
    assert TIMEOUT_S - 1 < seconds < TIMEOUT_S + MARGIN_S, output
    lines = error_lines(output)
    # On a job of several nodes the line names the rank's node and host.
    assert len(lines) == 1 and re.match(r"error: rank 1 \(node 1 of 2, host [^)]+\) stopped responding during stage "
                                        r"'update_actor' \(step 2\): no heartbeat for ", lines[0]), output
    assert f"exitcode  : {EXIT_CODE}" in output


@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 0])
def test_a_stalled_rank_ends_the_job_within_the_timeout(job, tmp_path, victim):
    code, seconds, output = run_until_signalled(job, "stop", signal.SIGSTOP, victim, tmp_path)
    assert code != 0
    # Its last heartbeat came up to one interval before SIGSTOP; then the timeout, then one interval.
    assert TIMEOUT_S - 1 < seconds < TIMEOUT_S + MARGIN_S, output
    lines = error_lines(output)
    assert len(lines) == 1, output  # printed by rank 0, or by the rank that found rank 0 stalled
    assert lines[0].startswith(f"error: rank {victim} stopped responding during stage 'update_actor' (step 2): no "
                               f"heartbeat for "), lines
    assert lines[0].endswith(" (trainer.dist_timeout_s=3); the job is stopped"), lines
    with pytest.raises(ProcessLookupError):  # the stopped rank was killed, not left behind
        os.kill(int((tmp_path / f"pid{victim}").read_text()), 0)


@pytest.mark.slow
def test_a_sigterm_to_rank_0_alone_ends_the_job_with_one_line_naming_it(job, tmp_path):
    # From a user or a scheduler, not from torchrun: no other rank failed, so rank 0 is the culprit.
    code, seconds, output = run_until_signalled(job, "stop", signal.SIGTERM, 0, tmp_path)
    assert code != 0 and seconds < MARGIN_S, output
    assert error_lines(output) == ["error: rank 0 received SIGTERM during stage 'update_actor' (step 2) (from the "
                                   "launcher, the scheduler or a user); the job is stopped"], output
    assert "exitcode  : 143" in output and f"exitcode  : {EXIT_CODE}" in output, output


@pytest.mark.slow
def test_an_exception_in_rank_1_ends_the_job_at_once_with_its_stage_and_message(job, tmp_path):
    code = job("raise", 1).wait(timeout=120)
    output = (tmp_path / "log0.txt").read_text()
    assert code != 0
    line = "error: rank 1 failed during stage 'reward' (step 2): ValueError: boom; the job is stopped"
    assert error_lines(output) == [line], output
    assert 'raise ValueError("boom")' in output[:output.index(line)]  # rank 1's traceback, then the line
    # Rank 0 was stopped by the watchdog, not by gloo's 30-minute timeout; rank 1 ended with its exception.
    assert f"exitcode  : {EXIT_CODE}" in output and "exitcode  : 1 " in output, output


@pytest.mark.slow
def test_an_exception_in_rank_0_ends_the_job_with_its_traceback_alone(job, tmp_path):
    code = job("raise", 0).wait(timeout=120)
    output = (tmp_path / "log0.txt").read_text()
    assert code != 0
    assert "ValueError: boom" in output and not error_lines(output), output  # rank 0's traceback is the report
    assert f"exitcode  : {EXIT_CODE}" in output and "exitcode  : 1 " in output, output


@pytest.mark.slow
def test_a_clean_run_ends_with_exit_0_and_heartbeats_do_not_grow_with_stages(job, tmp_path):
    code = job("clean").wait(timeout=120)
    output = (tmp_path / "log0.txt").read_text()
    assert code == 0, output
    assert not error_lines(output) and "Traceback" not in output, output
    for rank in range(2):
        stats = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert stats["stages"] == 15 + 6000
        # one heartbeat per interval (plus the first and the last), whatever the number of stages
        assert 2 <= stats["beats"] <= stats["seconds"] / stats["interval_s"] + 3, stats
