"""The tutorial's dict batch -> :class:`~verl.protocol.Batch` in verl's token layout.

The tutorial hands ``PPOTrainer.step`` a dict: ``input_ids [B, T]`` (prompt then response),
``attention_mask``, ``prompt_mask`` (1 on prompt tokens) and ``reward`` (one number per row).
Rows may be padded on either side; only tokens with attention 1 count.
"""

from __future__ import annotations

import torch

from verl.data.collate import left_pad
from verl.errors import VerlError
from verl.protocol import Batch

REQUIRED = ("input_ids", "prompt_mask", "reward")


def batch_from_dict(data: dict, pad_token_id: int, normalize_reward) -> Batch:
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise VerlError(f"the batch dict lacks {missing}; PPOTrainer.step needs input_ids [B, T], "
                        f"prompt_mask [B, T] (1 on prompt tokens), reward [B] and optionally attention_mask")
    input_ids = torch.as_tensor(data["input_ids"])
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    attention_mask = torch.as_tensor(data.get("attention_mask", torch.ones_like(input_ids))).reshape(input_ids.shape)
    prompt_mask = torch.as_tensor(data["prompt_mask"]).reshape(input_ids.shape)
    prompts, responses = [], []
    for row in range(input_ids.shape[0]):
        real = attention_mask[row].bool()
        is_prompt = prompt_mask[row].bool() & real
        is_response = ~prompt_mask[row].bool() & real
        prompts.append(input_ids[row][is_prompt].tolist())
        responses.append(input_ids[row][is_response].tolist())
        if not prompts[-1] or not responses[-1]:
            raise VerlError(f"row {row} of the batch has {len(prompts[-1])} prompt and {len(responses[-1])} "
                            f"response tokens; each row needs both (prompt_mask marks the prompt)")
    prompt_ids, prompt_attn = left_pad(prompts, pad_token_id)
    width = max(len(r) for r in responses)
    response_ids = torch.full((len(responses), width), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((len(responses), width), dtype=torch.long)
    for row, tokens in enumerate(responses):
        response_ids[row, :len(tokens)] = torch.tensor(tokens)
        response_mask[row, :len(tokens)] = 1
    full_mask = torch.cat([prompt_attn, response_mask], dim=1)
    return Batch({
        "prompts": prompt_ids, "responses": response_ids, "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, response_ids], dim=1), "attention_mask": full_mask,
        "position_ids": (full_mask.cumsum(dim=1) - 1).clamp(min=0),
        "reward": normalize_reward(data["reward"], len(prompts)),
    })
