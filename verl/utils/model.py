"""The tutorial's model and tokenizer loaders, over :mod:`verl.models.loading`.

    model = load_hf_model("Qwen/Qwen2-0.5B-Instruct", torch_dtype=torch.bfloat16,
                          attn_implementation="flash_attention_2", trust_remote_code=True)

Where flash-attention cannot run (no flash-attn package or no CUDA) the model loads with its
default attention (``sdpa``; ``eager`` for a model without sdpa, as Gemma 2) and one warning; a bad
path or hub id raises :class:`~verl.errors.ModelLoadError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from verl.errors import DeviceError, ModelLoadError
from verl.models.loading import load_causal_lm, load_tokenizer


# Names a model is often passed under (transformers' own, verl's config key): said, not a missing-argument TypeError.
OTHER_PATH_NAMES = ("pretrained_model_name_or_path", "model_path", "path", "model_name", "model_id")


def _model_name(function: str, given, kwargs: dict) -> str:
    """``model_name_or_path`` as a path string; None or a misnamed keyword is one line naming what to pass (None,
    as ``actor_rollout_ref.model.path`` holds for the built-in model, failed in os.fspath)."""
    misnamed = [name for name in OTHER_PATH_NAMES if name in kwargs]
    if misnamed:
        raise ModelLoadError(f"{function} takes the model as model_name_or_path (or its first argument), got "
                             f"{misnamed[0]}={kwargs[misnamed[0]]!r}: write {function}(model_name_or_path=...)")
    if given is None:
        raise ModelLoadError(f"{function} needs a model: a hub id ('Qwen/Qwen2-0.5B-Instruct') or a folder with "
                             f"config.json, got None. A config's model.path of null means the built-in tiny model: "
                             f"its folder is verl.models.tiny.builtin_model_path()")
    return os.fspath(given)


def load_hf_model(model_name_or_path: str | os.PathLike | None = None, torch_dtype: torch.dtype | str | None = None,
                  attn_implementation: str | None = None, trust_remote_code: bool = False, *,
                  dtype: torch.dtype | str | None = None, **kwargs) -> torch.nn.Module:
    """A Hugging Face causal LM from a hub id or a local folder.

    Args:
        model_name_or_path: hub id (``"Qwen/Qwen2-0.5B-Instruct"``) or folder with config.json.
        torch_dtype: weight dtype, a ``torch.dtype`` or a name (``"bf16"``, ``"bfloat16"``,
            ``"fp32"``, ``"auto"`` = the checkpoint's own); None = float32. ``dtype=`` is the
            same argument under the name newer transformers use; give only one of them.
        attn_implementation: ``"eager"``, ``"sdpa"`` or ``"flash_attention_2"``; None = the
            transformers default.
        trust_remote_code: allow modelling code shipped with the checkpoint.
        **kwargs: passed to :func:`verl.models.loading.load_causal_lm` (``override_config``)
            and on to ``from_pretrained``.
    """
    if torch_dtype is not None and dtype is not None and torch_dtype != dtype:
        raise ModelLoadError(f"load_hf_model got torch_dtype={torch_dtype!r} and dtype={dtype!r}; give one of them")
    chosen = torch_dtype if torch_dtype is not None else dtype
    _check_device_map(kwargs.get("device_map"))
    kwargs.setdefault("config_key", "model_name_or_path")
    name = _model_name("load_hf_model", model_name_or_path, kwargs)
    return load_causal_lm(name, dtype=chosen if chosen is not None else "float32",
                          attn_implementation=attn_implementation, trust_remote_code=trust_remote_code, **kwargs)


def load_hf_tokenizer(model_name_or_path: str | os.PathLike | None = None, trust_remote_code: bool = False,
                      **kwargs):
    """The model's tokenizer, set up for RL: left padding and a pad token (eos when it has none)."""
    name = _model_name("load_hf_tokenizer", model_name_or_path, kwargs)
    kwargs.setdefault("config_key", "model_name_or_path")
    return load_tokenizer(name, trust_remote_code=trust_remote_code, **kwargs)


def _check_device_map(device_map) -> None:
    """A ``device_map`` that places weights on a GPU where torch sees none: one line, not transformers' assert."""
    places = device_map.values() if isinstance(device_map, Mapping) else [device_map]
    on_gpu = [p for p in places if (isinstance(p, int) and not isinstance(p, bool)) or str(p).startswith("cuda")]
    if on_gpu and not torch.cuda.is_available():
        why = "this torch is a CPU build" if torch.version.cuda is None else "no GPU is visible to torch"
        raise DeviceError(f"device_map={device_map!r} puts the model on a GPU, but CUDA is not available here ({why}); "
                          f"leave device_map out (the model loads on the CPU) or use device_map='cpu'")
