"""Several machines, rehearsed on one: two torchrun launchers joined by a c10d rendezvous on localhost
are two "nodes" (``--nnodes=2 --nproc_per_node=1``), and a Ray cluster of a head and a second
``ray start --address`` node (one CPU each) puts one rank on each node.

- Two torchrun nodes train exactly as one process (metrics and weights).
- Losing a node mid-run (its launcher and rank killed, or its launcher alone) ends the job within
  ``trainer.dist_timeout_s`` with one line naming the rank, its node and the stage; the checkpoints
  written before are intact and the job resumes from the last one in one process.
- Losing a Ray node (its raylet killed) ends the run with one line naming role, rank, node and stage;
  the run resumes on the node that remains.
(docs/distributed.md runs the same launches as blocks: test_distributed_doc.)"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, free_port
from rl_compare import (GRPO, assert_same_metrics, assert_same_weights, run_args, run_plain, step_metrics)

pytestmark = pytest.mark.slow
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _children(pid: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
        except (OSError, IndexError):
            continue
    return found


def _rank_of(pid: int) -> int | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [int(v[5:]) for v in environ if v.startswith(b"RANK=")]
    return ranks[0] if ranks else None


def _two_nodes(args: list[str], port: int) -> list[subprocess.Popen]:
    """Two torchrun launchers ("node 0" first, so that it hosts the rendezvous), each with one rank."""
    def launcher():
        return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
                                 "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=rehearsal",
                                 "-m", "verl.trainer.main_ppo", *args], cwd=REPO, env=ENV, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    first = launcher()
    deadline = time.monotonic() + 60
    while subprocess.run(["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"], capture_output=True).returncode:
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0][-3000:]
        time.sleep(0.1)
    return [first, launcher()]


def _stop(launchers) -> None:
    for launcher in launchers:
        if launcher.poll() is None:
            for pid in [launcher.pid, *_children(launcher.pid)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            launcher.wait()


def test_two_torchrun_nodes_train_exactly_like_one_process(rl_inputs, plain_run, tmp_path):
    model, data = rl_inputs
    out = tmp_path / "two-nodes"
    launchers = _two_nodes(run_args(model, data, out, *GRPO), free_port())
    try:
        outputs = [launcher.communicate(timeout=300)[0] for launcher in launchers]
    finally:
        _stop(launchers)
    assert [launcher.returncode for launcher in launchers] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    one = plain_run(*GRPO)
    assert_same_metrics(step_metrics(one), step_metrics(out))
    assert_same_weights(one / "huggingface", out / "huggingface", model)


@pytest.mark.parametrize("lost", ["node", "launcher"])
def test_a_lost_node_ends_the_job_with_one_line_and_it_resumes_on_one(rl_inputs, tmp_path, lost):
    """``node``: node 1's launcher and rank are killed (the machine is gone); ``launcher``: its torchrun
    alone (the rank, orphaned, must not carry on as if nothing happened)."""
    model, data = rl_inputs
    out, timeout_s = tmp_path / "out", 4
    quick = ["trainer.test_freq=-1", "trainer.val_before_train=false"]  # run_args saves every 2 steps
    launchers = _two_nodes(run_args(model, data, out, "trainer.total_training_steps=100000", *quick,
                                    f"trainer.dist_timeout_s={timeout_s}"), free_port())
    try:
        deadline = time.monotonic() + 180
        while not (out / "global_step_4").exists():
            assert all(p.poll() is None for p in launchers) and time.monotonic() < deadline, "no step 4"
            time.sleep(0.1)
        ranks = {_rank_of(child): launcher for launcher in launchers for child in _children(launcher.pid)}
        victim = ranks[1]  # the launcher of node 1 (group rank 1 holds rank 1)
        for pid in [victim.pid, *(_children(victim.pid) if lost == "node" else [])]:
            os.kill(pid, signal.SIGKILL)
        hit = time.monotonic()
        survivor = ranks[0]
        output = survivor.communicate(timeout=timeout_s + 60)[0]
        took = time.monotonic() - hit
    finally:
        _stop(launchers)
    assert survivor.returncode != 0
    assert took < timeout_s + 30, took  # within the watchdog's timeout (generous: a busy machine), no hang
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output[-3000:]
    what = "died" if lost == "node" else "lost its launcher"
    # The kill lands inside a stage or, rarely, between two (the rank's last report then names the stage it left).
    assert re.match(rf"error: rank 1 \(node 1 of 2, host [^)]+\) {what} (during stage '[a-z_.]+' \(step \d+\)|"
                    rf"after stage '[a-z_.]+' \(step \d+\), between stages)", errors[0]), errors[0]
    # Every checkpoint written before is whole; the same command in one process resumes from the last.
    saved = sorted(int(p.name.rsplit("_", 1)[1]) for p in out.glob("global_step_*"))
    assert saved[-1] >= 4 and all((out / f"global_step_{s}" / "state.pt").exists() for s in saved)
    if lost == "node":
        resumed = run_plain(run_args(model, data, out, f"trainer.total_training_steps={saved[-1] + 1}", *quick))
        assert f"Resumed from {out / f'global_step_{saved[-1]}'}" in resumed.stdout, resumed.stdout[-2000:]
        assert max(step_metrics(out)) == saved[-1] + 1
