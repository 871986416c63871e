"""Shared pieces of the integration tests: running a document's code blocks, capturing a gradient, a
Ray cluster for a module's runs."""

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zygote

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port of localhost that nothing listens on (free when asked)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def code_blocks(markdown: str) -> list[tuple[str, str]]:
    """``(kind, code)`` of every ```python and ```bash block, in order."""
    return re.findall(r"```(python|bash)\n(.*?)```", markdown, flags=re.S)


def run_bash(block: str, cwd: Path) -> None:
    """Run a shell block with this interpreter as ``python`` / ``.venv/bin/python`` / ``torchrun`` and the
    checkout importable; its Python commands start as forks of the tests' zygote (zygote.py).

    One thread, as in the test process: two threads per process crawl on a busy 2-core machine.
    """
    folder = zygote.launchers()
    python = folder / "python" if folder is not None else Path(sys.executable)
    script = block.replace(".venv/bin/python", str(python))
    path = os.pathsep.join(str(p) for p in (folder, Path(sys.executable).parent, os.environ["PATH"]) if p is not None)
    env = zygote.base_env({"PATH": path})
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, f"{block}\n--- stdout\n{done.stdout[-2000:]}\n--- stderr\n{done.stderr[-3000:]}"


def run_document(doc: Path, cwd: Path, *, min_blocks: int = 10, bash_cwd=None) -> dict:
    """Run every code block of ``doc`` in order: python blocks share one namespace, bash blocks run in
    ``bash_cwd(block)`` (default ``cwd``). Returns the python namespace."""
    blocks = code_blocks(doc.read_text())
    assert len(blocks) >= min_blocks, f"{doc.name} lost its code blocks"
    namespace: dict = {"__name__": f"__{doc.stem}__"}
    root_level = logging.getLogger().level
    try:
        for kind, block in blocks:
            if kind == "python":
                exec(compile(block, f"{doc.name}:block", "exec"), namespace)
            else:
                run_bash(block, bash_cwd(block) if bash_cwd else cwd)
    finally:
        logging.getLogger().setLevel(root_level)
    return namespace


def run_torchrun(script: str, *args, tmp_path: Path, nproc: int = 2) -> None:
    """Run ``script`` (python source) on ``nproc`` CPU ranks with torchrun, the checkout importable."""
    path = tmp_path / "rank.py"
    # Each rank ends through leave_job, as the project's own entry points do: torch 2.13 with gloo
    # otherwise aborts now and then at interpreter exit, after all the work ("terminate called
    # without an active exception"). An error in the script still raises before it.
    path.write_text(script + "\n\nfrom verl.distributed.process_group import leave_job\n\nleave_job(0)\n")
    done = zygote.run_torchrun(["--standalone", f"--nproc_per_node={nproc}", path, *args])
    assert done.returncode == 0, done.stderr[-4000:]


def run_torchrun_module(module: str, args: list[str], *, nproc: int = 2, env: dict | None = None,
                        timeout: float = 600) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=nproc -m module args`` on CPU ranks (gloo), from the checkout, the ranks
    forks of the tests' zygote; returns the finished process (output captured) whatever its exit code."""
    return zygote.run_torchrun(["--standalone", f"--nproc_per_node={nproc}", "-m", module, *args], env=env,
                               timeout=timeout)


def gradient_of_one_step(trainer) -> tuple[float, dict]:
    """An offline trainer's reported step loss and the accumulated gradient its optimiser is about to apply."""
    grads, optimizer_step = {}, trainer.policy.optimizer_step

    def capture():
        for name, param in trainer.policy.model.named_parameters():
            grad = param.grad  # a DTensor under FSDP (several ranks); one process keeps its model plain
            grads[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).clone()
        return optimizer_step()

    trainer.policy.optimizer_step = capture
    return trainer.step(next(trainer.train_loader))["train/loss"], grads


