"""Loading Hugging Face causal LMs and tokenizers, from a local folder or a hub id.

The loaders add three things to ``from_pretrained``: a clear :class:`ModelLoadError` when a path
or hub id cannot be loaded (its texts: :mod:`verl.models.load_errors`), the tokenizer settings RL
needs (left padding, a pad token), and an attention fallback (``flash_attention_2`` without
flash-attn or CUDA becomes ``sdpa``).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import socket
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from verl.errors import DeviceError, ModelLoadError, VerlError
from verl.models.folder_checks import (check_tokenizer_files, check_weight_files, refuse_empty_tokenizer,
                                       refuse_unloaded_weights)
from verl.models.load_errors import cwd_note, load_error, looks_like_path, unknown_keyword
from verl.utils.hub import offline_flag

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
    # The hub client logs every failed request ("... thrown while requesting HEAD ..."); a hub that
    # cannot be reached ends in one error of ours instead, naming the fix.
    logging.getLogger("huggingface_hub.utils._http").setLevel(logging.ERROR)


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | str | None:
    """``"bf16"`` / ``"bfloat16"`` / ``torch.bfloat16`` -> ``torch.bfloat16``; ``"auto"`` and None pass."""
    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)} or 'auto'")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device | None = "auto", key: str = "trainer.device",
                   instead: str = "or auto (the GPU when there is one)") -> torch.device:
    """``"auto"`` -> cuda when a GPU is visible, else cpu. A bare ``cuda`` (or auto's cuda) is this
    process's GPU: ``cuda:LOCAL_RANK`` under torchrun, so each rank of a node gets its own. ``key``
    names the setting in the errors, ``instead`` its other fix."""
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise DeviceError(f"{key}={device!r} is not a device ({e}); use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        why = "this torch is a CPU build" if torch.version.cuda is None else "no GPU is visible to torch"
        raise DeviceError(f"{key}={device} but CUDA is not available here ({why}); use {key}=cpu, "
                          f"{instead}. `verl doctor` shows what torch sees")
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def flash_attention_missing(requested: str | None) -> str | None:
    """Why flash attention (``requested``) cannot run here, or None (it can, or it was not asked for)."""
    if requested not in ("flash_attention_2", "flash_attention_3"):
        return None
    missing = []
    if importlib.util.find_spec("flash_attn") is None:
        missing.append("the flash-attn package is not installed")
    if not torch.cuda.is_available():
        missing.append("no CUDA device is visible")
    return " and ".join(missing) or None


def resolve_attn_implementation(requested: str | None) -> str | None:
    """Fall back from flash_attention_2 to the model's default attention (with one warning) where it cannot
    run: None, so that transformers picks sdpa, or eager for a model without sdpa. Gemma 2 has none (its
    soft-capped attention scores): naming sdpa made its load fail."""
    missing = flash_attention_missing(requested)
    if missing:
        logger.warning("attn_implementation=%s is not available here (%s); using the model's default instead "
                       "(sdpa; eager where the model has no sdpa, as Gemma 2).", requested, missing)
        return None
    return requested


@functools.lru_cache(maxsize=4)
def hub_reachable(endpoint: str, timeout_s: float = 3.0) -> bool:
    """Whether a TCP connection to the hub's host opens within ``timeout_s`` (asked once per process)."""
    parsed = urllib.parse.urlparse(endpoint)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def hub_access(name: str, what: str, config_key: str) -> dict:
    """Extra ``from_pretrained`` arguments for a hub id: none when the hub is reachable (or offline mode
    is set, which transformers honours itself); ``local_files_only`` when it is not and the id is in the
    local cache; and when it is in neither, a ModelLoadError at once, instead of a minute of retries."""
    if looks_like_path(name) or Path(name).expanduser().is_dir() or offline_flag() is not None:
        return {}
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:  # before the cache is asked, which raised HFValidationError's traceback for 'my models/qwen'
        validate_repo_id(name)
    except HFValidationError:
        spaces = " It begins or ends with a space: remove it." if name != name.strip() else ""
        raise ModelLoadError(f"could not load the {what} {name!r} (from `{config_key}`): it is not a local folder"
                             f"{cwd_note(name)}, and not a hub id (an 'owner/name' of letters, digits, '-', '_' and "
                             f"'.').{spaces} Give an existing folder that holds config.json, or a hub id like "
                             f"'Qwen/Qwen2-0.5B'.") from None
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if hub_reachable(endpoint):
        return {}
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return {"local_files_only": True}
    raise ModelLoadError(
        f"could not load the {what} {name!r} (from `{config_key}`): it is not a local folder{cwd_note(name)}, it is not in the "
        f"Hugging Face cache, and the hub ({endpoint}) cannot be reached from this machine. Download it where the "
        f"hub is reachable (`huggingface-cli download {name} --local-dir DIR`), copy DIR here and set "
        f"`{config_key}=DIR` (or set HF_ENDPOINT to a mirror you can reach).")


_PAD_WARNED: set[str] = set()


def trusted(value) -> bool:
    """``trust_remote_code`` as a bool: True or False (numpy's bools too; None, transformers' "ask", is False).
    Before, text such as "False" (a value read from an environment variable or a form) was truthy, and
    transformers ran the checkpoint's own code without a word."""
    if value is None:
        return False
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ModelLoadError(f"trust_remote_code must be True or False, got {value!r} ({type(value).__name__}); "
                         f"a checkpoint's own code runs only with trust_remote_code=True")


def load_tokenizer(name_or_path: str | os.PathLike, *, trust_remote_code: bool = False,
                   config_key: str = "actor_rollout_ref.model.path", chat_template: str | None = None,
                   template_key: str = "actor_rollout_ref.model.custom_chat_template", **kwargs):
    """``AutoTokenizer.from_pretrained`` set up for RL: left padding, and a pad token (eos if absent).
    ``chat_template`` (Jinja text, or a file holding it) replaces the tokenizer's own template."""
    name_or_path = os.fspath(name_or_path)  # a pathlib.Path too
    trust_remote_code = trusted(trust_remote_code)
    from transformers import AutoTokenizer

    _quiet_transformers()
    kwargs = {**hub_access(name_or_path, "tokenizer", config_key), **kwargs}
    if Path(name_or_path).expanduser().is_dir():
        check_tokenizer_files(Path(name_or_path).expanduser(), config_key)
    try:
        tok = AutoTokenizer.from_pretrained(os.path.expanduser(name_or_path),
                                            trust_remote_code=trust_remote_code, **kwargs)
    except (OSError, ValueError) as exc:
        raise load_error("tokenizer", name_or_path, config_key, exc) from None
    refuse_empty_tokenizer(tok, name_or_path, config_key)
    tok.padding_side = "left"
    if tok.eos_token is None and tok.pad_token is None:
        raise ModelLoadError(
            f"the tokenizer of {name_or_path!r} (from `{config_key}`) has neither an eos nor a pad token: batches "
            f"cannot be padded and a response could never end. Give a tokenizer that has one (eos_token in its "
            f"tokenizer_config.json), or point `{config_key}` at another")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
        tok._verl_pad_from_eos = True  # verl's, for batching: verl.checkpoint.save_tokenizer leaves it out
        if name_or_path not in _PAD_WARNED:  # a common and harmless default: said once per tokenizer and process
            _PAD_WARNED.add(name_or_path)
            logger.warning("the tokenizer of %s has no pad token; padding with its eos token %r (padding is masked "
                           "out, so this changes no result)", name_or_path, tok.eos_token)
    if chat_template is not None:
        set_chat_template(tok, chat_template, template_key)
    return tok


def check_token_ids(tokenizer, model_config, prompts, *, data_key: str,
                    tokenizer_key: str = "actor_rollout_ref.model.tokenizer_path") -> None:
    """Refuse, before any model loads, ids the model has no embedding for: the pad token's, or a prompt's
    (``prompts``: their token id lists). Otherwise the first forward fails deep in torch with "index out
    of range in self". Happens when the tokenizer is another model's, or has tokens added without the
    embeddings resized. Only when the tokenizer has more ids than the model's vocabulary are the
    prompts read (a model's vocabulary is usually padded past its tokenizer)."""
    rows = model_config.get_text_config().vocab_size
    if rows is None or len(tokenizer) <= rows:
        return
    why = (f"the model ({model_config.model_type}) embeds token ids 0..{rows - 1} only, and the tokenizer has "
           f"{len(tokenizer)}: is it another model's ({tokenizer_key}), or were tokens added to it without "
           f"resizing the model's embeddings? Use the model's own tokenizer (or resize the embeddings and "
           f"save the model)")
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id >= rows:
        raise ModelLoadError(f"the pad token {tokenizer.pad_token!r} is id {tokenizer.pad_token_id}, but {why}")
    for i, ids in enumerate(prompts):
        outside = [t for t in ids if t >= rows]
        if outside:
            raise ModelLoadError(f"prompt {i} of {data_key} holds token id {outside[0]} "
                                 f"({tokenizer.convert_ids_to_tokens(int(outside[0]))!r}), but {why}")


def refuse_ids_outside(input_ids: torch.Tensor, vocab_size: int | None, prefix: str = "") -> None:
    """Refuse a batch's ``input_ids`` [B, T] holding an id the model has no embedding for (ids made by
    another tokenizer), naming the first one and where it is; the forward would fail deep in torch with
    "index out of range in self". ``prefix`` names the call in the message."""
    if vocab_size is None or not input_ids.numel():
        return
    outside = ((input_ids < 0) | (input_ids >= vocab_size)).nonzero()
    if len(outside):
        row, position = outside[0].tolist()
        raise VerlError(f"{prefix}input_ids holds token id {int(input_ids[row, position])} (row {row}, position "
                        f"{position}), outside the model's {vocab_size} token ids: were the ids made by another "
                        f"tokenizer? Encode the text with the worker's (worker.tokenizer)")


def set_chat_template(tok, template: str, key: str) -> None:
    """Give ``tok`` the Jinja ``template`` (text, or the path of a file holding it), checked by rendering
    a two-turn conversation, so a broken template fails here, naming ``key``."""
    source = "text"
    if "{" not in template and Path(template).expanduser().is_file():
        source, template = f"file {template}", Path(template).expanduser().read_text(encoding="utf-8")
    elif "{" not in template:
        raise ModelLoadError(f"{key}={template!r} is neither a Jinja template (no {{% %}} or {{{{ }}}} in it) nor an "
                             f"existing file; give the template text, or the path of a file that holds it")
    tok.chat_template = template
    try:
        tok.apply_chat_template([{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}],
                                tokenize=False)
        tok.apply_chat_template([{"role": "user", "content": "1+1?"}], tokenize=False, add_generation_prompt=True)
    except Exception as e:  # jinja2's TemplateError and whatever the template itself raises
        raise ModelLoadError(f"{key}: the chat template ({source}) does not render a conversation: "
                             f"{type(e).__name__}: {e}") from None


def load_causal_lm(name_or_path: str | os.PathLike, *, dtype: str | torch.dtype | None = "float32",
                   attn_implementation: str | None = None, trust_remote_code: bool = False,
                   override_config: dict | None = None, config_key: str = "actor_rollout_ref.model.path",
                   disable_dropout: bool = False, missing_ok: tuple[str, ...] = (), **kwargs):
    """``AutoModelForCausalLM.from_pretrained`` with dtype names, attention fallback and clear errors.

    Weight files that are Git LFS pointers or cut off, and weights that leave a parameter of the model
    unread (other names, other shapes), are refused (:mod:`verl.models.folder_checks`): transformers would
    start those parameters from random values. ``missing_ok``: name prefixes the caller has no use for.

    ``disable_dropout``: every dropout probability of the model config (``dropout``,
    ``attention_dropout``, ``resid_pdrop``, ...) is set to 0 before the model is built. RL wants this: its log-prob ratios compare forward passes, which
    dropout would run through differently thinned networks (and differently on each rank).
    ``override_config`` is applied after, so it can still set a dropout on purpose.
    """
    name_or_path = os.fspath(name_or_path)  # a pathlib.Path too
    trust_remote_code = trusted(trust_remote_code)
    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from verl.models.vision import is_vision_model

    _quiet_transformers()
    path = os.path.expanduser(name_or_path)
    kwargs = {**hub_access(name_or_path, "model", config_key), **kwargs}
    config = load_causal_lm_config(name_or_path, trust_remote_code=trust_remote_code, override_config=override_config,
                                   config_key=config_key, disable_dropout=disable_dropout,
                                   local_files_only=bool(kwargs.get("local_files_only")))
    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    attn = resolve_attn_implementation(attn_implementation)
    if attn is not None:
        kwargs["attn_implementation"] = attn
    auto = AutoModelForImageTextToText if is_vision_model(config) else AutoModelForCausalLM
    torch_dtype = resolve_dtype(dtype)  # a wrong name is its own error, not the folder's
    if Path(path).is_dir():
        check_weight_files(Path(path), config_key)
    # Other shapes are loaded as "mismatched" (and refused below, by name) rather than raised as
    # transformers' RuntimeError, which points at a report its quiet logging does not print.
    refuse_mismatched = not kwargs.get("ignore_mismatched_sizes", False)
    kwargs.setdefault("ignore_mismatched_sizes", True)
    try:
        model, info = auto.from_pretrained(path, config=config, trust_remote_code=trust_remote_code,
                                           output_loading_info=True, **{dtype_kw: torch_dtype}, **kwargs)
    except (OSError, ValueError) as exc:
        raise load_error("model", name_or_path, config_key, exc) from None
    except TypeError as exc:
        error = unknown_keyword(exc, kwargs)
        if error is None:
            raise
        raise error from None
    refuse_unloaded_weights(info if refuse_mismatched else {**info, "mismatched_keys": []}, config.model_type,
                            name_or_path, config_key, missing_ok)
    return model


def load_causal_lm_config(name_or_path: str | os.PathLike, *, trust_remote_code: bool = False, override_config: dict | None = None,
                          config_key: str = "actor_rollout_ref.model.path", disable_dropout: bool = False,
                          local_files_only: bool = False):
    """The model's config (``config.json``) as :func:`load_causal_lm` builds the model from it, with
    the same clear errors; no weights are read."""
    name_or_path = os.fspath(name_or_path)  # a pathlib.Path too
    trust_remote_code = trusted(trust_remote_code)
    from transformers import AutoConfig

    local = {"local_files_only": True} if local_files_only else {}
    try:
        config = AutoConfig.from_pretrained(os.path.expanduser(name_or_path), trust_remote_code=trust_remote_code,
                                            **local)
    except (OSError, ValueError) as exc:
        raise load_error("model", name_or_path, config_key, exc) from None
    _refuse_multimodal(config, name_or_path, config_key)
    _refuse_non_causal(config, name_or_path, config_key)
    if disable_dropout:
        _zero_dropout_settings(config)
    for key, value in (override_config or {}).items():
        setattr(config, key, value)
    return config


@dataclass
class ModelDescription:
    """What :func:`load_causal_lm` would build, described without reading a weight: the config, the generation
    config and the dtype of the parameters. An engine that loads the folder itself (vLLM) needs no more."""

    config: object
    generation_config: object
    dtype: torch.dtype


def describe_causal_lm(name_or_path: str | os.PathLike, *, dtype: str | torch.dtype | None = "float32",
                       trust_remote_code: bool = False, override_config: dict | None = None,
                       config_key: str = "actor_rollout_ref.model.path",
                       disable_dropout: bool = False) -> ModelDescription:
    """:func:`load_causal_lm`'s model as a :class:`ModelDescription` (``dtype`` auto or None: the one the config
    stores, float32 if none), with the same clear errors; no weights are read."""
    name_or_path = os.fspath(name_or_path)  # a pathlib.Path too
    from transformers import GenerationConfig

    local = bool(hub_access(name_or_path, "model", config_key).get("local_files_only"))
    config = load_causal_lm_config(name_or_path, trust_remote_code=trust_remote_code, override_config=override_config,
                                   config_key=config_key, disable_dropout=disable_dropout, local_files_only=local)
    try:
        generation = GenerationConfig.from_pretrained(os.path.expanduser(name_or_path),
                                                      **({"local_files_only": True} if local else {}))
    except OSError:  # no generation_config.json: transformers derives it from the config, as here
        generation = GenerationConfig.from_model_config(config)
    resolved = resolve_dtype(dtype)
    if resolved in (None, "auto"):
        stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        resolved = stored if isinstance(stored, torch.dtype) else DTYPES.get(stored, torch.float32)
    config.dtype = resolved  # as from_pretrained records the dtype it built
    return ModelDescription(config, generation, resolved)


# Encoder models that transformers can also build as a decoder (with is_decoder=true): a folder of one
# trained as an encoder (masked LM, classifier, embedder) is not a policy.
ENCODER_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "electra", "camembert", "ernie", "big_bird", "rembert",
                           "roc_bert", "data2vec-text", "megatron-bert", "xmod", "modernbert", "deberta", "deberta-v2",
                           "distilbert", "albert", "mpnet"})
CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel", "WithLMHead")


def _refuse_non_causal(config, name: str, config_key: str) -> None:
    """An encoder-only (BERT-like) or encoder-decoder (T5-like) model: refused by name before any
    weights load, rather than failing later inside the training step."""
    architectures = list(getattr(config, "architectures", None) or [])
    if config.is_encoder_decoder:
        kind = "an encoder-decoder model"
    elif getattr(config, "is_decoder", False):
        return
    elif architectures and not any(a.endswith(CAUSAL_HEADS) for a in architectures):
        if config.model_type not in ENCODER_TYPES and any(a.endswith("ForConditionalGeneration") for a in architectures):
            return  # a decoder's generation head under another name (multimodal ones are refused above)
        kind = f"an encoder-only model ({', '.join(architectures)})"
    elif not architectures and config.model_type in ENCODER_TYPES:
        kind = "an encoder-only model"
    else:
        return
    raise ModelLoadError(
        f"{name!r} (from `{config_key}`) is not a causal language model: it is {kind}, model_type "
        f"{config.model_type!r}. RL and SFT here train decoder-only causal LMs (Qwen2, Llama, Mistral, Phi-3, "
        f"OPT, GPT-2, ...); give the folder or hub id of one (a BERT-like model can only serve as a reward "
        f"model: reward_model.model.path)")


