"""``trainer.backend=ray``: the driver runs ``fit()``, the roles are Ray actors on resource pools.

On 2 CPU ranks the run trains exactly as one process does (and so as torchrun does, which
tests/integration/test_torchrun_rl.py holds equal to one process): same per-step metrics, same
final weights, for GRPO and for PPO with a critic, colocated or on a pool of its own. Checkpoints
cross between Ray and a plain process both ways. A lost actor ends the run with one error naming
role, rank and stage; a hung one within trainer.dist_timeout_s; Ctrl-C on the driver stops every
actor. Without Ray installed, everything else runs and backend=ray says how to install it.

The runs here connect to one Ray head started for the module (a running cluster, found through
``RAY_ADDRESS``): a Ray of their own would cost each run about 6 s more (and far more on a busy
machine). A driver that starts its own local Ray runs in test_distributed_doc.py (docs/distributed.md)
and in the stale-address test below.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agent_models import SCALE_OUT_KEYS, tool_task_args
from helpers import REPO, free_port, ray_cluster
from zygote import ray_worker_keys, run_module
from rl_compare import (GRPO, PPO, assert_resumes_across, assert_same_metrics, assert_same_weights,
                        run_args, run_plain, runs_once_per_keys, step_metrics, without_async)

pytest.importorskip("ray", reason="the ray extra (bash scripts/setup.sh --test installs it)")
pytestmark = pytest.mark.slow

RAY2 = ["trainer.backend=ray", "trainer.n_gpus_per_node=2"]
# A local Ray on a 2-core machine without network or accounts: no auth token, no usage stats.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module", autouse=True)
def _cluster(tmp_path_factory):
    with ray_cluster(tmp_path_factory.mktemp("ray-head"), env=RAY_ENV) as address:
        yield address


@pytest.fixture(scope="module")
def tiny_model_dir(rl_inputs):
    return rl_inputs[0]


@pytest.fixture(scope="module")
def data_dir(rl_inputs):
    return rl_inputs[1]


@pytest.fixture(scope="module")
def ray_run(tiny_model_dir, data_dir, tmp_path_factory):
    """``ray_run(*keys)``: ``(output folder, driver's stderr)`` of the small RL run under Ray with
    ``keys``, run once for the module (the comparisons and the checkpoint crossing share them)."""
    return runs_once_per_keys(lambda args: _ray(args + RAY2, env={"VERL_LOG_LEVEL": "INFO"}), tiny_model_dir,
                              data_dir, tmp_path_factory, "ray")


def _driver(args, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *args, *ray_worker_keys()], cwd=REPO,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **RAY_ENV},
                            **popen)


def _ray(args, env=None) -> subprocess.CompletedProcess:
    done = run_module("verl.trainer.main_ppo", [*args, *ray_worker_keys()], env={**RAY_ENV, **(env or {})})
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _hosts() -> list[int]:
    """Pids of live RoleHost actors (Ray names the process after the actor class)."""
    found = subprocess.run(["pgrep", "-f", "ray::RoleHost"], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found]


@pytest.mark.parametrize("algorithm,pools", [
    (GRPO, []),
    # one mini-batch: the update is on-policy (no old-log-prob pass), so the reference log-probs are
    # read by the actor's loss alone and stay on the workers
    (GRPO + ["actor_rollout_ref.actor.ppo_mini_batch_size=4"], []),
    (PPO, []),
    # the critic on a 1-rank pool of its own, next to the 2-rank global pool: 3 actors
    (PPO, ["+trainer.resource_pools.critic_pool=[1]", "+trainer.role_pools.critic=critic_pool"]),
], ids=["grpo", "grpo_ref_stays_on_workers", "ppo_critic_colocated", "ppo_critic_own_pool"])
def test_ray_trains_exactly_like_one_process(tiny_model_dir, plain_run, ray_run, algorithm, pools):
    one, (ray, stderr) = plain_run(*algorithm), ray_run(*algorithm, *pools)
    # The dispatches went to the pools: the actor's 2 ranks, the critic's 1 or 2
    assert "ray x2 actor_rollout_ref.update_actor" in stderr
    if algorithm is PPO:
        assert f"ray x{1 if pools else 2} critic.update" in stderr
    ref_calls = [line for line in stderr.splitlines() if "actor_rollout_ref.compute_ref_log_prob:" in line]
    assert ref_calls
    on_policy = "actor_rollout_ref.actor.ppo_mini_batch_size=4" in algorithm
    for line in ref_calls:  # what came back to the driver: the reference log-probs, or nothing
        assert ("ref_log_prob" not in line.split("->")[1]) == on_policy, line

    metrics = step_metrics(one)
    # a real signal to compare (an on-policy update has a ratio of exactly 1 at its only mini-batch)
    assert metrics[1]["critic/advantages/max"] > 0 and (metrics[1]["actor/ppo_kl"] != 0 or on_policy)
    assert_same_metrics(metrics, step_metrics(ray))
    assert_same_weights(one / "huggingface", ray / "huggingface", tiny_model_dir)
    # Bytes crossed between the driver and the actors, counted each step; none in one process.
    ray_rows = step_metrics(ray)
    for step in (1, 2, 3):
        assert ray_rows[step]["perf/bytes_to_workers"] > 0 and ray_rows[step]["perf/bytes_from_workers"] > 0
        assert metrics[step]["perf/bytes_to_workers"] == 0 == metrics[step]["perf/bytes_from_workers"]
    _assert_no_hosts_left()  # the actors ended with the run


def test_an_asynchronous_run_on_ray_at_bound_zero_trains_exactly_like_one_process(tiny_model_dir, data_dir,
                                                                                  plain_run, tmp_path):
    # The driver feeds the rollout process; the actors' weights reach it through the driver.
    out = tmp_path / "async"
    done = _ray(run_args(tiny_model_dir, data_dir, out, *GRPO, *RAY2, "async_training.enable=true"))
    assert "ahead of the trainer by at most 0 step(s)" in done.stdout
    assert_same_metrics(step_metrics(plain_run(*GRPO)), without_async(step_metrics(out)))
    assert_same_weights(plain_run(*GRPO) / "huggingface", out / "huggingface", tiny_model_dir)
    _assert_no_hosts_left()


def test_rollout_actors_of_a_pool_of_their_own_train_exactly_like_one_process(tiny_model_dir, data_dir, plain_run,
                                                                               tmp_path):
    # rollout_placement=ranks under Ray: two rollout actors (rollout.n_gpus_per_node) beside the 2-rank global
    # pool, reached by the driver over sockets, the weights by broadcast. They validate too (the actors of the
    # global pool hold no engine).
    out = tmp_path / "rollout-pool"
    done = _ray(run_args(tiny_model_dir, data_dir, out, *GRPO, *RAY2, "async_training.enable=true",
                         "async_training.rollout_placement=ranks", "rollout.n_gpus_per_node=2",
                         "async_training.use_trainer_do_validate=false"))
    assert "the rollout runs in 2 Ray actor(s) of a pool of its own" in done.stdout and "through broadcast" in done.stdout
    assert "validation: on the rollout" in done.stdout
    assert_same_metrics(step_metrics(plain_run(*GRPO)), without_async(step_metrics(out)))
    assert_same_weights(plain_run(*GRPO) / "huggingface", out / "huggingface", tiny_model_dir)
    _assert_no_hosts_left()
    assert not subprocess.run(["pgrep", "-f", "ray::RolloutHost"], capture_output=True, text=True).stdout.split()


def test_multi_turn_trains_on_two_ray_actors_exactly_like_one_process(tool_run, tmp_path):
    """Tool calls under Ray: the agent loop runs in each actor for its rows (test_agent_scale_out.py:
    the same run under torchrun)."""
    model_dir, task, one = tool_run
    _ray(tool_task_args(model_dir, task, tmp_path / "out", *SCALE_OUT_KEYS, *RAY2))
    assert_same_metrics(step_metrics(one), step_metrics(tmp_path / "out"))
    assert_same_weights(one / "huggingface", tmp_path / "out" / "huggingface", model_dir)
    _assert_no_hosts_left()


def test_a_reward_model_on_its_own_pool_scores_as_in_one_process(tiny_model_dir, data_dir, tmp_path):
    """verl's reward_model.enable_resource_pool: the reward model (and the rule functions beside it) on
    a 1-rank reward_pool next to the 2-rank global pool; the scores equal those of one process."""
    from verl.models.tiny import make_tiny_reward_model_folder

    rm_dir = make_tiny_reward_model_folder(tmp_path / "rm")
    rm = ["reward_model.enable=true", f"reward_model.model.path={rm_dir}", "reward_model.weight=0.5",
          "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.val_before_train=false"]
    one, ray = tmp_path / "one", tmp_path / "ray"
    run_plain(run_args(tiny_model_dir, data_dir, one, *GRPO, *rm))
    done = _ray(run_args(tiny_model_dir, data_dir, ray, *GRPO, *rm, *RAY2, "reward_model.enable_resource_pool=true",
                         "reward_model.n_gpus_per_node=1", "reward_model.nnodes=1"), env={"VERL_LOG_LEVEL": "INFO"})
    assert "ray x1 reward.score" in done.stderr
    metrics = step_metrics(one)
    assert metrics[1]["reward_extra/rm_score/mean"] != 0
    assert_same_metrics(metrics, step_metrics(ray))


def test_a_checkpoint_crosses_between_ray_and_one_process(tiny_model_dir, data_dir, tmp_path, plain_run, ray_run):
    """The step-2 checkpoint of the Ray run resumes in one process, and the one-process run's under Ray."""
    reference = plain_run(*GRPO)
    resume_under_ray = lambda args: _ray(args + RAY2)  # noqa: E731
    assert_resumes_across(tiny_model_dir, data_dir, tmp_path, reference,
                          [(ray_run(*GRPO)[0], run_plain, "ray_then_one"), (reference, resume_under_ray, "one_then_ray")])


def _wait_for_hosts(proc: subprocess.Popen, n: int, before: set[int], timeout: float = 120) -> list[int]:
    """The pids of ``proc``'s RoleHost actors: the ones not alive before it started (``before``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        hosts = [pid for pid in _hosts() if pid not in before]
        if len(hosts) >= n:
            return hosts
        time.sleep(0.5)
    raise AssertionError("the Ray actors did not start")


def _wait_for_first_step(proc: subprocess.Popen, out, timeout: float = 300) -> None:
    """Until the run has logged its first training step (its models are built and it is training)."""
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        if metrics.exists() and any('"step": 1' in line for line in metrics.read_text().splitlines()):
            return
        time.sleep(0.5)
    raise AssertionError("the run logged no training step")


def _assert_no_hosts_left(within: float = 30) -> None:
    """Every RoleHost ends with its run: the cluster kills a finished job's actors within seconds."""
    deadline = time.monotonic() + within
    while _hosts() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _hosts(), "RoleHost actors outlived their run"


def _long_run(tiny_model_dir, data_dir, out, *extra):
    return run_args(tiny_model_dir, data_dir, out, "trainer.total_training_steps=200", "trainer.test_freq=-1",
                    "trainer.val_before_train=false", "trainer.save_freq=1000", *RAY2, *extra)


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_lost_actor_ends_the_run_with_role_rank_and_stage(tiny_model_dir, data_dir, tmp_path, how):
    timeout_s = 20
    before = set(_hosts())
    proc = _driver(_long_run(tiny_model_dir, data_dir, tmp_path / how, f"trainer.dist_timeout_s={timeout_s}"))
    try:
        hosts = _wait_for_hosts(proc, 2, before)
        _wait_for_first_step(proc, tmp_path / how)  # into the training steps
        victim = max(hosts)
        os.kill(victim, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        start = time.monotonic()
        _, err = proc.communicate(timeout=timeout_s + 60)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
        if how == "hung":
            for pid in _hosts():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    assert proc.returncode == 2, err[-3000:]
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error) == 1, err[-3000:]
    assert "actor_rollout_ref rank" in error[0] and "actor_rollout_ref." in error[0]  # role, rank, stage
    if how == "killed":
        assert "was lost" in error[0] and "died" in error[0]
    else:
        assert f"trainer.dist_timeout_s={timeout_s}" in error[0] and "did not finish" in error[0]
    assert "Traceback" not in err
    assert took < timeout_s + 45  # bounded by the timeout, not a hang (generous: a busy machine)
    _assert_no_hosts_left()


def test_a_lost_rollout_actor_ends_the_run_with_one_line_naming_it(tiny_model_dir, data_dir, tmp_path):
    proc = _driver(_long_run(tiny_model_dir, data_dir, tmp_path / "out", "trainer.dist_timeout_s=30",
                             "async_training.enable=true", "async_training.max_staleness=1",
                             "async_training.rollout_placement=ranks"))
    try:
        _wait_for_first_step(proc, tmp_path / "out")
        (victim,) = [int(p) for p in subprocess.run(["pgrep", "-f", "ray::RolloutHost"], capture_output=True,
                                                   text=True).stdout.split()]
        os.kill(victim, signal.SIGKILL)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, err[-3000:]
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and f"the rollout on Ray actor 1 of 1 (pid {victim} on " in error[0] and \
        "closed its connection (it died or left the job) while generating step" in error[0], err[-3000:]
    _assert_no_hosts_left()


def test_ctrl_c_on_the_driver_saves_and_stops_every_actor(tiny_model_dir, data_dir, tmp_path):
    out = tmp_path / "interrupted"
    before = set(_hosts())
    proc = _driver(_long_run(tiny_model_dir, data_dir, out), start_new_session=True)
    try:
        _wait_for_hosts(proc, 2, before)
        _wait_for_first_step(proc, out)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the driver's whole process group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    saved = sorted(out.glob("global_step_*"))
    assert len(saved) == 1 and (saved[0] / "state.pt").exists()  # the step it stopped at, saved
    _assert_no_hosts_left()


def test_a_stale_cluster_address_starts_a_local_ray_at_once(tiny_model_dir, data_dir, tmp_path, monkeypatch):
    """A cluster that ended without `ray stop` (killed, a reboot) leaves its address in Ray's temp
    folder, where a plain ray.init() waits for it (more than 5 minutes, silently): the run says so and
    starts a Ray of its own."""
    monkeypatch.delenv("RAY_ADDRESS")
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: Ray's socket paths live below it
    try:
        port = free_port()
        (temp / "ray").mkdir()
        (temp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}")
        done = _ray(run_args(tiny_model_dir, data_dir, tmp_path / "out", "trainer.total_training_steps=1",
                             "trainer.val_before_train=false", "trainer.test_freq=-1", *RAY2),
                    env={"RAY_TMPDIR": str(temp)})
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert f"the Ray cluster last started on this machine (127.0.0.1:{port}) does not answer; starting a local " \
           f"Ray" in done.stderr, done.stderr[-3000:]
    assert (tmp_path / "out" / "huggingface" / "model.safetensors").exists()


def test_without_ray_backend_ray_names_the_install_and_plain_runs_work(tiny_model_dir, data_dir, tmp_path):
    """Ray hidden from the interpreter (as on a machine without it): backend=ray is one error line
    with the install command; the default backend does not need Ray."""
    hide_ray = ("import sys; sys.modules['ray'] = None; from verl.trainer.main_ppo import main; "
                "sys.exit(main(sys.argv[1:]))")
    base = run_args(tiny_model_dir, data_dir, tmp_path / "no-ray", "trainer.total_training_steps=1",
                    "trainer.val_before_train=false", "trainer.test_freq=-1")
    env = {**os.environ, **RAY_ENV}
    done = subprocess.run([sys.executable, "-c", hide_ray, *base, *RAY2], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 2
    assert "error: trainer.backend=ray needs Ray" in done.stderr and "pip install" in done.stderr
    done = subprocess.run([sys.executable, "-c", hide_ray, *base], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "no-ray" / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1


def test_a_pool_the_cluster_cannot_hold_is_refused_within_the_timeout(tiny_model_dir, data_dir, tmp_path):
    """2 nodes x 3 ranks, each node's ranks packed on one machine, on a one-node cluster of 4 CPUs."""
    done = run_module("verl.trainer.main_ppo",
                      run_args(tiny_model_dir, data_dir, tmp_path / "out", "trainer.backend=ray", "trainer.nnodes=2",
                               "trainer.n_gpus_per_node=3", "data.train_batch_size=6",
                               "actor_rollout_ref.actor.ppo_mini_batch_size=3", "trainer.dist_timeout_s=3"),
                      env=RAY_ENV, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and ("Ray could not reserve the resource pool global_pool (3 x {'CPU': 1} + 3 x {'CPU': 1}, "
                                 "roles actor_rollout_ref) within trainer.dist_timeout_s=3 s") in errors[0], errors
    assert "on 1 node. Lower trainer.n_gpus_per_node / nnodes" in errors[0]
    _assert_no_hosts_left()
