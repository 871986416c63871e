"""Rows from Hugging Face ``datasets``: a dataset folder on disk or a dataset name on the hub.

Spelling, wherever a data file is accepted (``data.train_files``, ``data.val_files``)::

    openai/gsm8k                 the hub dataset, its default config, the split of the setting
    openai/gsm8k:main@test       config "main", split "test"
    /data/gsm8k_hf               a folder: written by save_to_disk, or holding data files
    /data/gsm8k_hf@train         the same, split "train"

The split defaults to "train" for training files and "test" (else "validation") for validation
files. The ``datasets`` library is imported only when such a source is used.
"""

from __future__ import annotations

import re
from pathlib import Path

from verl.errors import DataError

# owner/name or name, optional :config and @split; what a local file path rarely looks like.
_HUB_NAME = re.compile(r"^(?P<name>[A-Za-z0-9][\w.-]*(?:/[\w.-]+)?)(?::(?P<config>[\w.-]+))?(?:@(?P<split>[\w.-]+))?$")


def split_spec(spec: str) -> tuple[str, str | None]:
    """``("path or name[:config]", split or None)`` from ``source@split``."""
    base, at, split = spec.rpartition("@")
    return (base, split) if at and base and "/" not in split else (spec, None)


def looks_like_hub_name(spec: str) -> bool:
    return bool(_HUB_NAME.match(spec)) and not spec.startswith((".", "/", "~"))


def _datasets(config_key: str):
    try:
        import datasets
    except ImportError:
        raise DataError(f"`{config_key}` names a Hugging Face dataset, which needs the datasets library: "
                        f"pip install datasets (or give a .parquet / .jsonl file)") from None
    return datasets


def _pick_split(dataset_dict, split: str | None, default: str, source: str, config_key: str):
    available = list(dataset_dict.keys())
    if split is not None:
        if split not in available:
            raise DataError(f"{source} has no split {split!r}; its splits: {available}. "
                            f"Set `{config_key}` to {source}@<split>")
        return dataset_dict[split]
    for name in (default, "validation") if default == "test" else (default,):
        if name in available:
            return dataset_dict[name]
    if len(available) == 1:
        return dataset_dict[available[0]]
    raise DataError(f"{source} has no {default!r} split; its splits: {available}. "
                    f"Choose one with `{config_key}={source}@<split>`")


_DATA_KINDS = (".parquet", ".jsonl", ".json", ".csv", ".tsv", ".arrow")
_METADATA = {"dataset_infos.json", "dataset_info.json", "state.json", "dataset_dict.json"}  # not rows


def _refuse_mixed_kinds(folder: Path, config_key: str) -> None:
    """A folder of data files of several kinds: ``datasets`` reads the most common kind and drops the others
    without a word (train.parquet beside extra.jsonl gave the parquet's rows only), or fails on a stray file
    (DatasetGenerationError for a stats.json). Refused, naming the kinds and the pattern that picks one."""
    kinds: dict[str, list[str]] = {}
    for file in sorted(folder.rglob("*")):
        hidden = any(part.startswith((".", "_")) for part in file.relative_to(folder).parts)
        if file.is_file() and file.suffix in _DATA_KINDS and file.name not in _METADATA and not hidden:
            kinds.setdefault(file.suffix, []).append(str(file.relative_to(folder)))
    if len(kinds) > 1:
        held = "; ".join(f"{kind}: {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"
                         for kind, names in kinds.items())
        main = max(kinds, key=lambda kind: (len(kinds[kind]), -_DATA_KINDS.index(kind)))
        raise DataError(f"{folder} (from `{config_key}`) holds data files of {len(kinds)} kinds ({held}), and a "
                        f"folder is read as one kind; give the files themselves, e.g. "
                        f"{config_key}='{folder}/*{main}', or a list of them")


def read_local_dataset(folder: Path, split: str | None, default_split: str, config_key: str) -> list[dict]:
    """Rows of a dataset folder: ``save_to_disk`` output, or a folder of data files."""
    datasets = _datasets(config_key)
    if (folder / "dataset_dict.json").exists() or (folder / "state.json").exists():
        loaded = datasets.load_from_disk(str(folder))
    else:
        _refuse_mixed_kinds(folder, config_key)
        try:
            loaded = datasets.load_dataset(str(folder))
        except Exception as e:  # noqa: BLE001 - the library raises many types for an unreadable folder
            raise DataError(f"cannot read {folder} (from `{config_key}`) as a Hugging Face dataset folder: "
                            f"{type(e).__name__}: {e}. Point `{config_key}` at a .parquet/.jsonl file, "
                            f"a save_to_disk folder, or a folder of data files") from e
    if isinstance(loaded, datasets.DatasetDict):
        loaded = _pick_split(loaded, split, default_split, str(folder), config_key)
    return loaded.to_list()


def read_hub_dataset(spec: str, default_split: str, config_key: str) -> list[dict]:
    """Rows of a hub dataset (downloaded through the ``datasets`` cache)."""
    match = _HUB_NAME.match(spec)
    name, config, split = match["name"], match["config"], match["split"]
    datasets = _datasets(config_key)
    try:
        loaded = datasets.load_dataset(name, config)
    except Exception as e:  # noqa: BLE001 - offline, missing and gated datasets raise different types
        raise DataError(
            f"`{config_key}`={spec!r} is neither an existing file or folder nor a Hugging Face dataset that "
            f"could be loaded ({type(e).__name__}: {str(e)[:300]}). Check the path; or, for a hub dataset, "
            f"check the name and the network (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE unset), or download it "
            f"where there is network (datasets.load_dataset(...).save_to_disk(folder)) and set "
            f"`{config_key}` to that folder") from e
    return _pick_split(loaded, split, default_split, name, config_key).to_list()
