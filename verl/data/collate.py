"""Turning dataset items into a prompt Batch (left-padded, ready for generation)."""

from __future__ import annotations

import numbers
import uuid
from collections.abc import Mapping
from typing import Any

import torch

from verl.data.io import DataError
from verl.protocol import Batch

NON_TENSOR_KEYS = ("raw_prompt", "data_source", "ground_truth", "extra_info", "index")
# An image prompt's processed pixels and its images (verl.data.vision), carried per row when present.
MEDIA_KEYS = ("multi_modal_inputs", "multi_modal_data")
# What a dataset item must hold (an RLDataset item, or one of a data.custom_cls class).
ITEM_KEYS = ("input_ids", *NON_TENSOR_KEYS)


def item_problem(item: Any) -> str | None:
    """What is wrong with a dataset item for :func:`collate_prompts`, or None."""
    if not isinstance(item, Mapping):
        return f"is a {type(item).__name__}, not a dict"
    missing = [key for key in ITEM_KEYS if key not in item]
    if missing:
        return f"lacks {', '.join(missing)} (it holds {', '.join(map(str, item)) or 'nothing'})"
    ids = item["input_ids"]
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist() if ids.dim() == 1 else None
    if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(t, numbers.Integral) for t in ids):
        return f"has input_ids {item['input_ids']!r:.100}, not a non-empty list of token ids (ints)"
    return None


def left_pad(sequences: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)``, both ``[B, max_len]`` long, with the padding on the left."""
    if pad_token_id is None:  # tokenizer.pad_token_id of a tokenizer without one: torch.full's TypeError before
        raise DataError("no pad token id to pad the batch with (None: the tokenizer has no pad token, as Llama 3's and "
                        "GPT-2's have not); set tokenizer.pad_token = tokenizer.eos_token first, or load the tokenizer "
                        "with verl.utils.model.load_hf_tokenizer, which does")
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq):] = 1
    return ids, mask


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... over the real tokens; padding on the left gets 0."""
    return (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)


def _token_ids(ids) -> list[int]:
    return ids.tolist() if isinstance(ids, torch.Tensor) else [int(t) for t in ids]


def collate_prompts(items: list[dict], pad_token_id: int, extra_keys: tuple[str, ...] = ()) -> Batch:
    """A Batch of prompts from :class:`~verl.data.dataset.RLDataset` items.

    Tensors: ``input_ids``, ``attention_mask``, ``position_ids`` ``[B, P]`` with P the longest prompt
    in this batch. Non-tensors: ``raw_prompt``, ``data_source``, ``ground_truth``, ``extra_info``,
    ``index``, and ``uid``: a fresh unique id per prompt that its samples will share; with images,
    ``multi_modal_inputs`` and ``multi_modal_data`` (None on a row without).
    """
    if not items:
        raise DataError("collate_prompts got no items")
    for i, item in enumerate(items):
        problem = item_problem(item)
        if problem is not None:
            raise DataError(f"dataset item {i} of this batch {problem}; items must hold {', '.join(ITEM_KEYS)}")
    input_ids, attention_mask = left_pad([_token_ids(item["input_ids"]) for item in items], pad_token_id)
    non_tensors = {key: [item[key] for item in items] for key in NON_TENSOR_KEYS}
    for key in MEDIA_KEYS:
        if any(key in item for item in items):
            non_tensors[key] = [item.get(key) for item in items]
    for key in extra_keys:  # e.g. the column data.reward_fn_key names, which the reward reads
        non_tensors[key] = [item.get(key) for item in items]
    non_tensors["uid"] = [uuid.uuid4().hex for _ in items]
    return Batch({"input_ids": input_ids, "attention_mask": attention_mask,
                  "position_ids": position_ids_from_mask(attention_mask)}, non_tensors)
