"""Building the prompt dataset of a run: the built-in :class:`RLDataset`, or the user's class named by
``data.custom_cls`` (verl's key), loaded from a python file.

As in verl, the class must subclass ``torch.utils.data.Dataset`` and is built with

    cls(data_files=<data.train_files or data.val_files>, tokenizer=<the policy's tokenizer>,
        processor=None, config=<the data section>)

and, as verl does, ``max_samples=<data.train_max_samples or val_max_samples>`` when that is set (not -1).
Multimodal processors do not exist here, so ``processor`` is always None.

Its items must be what :func:`~verl.data.collate.collate_prompts` batches (see ``ITEM_KEYS``):
verl's ``RLHFDataset`` items carry no ``input_ids`` (its rollout tokenizes), so a class written for
verl is best ported by subclassing :class:`RLDataset`, which tokenizes once at construction.
"""

from __future__ import annotations

import os
from typing import Any

from torch.utils.data import Dataset

from verl.data.collate import ITEM_KEYS, item_problem
from verl.data.dataset import RLDataset
from verl.errors import ConfigError
from verl.utils.user_file import import_user_file

SETTING = "data.custom_cls"


def load_dataset_class(path: str | os.PathLike, name: str | None) -> type[Dataset]:
    """The class ``name`` of the python file at ``path``, checked to subclass torch's Dataset.

    The file runs on every call and is registered in ``sys.modules`` under a name derived from its
    absolute path, so its classes (and their items) pickle by reference within this process.
    """
    module, path = import_user_file(path, prefix="verl_custom_dataset", what="dataset class file",
                                    key=f"{SETTING}.path", error=ConfigError)
    module_name = module.__name__

    datasets = sorted(n for n, v in vars(module).items()
                      if isinstance(v, type) and issubclass(v, Dataset) and v.__module__ == module_name)
    if not name or not hasattr(module, name):
        what = f"has no class {name!r}" if name else f"is set but {SETTING}.name is not"
        raise ConfigError(f"{SETTING}.path={path} {what}; Dataset classes it defines: {datasets or 'none'}; "
                          f"set {SETTING}.name to one of them")
    cls = getattr(module, name)
    if not (isinstance(cls, type) and issubclass(cls, Dataset)):
        kind = f"class {name} does not subclass torch.utils.data.Dataset" if isinstance(cls, type) \
            else f"{name!r} is a {type(cls).__name__}, not a class"
        raise ConfigError(f"{SETTING}: {kind} ({path}); a dataset class must subclass torch.utils.data.Dataset, "
                          f"e.g. verl.data.RLDataset (docs/data.md)")
    return cls


def create_rl_dataset(data_files: Any, tokenizer, config, *, config_key: str = "data.train_files",
                      tools: list[dict] | None = None, processor=None, seed: int | None = None) -> Dataset:
    """The prompt dataset of ``data_files`` as the trainer builds it from the data section ``config``:
    the class of ``config.custom_cls`` when its path is set, else :class:`RLDataset`.

    ``config_key`` names where the files came from (``data.val_files`` for validation) in errors.
    ``tools``: the OpenAI schemas of a multi-turn run's tools, which the chat template renders into
    every prompt (``apply_chat_template(..., tools=...)``), unless data.chat_template_kwargs sets tools.
    ``processor``: a vision-language policy's (prompts with images, :mod:`verl.data.vision`), or None.
    ``seed``: the seed of a ``*_max_samples`` subset when ``config.seed`` is null (the trainer's seed).
    """
    max_samples = config.val_max_samples if config_key == "data.val_files" else config.train_max_samples
    custom = dict(config.custom_cls)
    unknown = sorted(set(custom) - {"path", "name"})
    if unknown:
        raise ConfigError(f"{SETTING} has unknown keys {unknown}; it takes path and name")
    if custom.get("path") is None:
        kwargs = dict(config.chat_template_kwargs or {})
        if tools and "tools" not in kwargs:
            kwargs["tools"] = tools
        return RLDataset(data_files, tokenizer, config, processor=processor, max_samples=max_samples,
                         config_key=config_key, chat_template_kwargs=kwargs,
                         sample_seed=seed)

    path, name = custom["path"], custom.get("name")
    cls = load_dataset_class(path, name)
    where = f"{SETTING}: {cls.__name__} from {path}"
    try:
        dataset = cls(data_files=data_files, tokenizer=tokenizer, processor=processor, config=config,
                      **({"max_samples": max_samples} if max_samples not in (-1, 0) else {}))
    except Exception as e:
        raise ConfigError(f"{where} failed to build from {config_key}={data_files}: {type(e).__name__}: {e}; "
                          f"it is called as {cls.__name__}(data_files=..., tokenizer=..., processor=None, "
                          f"config=<the data section>)") from e
    try:
        size = len(dataset)
    except TypeError as e:
        raise ConfigError(f"{where}: the dataset has no len(); define __len__") from e
    if size == 0:
        raise ConfigError(f"{where} holds no prompts for {config_key}={data_files}")
    # The first item, now: a wrong item layout fails before any model is loaded.
    item = dataset[0]
    problem = item_problem(item)
    if problem is None and len(item["input_ids"]) > config.max_prompt_length:
        problem = (f"has a prompt {len(item['input_ids'])} tokens long, over data.max_prompt_length="
                   f"{config.max_prompt_length}")
    if problem is not None:
        raise ConfigError(f"{where}: item 0 of {config_key} {problem}. Items must hold {', '.join(ITEM_KEYS)} "
                          f"(input_ids: the prompt's token ids); subclass verl.data.RLDataset, which makes "
                          f"them, and override prompt_of or __getitem__ (docs/data.md)")
    return dataset
