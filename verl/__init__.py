"""verl: reinforcement-learning post-training for Hugging Face causal language models.

``import verl`` is light: it checks the installed PyTorch version (from package metadata,
without importing torch) and nothing more. The names below load their module on first use:

    from verl import TrainerConfig, ActorRolloutRefWorker
"""

from verl.utils.preflight import check_torch_version, installed_torch_version
from verl.version import __version__

check_torch_version(installed_torch_version())

# public name -> module that defines it (imported on first access, see __getattr__)
_LAZY = {
    "TrainerConfig": "verl.config",
    "ConfigError": "verl.config",
    "ActorRolloutRefWorker": "verl.workers.actor_rollout_ref",
    "Batch": "verl.protocol",
    "VerlError": "verl.errors",
    "ModelLoadError": "verl.errors",
    "load_hf_model": "verl.utils.model",
    "load_hf_tokenizer": "verl.utils.model",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'verl' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
