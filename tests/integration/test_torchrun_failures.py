"""A rank of ``torchrun -m verl.trainer.main_ppo`` that dies or stalls mid-step ends the whole job
within ``trainer.dist_timeout_s``, with one line naming the rank and the stage; never a silent hang."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO
from rl_compare import make_data_dir, run_args

pytestmark = pytest.mark.slow
TIMEOUT_S = 4


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_data_dir(tmp_path_factory.mktemp("torchrun-failure-data"))


def _rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of the torchrun worker with ``RANK=rank`` under the launcher process."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if parent == launcher and f"RANK={rank}".encode() in environ:
            return int(entry)
    return None


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_lost_rank_ends_the_job_with_one_line_naming_it(tiny_model_dir, data_dir, tmp_path, how):
    out = tmp_path / "out"
    args = run_args(tiny_model_dir, data_dir, out, "trainer.total_training_steps=100000", "trainer.test_freq=-1",
                 "trainer.val_before_train=false", "trainer.save_freq=-1", f"trainer.dist_timeout_s={TIMEOUT_S}")
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                            "-m", "verl.trainer.main_ppo", *args], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True,
                           env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    victim = None
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").exists() or len((out / "metrics.jsonl").read_text().splitlines()) < 3:
            assert job.poll() is None and time.monotonic() < deadline, "the job did not start training"
            time.sleep(0.2)
        victim = _rank_pid(job.pid, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        hit = time.monotonic()
        output, _ = job.communicate(timeout=TIMEOUT_S + 60)
        ended_after = time.monotonic() - hit
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        if victim is not None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(victim, sig)
                except ProcessLookupError:
                    pass
    assert job.returncode != 0
    assert ended_after < TIMEOUT_S + 30, ended_after  # not the collectives' own timeout, and no hang
    errors = [line for line in output.splitlines() if line.startswith("error: rank 1")]
    assert len(errors) == 1, output[-3000:]
    what = "died" if how == "kill" else "stopped responding"
    # The signal lands inside a stage or, now and then, between two (the rank's last report then names the stage it
    # left: "after stage 'train_step' (step 3), between stages"); both are right.
    assert re.match(rf"error: rank 1 {what} (during stage '[a-z_.]+' \(step \d+\)|after stage '[a-z_.]+' \(step \d+\), "
                    rf"between stages)", errors[0]) and errors[0].endswith("the job is stopped"), errors[0]