def echo_launch(model_dir, tmp_path: Path, reward_source: str, *, steps: int = 2, n: int = 3, mini_batch: int = 2,
                lr: str = "1e-3", response_length: int = 4) -> list[str]:
    """The overrides of a short ``main_ppo`` run on the tiny model: 16 "say <digit>:" prompts, the
    reward function ``reward_source`` (a python file's text, defining compute_score), 4 prompts per
    step, output under ``tmp_path / "out"``. Append a test's own overrides after these (later wins)."""
    from verl.data import write_parquet

    rows = [{"prompt": [{"role": "user", "content": f"say {i % 10}:"}], "data_source": "echo",
             "reward_model": {"style": "rule", "ground_truth": str(i % 10)}} for i in range(16)]
    tmp_path.mkdir(parents=True, exist_ok=True)
    train = write_parquet(rows, tmp_path / "train.parquet")
    reward = tmp_path / "reward.py"
    reward.write_text(reward_source)
    return [f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={train}",
            f"custom_reward_function.path={reward}", "data.train_batch_size=4", "data.max_prompt_length=16",
            f"data.max_response_length={response_length}", f"actor_rollout_ref.rollout.n={n}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch}", f"actor_rollout_ref.actor.optim.lr={lr}",
            f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={tmp_path / 'out'}",
            "trainer.progress_bar=false", "trainer.val_before_train=false",
            "trainer.write_report=false"]  # the report's tests ask for it


@contextlib.contextmanager
def ray_cluster(tmp_path: Path, *, num_cpus: int = 4, env: dict | None = None, more_nodes: tuple[int, ...] = ()):
    """A local Ray head node for the block, its address in ``RAY_ADDRESS`` meanwhile: drivers started
    inside connect to it instead of starting a Ray of their own (about 6 s saved per run on 2 cores).
    ``more_nodes``: the CPUs of each further node (``ray start --address``: a cluster of several nodes
    on this machine); yields ``(address, [their ray start processes])`` then, else the address.
    Stopped on exit by signalling each ``ray start --block`` alone (``ray stop`` would stop every Ray of
    this user). Its files are in a temp folder of its own, so that it leaves no address behind in
    /tmp/ray, where a later plain ``ray.init()`` would look for a cluster to join."""
    port = free_port()
    ray = Path(sys.executable).parent / "ray"
    # (short: Ray's socket paths live below it, and a socket path has at most 107 characters)
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    common = ["--block", f"--temp-dir={temp}", "--disable-usage-stats"]
    nodes = []
    try:
        nodes.append(_ray_start(tmp_path / "ray-head.log", env, [str(ray), "start", "--head", f"--port={port}",
                                                                 f"--num-cpus={num_cpus}", "--include-dashboard=false",
                                                                 *common]))
        for i, cpus in enumerate(more_nodes, 1):
            nodes.append(_ray_start(tmp_path / f"ray-node{i}.log", env, [str(ray), "start", f"--address=127.0.0.1:{port}",
                                                                         f"--num-cpus={cpus}", *common]))
        previous = os.environ.get("RAY_ADDRESS")
        os.environ["RAY_ADDRESS"] = f"127.0.0.1:{port}"
        try:
            yield (os.environ["RAY_ADDRESS"], nodes[1:]) if more_nodes else os.environ["RAY_ADDRESS"]
        finally:
            if previous is None:
                os.environ.pop("RAY_ADDRESS")
            else:
                os.environ["RAY_ADDRESS"] = previous
    finally:
        for node in reversed(nodes):
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
        shutil.rmtree(temp, ignore_errors=True)


def _ray_start(log: Path, env: dict | None, command: list[str]) -> subprocess.Popen:
    """``ray start ... --block``, once its node runs."""
    with open(log, "w") as out:
        node = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                start_new_session=True)
    deadline = time.monotonic() + 120
    while "Ray runtime started" not in log.read_text():
        if node.poll() is not None or time.monotonic() > deadline:
            node.kill()
            raise AssertionError(log.read_text()[-3000:])
        time.sleep(0.2)
    return node