# Vision-language families trained here (docs/vision.md): images through AutoModelForImageTextToText.
VISION_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def _refuse_multimodal(config, name: str, config_key: str) -> None:
    """A multimodal model of a family not trained here (audio, or vision beyond :data:`VISION_FAMILIES`):
    refused by name, before its weights load."""
    towers = [key for key in ("vision_config", "audio_config", "visual", "vision_tower") if getattr(config, key, None)]
    if towers and not (config.model_type in VISION_FAMILIES and towers == ["vision_config"]):
        raise ModelLoadError(
            f"{name!r} (from `{config_key}`) is a multimodal model ({config.model_type}, with {towers[0]}): of "
            f"those, only the vision-language families {', '.join(VISION_FAMILIES)} (Qwen2-VL, Qwen2.5-VL, "
            f"Qwen3-VL) train here, with images. Use one of them, or a text model (e.g. Qwen/Qwen2.5-7B-Instruct)")


def _zero_dropout_settings(config) -> None:
    """Dropout probabilities of a Hugging Face config (and its sub-configs) set to 0."""
    from transformers import PretrainedConfig

    for key, value in list(vars(config).items()):
        if ("dropout" in key or key.endswith("pdrop")) and isinstance(value, float):
            setattr(config, key, 0.0)
        elif isinstance(value, PretrainedConfig):  # a nested config (text, vision)
            _zero_dropout_settings(value)


