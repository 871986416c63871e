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


# Files whose tests start Ray: one group, so they never run side by side (docs/distributed.md ends
# with `ray stop`, which stops every Ray of this user).
RAY_FILES = {"test_ray_rl.py", "test_distributed_doc.py", "test_agent_scale_out.py"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``-n``, ``--dist loadgroup``): each file runs on one worker, so its module
    fixtures (shared reference runs, trained models) are built once; the Ray files share one worker."""
    for item in items:
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group("ray" if name in RAY_FILES else str(item.path)))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised tiny Qwen2 model + byte-level tokenizer, as a Hugging Face folder."""
    from verl.models.tiny import make_tiny_model_folder

    return make_tiny_model_folder(tmp_path_factory.mktemp("tiny-qwen2"), num_layers=2, hidden_size=64,
                                  intermediate_size=128)
