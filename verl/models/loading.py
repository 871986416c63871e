"""Loading Hugging Face causal LMs and tokenizers, from a local folder or a hub id.

The loaders add three things to ``from_pretrained``: a clear :class:`ModelLoadError` when a path
or hub id cannot be loaded, the tokenizer settings RL needs (left padding, a pad token), and an
attention fallback (``flash_attention_2`` without flash-attn or CUDA becomes ``sdpa``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

import torch

from verl.errors import ModelLoadError

logger = logging.getLogger(__name__)

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


def _quiet_transformers() -> None:
    """No download/shard progress bars or advisory warnings: verl prints its own progress."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | str | None:
    """``"bf16"`` / ``"bfloat16"`` / ``torch.bfloat16`` -> ``torch.bfloat16``; ``"auto"`` and None pass."""
    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)} or 'auto'")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """``"auto"`` -> cuda when a GPU is visible, else cpu. A bare ``cuda`` (or auto's cuda) is this
    process's GPU: ``cuda:LOCAL_RANK`` under torchrun, so each rank of a node gets its own."""
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def resolve_attn_implementation(requested: str | None) -> str | None:
    """Fall back from flash_attention_2 to sdpa (with one warning) where it cannot run."""
    if requested not in ("flash_attention_2", "flash_attention_3"):
        return requested
    missing = []
    if importlib.util.find_spec("flash_attn") is None:
        missing.append("the flash-attn package is not installed")
    if not torch.cuda.is_available():
        missing.append("no CUDA device is visible")
    if missing:
        logger.warning("attn_implementation=%s is not available here (%s); using 'sdpa' instead.",
                       requested, " and ".join(missing))
        return "sdpa"
    return requested


def _looks_like_path(name: str) -> bool:
    # Hub ids are "name" or "org/name"; anything else is meant as a folder.
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or Path(name).expanduser().exists()


def _load_error(what: str, name: str, config_key: str, exc: Exception) -> ModelLoadError:
    if _looks_like_path(name) and not Path(name).expanduser().exists():
        return ModelLoadError(f"{what} folder not found: {name!r} (from `{config_key}`). "
                              f"Give an existing folder that holds config.json, or a hub id like 'Qwen/Qwen2-0.5B'.")
    if Path(name).expanduser().is_dir():
        return ModelLoadError(f"could not load the {what} from folder {name!r} (from `{config_key}`): "
                              f"{type(exc).__name__}: {exc}")
    return ModelLoadError(
        f"could not load the {what} {name!r} (from `{config_key}`): it is not a local folder and the "
        f"Hugging Face hub could not provide it ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). "
        f"Check the id, or download it where the hub is reachable (`huggingface-cli download {name} "
        f"--local-dir DIR`) and set `{config_key}=DIR`.")


def load_tokenizer(name_or_path: str, *, trust_remote_code: bool = False,
                   config_key: str = "actor_rollout_ref.model.path", **kwargs):
    """``AutoTokenizer.from_pretrained`` set up for RL: left padding, and a pad token (eos if absent)."""
    from transformers import AutoTokenizer

    _quiet_transformers()
    try:
        tok = AutoTokenizer.from_pretrained(os.path.expanduser(name_or_path),
                                            trust_remote_code=trust_remote_code, **kwargs)
    except (OSError, ValueError) as exc:
        raise _load_error("tokenizer", name_or_path, config_key, exc) from None
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
        logger.info("tokenizer has no pad token; using eos %r", tok.eos_token)
    return tok


def load_causal_lm(name_or_path: str, *, dtype: str | torch.dtype | None = "float32",
                   attn_implementation: str | None = None, trust_remote_code: bool = False,
                   override_config: dict | None = None, config_key: str = "actor_rollout_ref.model.path",
                   disable_dropout: bool = False, **kwargs):
    """``AutoModelForCausalLM.from_pretrained`` with dtype names, attention fallback and clear errors.

    ``disable_dropout``: every dropout probability of the model config (``dropout``,
    ``attention_dropout``, ``resid_pdrop``, ...) is set to 0 before the model is built. RL wants this: its log-prob ratios compare forward passes, which
    dropout would run through differently thinned networks (and differently on each rank).
    ``override_config`` is applied after, so it can still set a dropout on purpose.
    """
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    _quiet_transformers()
    path = os.path.expanduser(name_or_path)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise _load_error("model", name_or_path, config_key, exc) from None
    _refuse_multimodal(config, name_or_path, config_key)
    if disable_dropout:
        _zero_dropout_settings(config)
    for key, value in (override_config or {}).items():
        setattr(config, key, value)
    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    attn = resolve_attn_implementation(attn_implementation)
    if attn is not None:
        kwargs["attn_implementation"] = attn
    try:
        model = AutoModelForCausalLM.from_pretrained(path, config=config, trust_remote_code=trust_remote_code,
                                                     **{dtype_kw: resolve_dtype(dtype)}, **kwargs)
    except (OSError, ValueError) as exc:
        raise _load_error("model", name_or_path, config_key, exc) from None
    return model


def _refuse_multimodal(config, name: str, config_key: str) -> None:
    """A vision-language (or audio) model: refused by name, before its weights load."""
    towers = [key for key in ("vision_config", "audio_config", "visual", "vision_tower") if getattr(config, key, None)]
    if towers:
        raise ModelLoadError(
            f"{name!r} (from `{config_key}`) is a multimodal model ({config.model_type}, with {towers[0]}): "
            f"vision and audio inputs are not supported here, only text causal LMs. Use a text model "
            f"(e.g. Qwen/Qwen2.5-7B-Instruct for Qwen2.5-VL-7B-Instruct)")


def _zero_dropout_settings(config) -> None:
    """Dropout probabilities of a Hugging Face config (and its sub-configs) set to 0."""
    from transformers import PretrainedConfig

    for key, value in list(vars(config).items()):
        if ("dropout" in key or key.endswith("pdrop")) and isinstance(value, float):
            setattr(config, key, 0.0)
        elif isinstance(value, PretrainedConfig):  # a nested config (text, vision)
            _zero_dropout_settings(value)


def load_sequence_classifier(name_or_path: str, *, dtype: str | torch.dtype | None = "float32",
                             trust_remote_code: bool = False, config_key: str = "reward_model.model.path",
                             **kwargs):
    """``AutoModelForSequenceClassification.from_pretrained`` with dtype names and clear errors, in eval mode.

    A folder without trained head weights (a causal LM, a bare encoder) is refused: transformers
    would fill the missing head with random numbers and only warn.
    """
    import transformers
    from transformers import AutoModelForSequenceClassification

    _quiet_transformers()
    path = os.path.expanduser(name_or_path)
    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(
            path, trust_remote_code=trust_remote_code, output_loading_info=True,
            **{dtype_kw: resolve_dtype(dtype)}, **kwargs)
    except (OSError, ValueError) as exc:
        raise _load_error("sequence-classification model", name_or_path, config_key, exc) from None
    if info["missing_keys"]:
        raise ModelLoadError(
            f"{name_or_path!r} (from `{config_key}`) loads as {type(model).__name__}, but these weights are not "
            f"in it and would be random: {sorted(info['missing_keys'])[:5]}. It is not a trained "
            f"sequence-classification model (a causal LM folder, for instance); give a trained reward "
            f"model's folder or hub id.")
    return model.eval()

