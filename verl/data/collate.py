"""Turning dataset items into a prompt Batch (left-padded, ready for generation)."""

from __future__ import annotations

import uuid

import torch

from verl.data.io import DataError
from verl.protocol import Batch

NON_TENSOR_KEYS = ("raw_prompt", "data_source", "ground_truth", "extra_info", "index")


def left_pad(sequences: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)``, both ``[B, max_len]`` long, with the padding on the left."""
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


def collate_prompts(items: list[dict], pad_token_id: int) -> Batch:
    """A Batch of prompts from :class:`~verl.data.dataset.RLDataset` items.

    Tensors: ``input_ids``, ``attention_mask``, ``position_ids`` ``[B, P]`` with P the longest prompt
    in this batch. Non-tensors: ``raw_prompt``, ``data_source``, ``ground_truth``, ``extra_info``,
    ``index``, and ``uid``: a fresh unique id per prompt that its samples will share.
    """
    if not items:
        raise DataError("collate_prompts got no items")
    input_ids, attention_mask = left_pad([item["input_ids"] for item in items], pad_token_id)
    non_tensors = {key: [item[key] for item in items] for key in NON_TENSOR_KEYS}
    non_tensors["uid"] = [uuid.uuid4().hex for _ in items]
    return Batch({"input_ids": input_ids, "attention_mask": attention_mask,
                  "position_ids": position_ids_from_mask(attention_mask)}, non_tensors)
