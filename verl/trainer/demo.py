"""The embedded default: what ``python -m verl.trainer.main_ppo`` runs with no model and no data.

A ~1M-parameter Qwen2 model learns 2-digit addition: a short supervised warm start (cached),
then GRPO with 32 prompts x 8 samples per step. Any key given on the command line overrides
the preset below.

The rollout engine is the fastest one installed for this shape (256 samples of at most 6 tokens
from a 1M model), as measured in docs/performance.md: ``native`` (0.03 s of generation a step),
ahead of ``hf`` (0.07 s) and vLLM's CPU build (0.09 s: per-request overhead outweighs its
kernels on such short responses). ``native`` needs transformers 4.56 or newer; before that, ``hf``.
"""

from __future__ import annotations


def demo_rollout_engine() -> str:
    """``native`` where it can run (transformers' layered cache API, 4.56+), else ``hf``."""
    try:
        from transformers.cache_utils import DynamicLayer  # noqa: F401
    except ImportError:
        return "hf"
    return "native"


DEMO_PRESET = [
    "data.train_batch_size=32",
    "data.max_prompt_length=16",
    "data.max_response_length=6",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    "actor_rollout_ref.actor.optim.lr=1e-4",
    "actor_rollout_ref.actor.optim.weight_decay=0.0",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "algorithm.adv_estimator=grpo",
    "trainer.total_training_steps=200",
    "trainer.val_sampled=true",
    "trainer.experiment_name=demo",
    "trainer.default_local_dir=outputs/demo",
    f"actor_rollout_ref.rollout.name={demo_rollout_engine()}",
]


def is_demo(config) -> bool:
    """The built-in model on the built-in task: the case the preset and the warm start are for."""
    return (config.actor_rollout_ref.model.path is None and config.data.train_files is None
            and config.data.builtin_task == "addition")
