import hashlib
import os

import pytest


def _run_folder(tmp_path_factory):
    """The test run's temporary folder, common to the pytest-xdist workers."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # .../pytest-N/popen-gwK


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every integration test shares one fresh cache (built-in model, task data, warm start); under
    pytest-xdist the workers share it too (the warm start is trained once, under a lock)."""
    monkeypatch.setenv("VERL_CACHE_DIR", str(_run_folder(tmp_path_factory) / "verl-cache"))


def _built_once(folder, build):
    """``folder``, made by ``build(folder)`` the first time any worker asks (under a lock)."""
    from verl.utils.cache import cache_lock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with cache_lock(folder):
        if not (folder / ".done").exists():
            build(folder)
            (folder / ".done").touch()
    return folder


@pytest.fixture(scope="session")
def rl_inputs(tmp_path_factory):
    """``(model folder, data folder)`` of the small RL run the placement tests compare (rl_compare),
    one copy for the whole test run."""
    from rl_compare import make_data_dir
    from verl.models.tiny import make_tiny_model_folder

    def build(folder):
        make_tiny_model_folder(folder / "model", num_layers=2, hidden_size=64, intermediate_size=128)
        make_data_dir(folder / "data")

    folder = _built_once(_run_folder(tmp_path_factory) / "rl-inputs", build)
    return folder / "model", folder / "data"


@pytest.fixture(scope="session")
def tool_run(tmp_path_factory):
    """``(model folder, task folder, output folder)``: a tiny model that memorized a tool-use
    conversation, its tool task, and one process's multi-turn run on it (agent_models.SCALE_OUT_KEYS),
    made once for the whole test run (test_agent_scale_out compares torchrun with it, test_ray_rl Ray)."""
    import shutil

    from agent_models import SCALE_OUT_KEYS, TOOL_CONVERSATION, memorize, tool_task_args, write_tool_task
    from rl_compare import run_plain

    def build(folder):
        _, _, model = memorize(tmp_path_factory, "tool-model", [TOOL_CONVERSATION])
        shutil.copytree(model, folder / "model")
        (folder / "task").mkdir()
        write_tool_task(folder / "task")
        run_plain(tool_task_args(folder / "model", folder / "task", folder / "one", *SCALE_OUT_KEYS))

    folder = _built_once(_run_folder(tmp_path_factory) / "tool-run", build)
    return folder / "model", folder / "task", folder / "one"


@pytest.fixture(scope="session")
def plain_run(rl_inputs, tmp_path_factory):
    """``plain_run(*keys)``: the output folder of one plain process running the small RL run with
    ``keys``: run once per set of keys for the whole test run (the torchrun, Ray and resume tests all
    compare against the same few). Read it; do not write into it."""
    from rl_compare import run_args, run_plain

    model, data = rl_inputs

    def run(*keys):
        name = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]
        folder = _built_once(_run_folder(tmp_path_factory) / "plain-runs" / name,
                             lambda f: run_plain(run_args(model, data, f / "out", *keys)))
        return folder / "out"
    return run
