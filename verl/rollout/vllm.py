"""vLLM rollout (GPU only). Construction checks for vLLM and CUDA and says what to do without them."""

from __future__ import annotations

import importlib.util

import torch

from verl.errors import VerlError


def check_vllm_available() -> None:
    """Raise a :class:`VerlError` naming the fix when vLLM cannot run here."""
    missing = []
    if importlib.util.find_spec("vllm") is None:
        missing.append("the vllm package is not installed (pip install 'verl[vllm]')")
    if not torch.cuda.is_available():
        missing.append("no CUDA GPU is visible")
    if missing:
        raise VerlError("rollout name 'vllm' cannot run here: " + "; ".join(missing) +
                        ". Use the Hugging Face engine instead: actor_rollout_ref.rollout.name=hf")
