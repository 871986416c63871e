import gc
import os

import pytest
import torch

# Tiny models gain nothing from a second thread, and on a busy 2-core machine two threads per
# process make every small matmul many times slower.
torch.set_num_threads(1)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

try:  # tests/with_vllm need vLLM: elsewhere tests/integration/test_vllm_env.py runs them in .venv-vllm
    import importlib.util

    collect_ignore_glob = [] if importlib.util.find_spec("vllm") else ["with_vllm/*"]
except ValueError:
    collect_ignore_glob = ["with_vllm/*"]


# Files whose tests start Ray: one unit of scheduling, so they never run side by side (a test
# there counts or kills the RoleHost processes it finds, and docs/distributed.md ends with
# `ray stop`, which stops every Ray of this user).
RAY_FILES = {"test_ray_rl.py", "test_ray_nodes.py", "test_distributed_doc.py"}


# The longest units, started first so that no worker is left with one of them at the end while the
# others idle (seconds of one -n 2 run on a 2-core machine, the calculator and the memory plan on an
# AVX2 EPYC; the rest follow by their number of tests).
LONGEST = {"ray": 450, "test_async_rl.py": 330, "test_calculator_demo.py": 175, "test_vllm_env.py": 160,
           "test_async_failures.py": 135, "test_vision_learning.py": 130, "test_bench_memory_plan.py": 65,
           "test_offline_docs.py": 60, "test_torchrun_rl.py": 50, "test_multinode.py": 45,
           "test_torchrun_tutorial.py": 40, "test_offline_torchrun.py": 36, "test_warmstart.py": 100,
           "test_algorithms_learn.py": 35, "test_vision_rl.py": 32, "test_kill_resume.py": 30,
           "test_lora_e2e.py": 27, "test_torchrun_failures.py": 26, "test_docs.py": 25, "test_watchdog.py": 90}


def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (``-n``): each file runs on one worker, so its module fixtures (shared
    reference runs, trained models) are built once; the Ray files run on one worker, one after the
    other; the longest units go first (LONGEST). (xdist's own ``--dist loadgroup`` does not group
    with pytest 9; ``loadfile`` is this without the Ray unit and the order.)"""
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "ray" if os.path.basename(path) in RAY_FILES else path

        def _assign_work_unit(self, node) -> None:
            if not getattr(self, "_ordered", False):  # the queue is complete at the first assignment
                self._ordered = True
                units = sorted(self.workqueue.items(), key=lambda unit: -LONGEST.get(os.path.basename(unit[0]), 0))
                self.workqueue.clear()
                self.workqueue.update(units)  # a stable sort: xdist's order (most tests first) otherwise
            super()._assign_work_unit(node)

    return FileScheduling(config, log)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised tiny Qwen2 model + byte-level tokenizer, as a Hugging Face folder."""
    from verl.models.tiny import make_tiny_model_folder

    return make_tiny_model_folder(tmp_path_factory.mktemp("tiny-qwen2"), num_layers=2, hidden_size=64,
                                  intermediate_size=128)


@pytest.fixture(scope="session")
def load_benchmark():
    """``load_benchmark("bench_vs_trl")``: a script of benchmarks/ as a module (they are not a package)."""
    import importlib.util
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "benchmarks"

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


def pytest_collection_finish(session):
    """Everything imported while collecting (torch, transformers, Ray, the test modules) lives as long as
    the worker: out of the garbage collector's full scans from here on (verl.utils.command freezes a
    command's imports the same way). Each full collection then scans what the tests build, not the whole
    heap: tests/unit ran in 121 s, its two workers' collections taking 14.6 s of it; frozen, 9.2 s."""
    gc.freeze()
