"""What a model folder can hold that ``from_pretrained`` reads without a clear word: weight files that are
not the weights, weights that are not the model's, and no tokenizer.

* A Git LFS pointer (a repository cloned without ``git lfs``) or a cut-off download in place of a weight
  file: safetensors fails with "header too large" or "incomplete metadata".
* Weights whose names or shapes are not the config's (a state dict saved from a wrapped model, another
  model's weights, an edited config.json): transformers initialises those parameters at random and,
  with its logging quiet, trains them without a word; a shape mismatch ends in a RuntimeError pointing
  at a report that was not printed.
* A folder without tokenizer files: transformers builds an empty tokenizer that turns every prompt into
  no tokens at all (the run then fails on something else, e.g. "the tokenizer has no chat template").
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from verl.errors import ModelLoadError

LFS_POINTER = b"version https://git-lfs.github.com/spec"
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model", "tiktoken.model", "qwen.tiktoken")


def model_section(config_key: str) -> str | None:
    """The config section a model key belongs to (``critic.model`` for ``critic.model.path``); None for a key
    that is not a section's path (the Python API's argument names)."""
    return config_key.rsplit(".", 1)[0] if config_key.endswith((".path", ".tokenizer_path")) else None


def _download_fix(folder: Path) -> str:
    return (f"fetch the real files: `git lfs install && git lfs pull` in {folder} if it is a git clone, or download "
            f"the model again with `huggingface-cli download <hub id> --local-dir {folder}`")


def lfs_pointers(folder: Path, names: list[str]) -> list[str]:
    """Those of ``names`` in ``folder`` that are Git LFS pointer files (a few lines of text) rather than content."""
    found = []
    for name in names:
        path = folder / name
        if path.is_file() and path.stat().st_size < 1024:
            with path.open("rb") as f:
                if f.read(len(LFS_POINTER)) == LFS_POINTER:
                    found.append(name)
    return found


def _truncated_safetensors(path: Path) -> str | None:
    """Why ``path`` is not a whole safetensors file (None when its header and size agree)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"it is {size} bytes long"
        header_len = struct.unpack("<Q", head)[0]
        if header_len > size - 8:
            return f"its header says {header_len} bytes follow, and the file is {size} bytes long"
        try:
            header = json.loads(f.read(header_len))
        except ValueError:
            return "its header is not readable"
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    needed = 8 + header_len + max(ends, default=0)
    if needed > size:
        return f"its tensors need {needed} bytes and the file has {size}"
    return None


def check_weight_files(folder: Path, config_key: str) -> None:
    """Refuse weight files in ``folder`` that are LFS pointers or cut off, naming the file and how to fetch it."""
    names = sorted({p.name for pattern in WEIGHT_PATTERNS for p in folder.glob(pattern)})
    pointers = lfs_pointers(folder, names)
    if pointers:
        raise ModelLoadError(
            f"{folder} (from `{config_key}`): {', '.join(pointers[:3])}{' ...' if len(pointers) > 3 else ''} "
            f"{'is a Git LFS pointer' if len(pointers) == 1 else 'are Git LFS pointers'} (a few lines of text), not "
            f"the weights: the repository was cloned without Git LFS; {_download_fix(folder)}")
    for name in names:
        if name.endswith(".safetensors"):
            why = _truncated_safetensors(folder / name)
            if why:
                raise ModelLoadError(f"{folder / name} (from `{config_key}`) is not a whole safetensors file ({why}): "
                                     f"the download was cut off or the copy is incomplete; {_download_fix(folder)}")


def refuse_unloaded_weights(info: dict, model_type: str, folder: str, config_key: str,
                            missing_ok: tuple[str, ...] = ()) -> None:
    """Refuse a model whose parameters were not all read from its weights (``from_pretrained``'s
    ``output_loading_info``): missing names or other shapes would be trained from a random start.
    ``missing_ok``: name prefixes the caller does not use (a critic has no use for ``lm_head``)."""
    missing = sorted(k for k in info.get("missing_keys", ()) if not k.startswith(missing_ok))
    mismatched = sorted(info.get("mismatched_keys", ()))  # by name: the example is the same on every run
    if not missing and not mismatched:
        return
    unexpected = sorted(info.get("unexpected_keys", ()))
    if mismatched:
        key, stored, built = mismatched[0]
        problem = (f"{len(mismatched)} weights have other shapes than its config.json describes, e.g. {key}: "
                   f"{list(stored)} in the file, {list(built)} in the model")
        fix = "the config.json belongs to another model size, or was edited: use the config.json that came with " \
              "the weights"
    else:
        problem = f"{len(missing)} of the model's weights are not in its weight files, e.g. {', '.join(missing[:3])}"
        prefix = _common_prefix_added(missing, unexpected)
        if prefix:
            fix = (f"the files name them with a prefix ({prefix!r}, e.g. {unexpected[0]}): a state dict saved from a "
                   f"wrapped model; save it again from the unwrapped model with save_pretrained, or strip the prefix")
        elif unexpected:
            fix = (f"the files hold other names ({', '.join(unexpected[:2])}, ...): they are another model's "
                   f"weights, or a partial save")
        else:
            fix = "a weight file is missing, or the save was partial: download or save the model again"
    raise ModelLoadError(f"{folder!r} (from `{config_key}`, model_type {model_type!r}): {problem}; they would be "
                         f"trained from random values. {fix[0].upper()}{fix[1:]}")


def _common_prefix_added(missing: list[str], unexpected: list[str]) -> str | None:
    """The prefix the weight files put before the model's names (``module.``, ``_orig_mod.``), if one does."""
    if not missing or not unexpected:
        return None
    for name in unexpected:
        for wanted in missing:
            if name.endswith("." + wanted) or (wanted.startswith("model.") and name.endswith("." + wanted[6:])):
                tail = wanted if name.endswith("." + wanted) else wanted[6:]
                return name[: len(name) - len(tail)]
    return None


def check_tokenizer_files(folder: Path, config_key: str) -> None:
    """Refuse tokenizer files in ``folder`` that are Git LFS pointers (transformers fails on them as bad JSON)."""
    pointers = lfs_pointers(folder, [name for name in TOKENIZER_FILES if (folder / name).is_file()])
    if pointers:
        raise ModelLoadError(f"{folder} (from `{config_key}`): {', '.join(pointers)} is a Git LFS pointer, not the "
                             f"tokenizer: the repository was cloned without Git LFS; {_download_fix(folder)}")


def refuse_empty_tokenizer(tokenizer, name: str, config_key: str) -> None:
    """Refuse a tokenizer that turns text into no tokens: what transformers builds from a folder without
    tokenizer files (a weights-only save), so every prompt would be empty."""
    if tokenizer("Hello, world! 123", add_special_tokens=False)["input_ids"]:
        return
    folder = Path(name).expanduser()
    held = "holds no tokenizer files" if folder.is_dir() and not any(
        (folder / f).is_file() for f in TOKENIZER_FILES) else "gives a tokenizer without a vocabulary"
    section = model_section(config_key)
    where = (f"set `{section}.tokenizer_path` to the folder or hub id of the model it was trained from" if section
             else "load the tokenizer from the folder or hub id of the model it was trained from")
    raise ModelLoadError(f"{name!r} (from `{config_key}`) {held} ({', '.join(TOKENIZER_FILES[:3])}, ...), so its "
                         f"tokenizer turns every text into no tokens: the model was saved without its tokenizer. "
                         f"Copy the base model's tokenizer into it (tokenizer.save_pretrained(folder)), or {where}")