def load_sequence_classifier(name_or_path: str | os.PathLike, *, dtype: str | torch.dtype | None = "float32",
                             trust_remote_code: bool = False, config_key: str = "reward_model.model.path",
                             **kwargs):
    """``AutoModelForSequenceClassification.from_pretrained`` with dtype names and clear errors, in eval mode.

    A folder without trained head weights (a causal LM, a bare encoder) is refused: transformers
    would fill the missing head with random numbers and only warn.
    """
    name_or_path = os.fspath(name_or_path)  # a pathlib.Path too
    trust_remote_code = trusted(trust_remote_code)
    import transformers
    from transformers import AutoModelForSequenceClassification

    _quiet_transformers()
    path = os.path.expanduser(name_or_path)
    kwargs = {**hub_access(name_or_path, "sequence-classification model", config_key), **kwargs}
    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(
            path, trust_remote_code=trust_remote_code, output_loading_info=True,
            **{dtype_kw: resolve_dtype(dtype)}, **kwargs)
    except (OSError, ValueError) as exc:
        raise load_error("sequence-classification model", name_or_path, config_key, exc) from None
    if info["missing_keys"]:
        raise ModelLoadError(
            f"{name_or_path!r} (from `{config_key}`) loads as {type(model).__name__}, but these weights are not "
            f"in it and would be random: {sorted(info['missing_keys'])[:5]}. It is not a trained "
            f"sequence-classification model (a causal LM folder, for instance); give a trained reward "
            f"model's folder or hub id.")
    return model.eval()

