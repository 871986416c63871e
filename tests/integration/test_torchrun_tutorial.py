"""The tutorial's section 5 as written, under torchrun: ``examples/distributed/ppo_step.py`` (a
``PPOTrainer.step`` loop with ``fsdp_size=-1``) gives the same losses on 2 CPU ranks as in one
process, and only rank 0 prints."""

import os
import re
import subprocess
import sys

import pytest

from helpers import REPO

pytestmark = pytest.mark.slow
SCRIPT = REPO / "examples" / "distributed" / "ppo_step.py"
LINE = re.compile(r"step (\d): policy_loss (\S+) value_loss (\S+) grad_norm (\S+)")


def _run(launcher: list[str], folder, cwd) -> str:
    done = subprocess.run([sys.executable, *launcher, str(SCRIPT), str(folder)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "view tensor" not in done.stderr  # OPT's blocks are made safe for FSDP's backward hooks
    return done.stdout


def _losses(output: str) -> list[tuple[float, ...]]:
    return [tuple(float(x) for x in m.groups()) for m in LINE.finditer(output)]


def test_the_ppo_step_example_gives_one_process_losses_on_two_ranks(tmp_path):
    single = _losses(_run([], tmp_path / "tiny-opt", tmp_path))
    double = _losses(_run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"],
                          tmp_path / "tiny-opt-2", tmp_path))
    assert len(single) == 2 and len(double) == 2  # two steps, printed once (by rank 0)
    for a, b in zip(single, double):
        assert b == pytest.approx(a, rel=1e-5, abs=1e-6)
