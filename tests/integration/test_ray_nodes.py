"""A Ray cluster of two nodes on this machine (a head and a second ``ray start --address``, one CPU
each): ``trainer.nnodes=2`` puts one rank on each node and says so at start; losing the second node
mid-run (its raylet killed, as when its machine goes away) ends the run with one line naming the
role, rank, node and stage, once Ray has settled the node's death (until then, the steps equal one
process's); every checkpoint written before
is intact, and the same run resumes on the node that remains (``trainer.nnodes=1``).
(A two-node cluster training like one process: docs/distributed.md's cluster block, run by
test_distributed_doc; two torchrun "nodes": test_multinode.)"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, ray_cluster
from rl_compare import GRPO, assert_same_metrics, run_args, step_metrics
from zygote import ray_worker_keys, run_module

pytest.importorskip("ray", reason="the ray extra (bash scripts/setup.sh --test installs it)")
pytestmark = pytest.mark.slow

ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": str(REPO)}


def _raylet_of(node: subprocess.Popen) -> int:
    """The pid of the raylet that ``ray start --block`` (``node``) started."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if stat.split(" (", 1)[1].startswith("raylet)") and int(stat.rsplit(")", 1)[1].split()[1]) == node.pid:
            return int(entry)
    raise AssertionError("no raylet under the second node's ray start")


def _driver(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**ENV, **os.environ})


def test_a_lost_ray_node_ends_the_run_with_one_line_and_it_resumes_on_the_other(rl_inputs, plain_run, tmp_path):
    model, data = rl_inputs
    out, timeout_s = tmp_path / "out", 40
    quick = [*GRPO, "trainer.backend=ray", "trainer.n_gpus_per_node=1", "trainer.test_freq=-1",
             "trainer.val_before_train=false", *ray_worker_keys()]  # run_args saves every 2 steps
    with ray_cluster(tmp_path, num_cpus=1, more_nodes=(1,), env=ENV) as (_, (second,)):
        proc = _driver(run_args(model, data, out, *quick, "trainer.nnodes=2", "trainer.total_training_steps=100000",
                                f"trainer.dist_timeout_s={timeout_s}"))
        try:
            deadline = time.monotonic() + 240
            while not (out / "global_step_2").exists():
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
                time.sleep(0.1)
            os.kill(_raylet_of(second), signal.SIGKILL)
            hit = time.monotonic()
            stdout, stderr = proc.communicate(timeout=timeout_s + 60)
            took = time.monotonic() - hit
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 2, stderr[-3000:]
        assert took < timeout_s + 20, took
        assert re.search(r"Ray pool global_pool \(actor_rollout_ref\): 2 ranks on 2 nodes \(node [0-9a-f]{8} at "
                         r"[\d.]+: rank 0; node [0-9a-f]{8} at [\d.]+: rank 1\)", stdout), stdout[-2000:]
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, stderr[-3000:]
        assert re.match(r"error: actor_rollout_ref rank [01] \(Ray pool global_pool, node [0-9a-f]{8} at [\d.]+, "
                        r"pid \d+\) during actor_rollout_ref\.\w+ was lost: its node left the cluster", errors[0]), \
            errors[0]
        assert "Traceback" not in stderr
        # Before the loss, the two nodes trained as one process does (the same first steps).
        one, two = step_metrics(plain_run(*GRPO)), step_metrics(out)
        assert one[1]["critic/advantages/max"] > 0
        assert_same_metrics({s: one[s] for s in (1, 2)}, {s: two[s] for s in (1, 2)})
        saved = sorted(int(p.name.rsplit("_", 1)[1]) for p in out.glob("global_step_*"))
        assert saved[-1] >= 2 and all((out / f"global_step_{s}" / "state.pt").exists() for s in saved)
        # The same run on the node that remains resumes from the last checkpoint.
        resumed = run_module("verl.trainer.main_ppo", run_args(model, data, out, *quick, "trainer.nnodes=1",
                                                                f"trainer.total_training_steps={saved[-1] + 1}"),
                             env={**ENV, **os.environ}, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"Resumed from {out / f'global_step_{saved[-1]}'}" in resumed.stdout
        assert max(step_metrics(out)) == saved[-1] + 1
