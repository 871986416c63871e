"""The tutorial's dict batch -> :class:`~verl.protocol.Batch` in verl's token layout.

The tutorial hands ``PPOTrainer.step`` a dict: ``input_ids [B, T]`` (prompt then response),
``attention_mask``, ``prompt_mask`` (1 on prompt tokens) and ``reward`` (one number per row).
Rows may be padded on either side; only tokens with attention 1 count.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import torch

from verl.data.collate import left_pad
from verl.errors import VerlError, closest_name
from verl.models.loading import refuse_ids_outside
from verl.protocol import Batch

logger = logging.getLogger(__name__)

REQUIRED = ("input_ids", "prompt_mask", "reward")
READ = (*REQUIRED, "attention_mask")
NEEDS = "PPOTrainer.step needs input_ids [B, T], prompt_mask [B, T] (1 on prompt tokens), reward [B] and " \
        "optionally attention_mask [B, T]"
_said: set = set()  # what was said once: unread keys, unmasked padding
# Other names a column is often given under (TRL's "rewards", a scorer's "score"); difflib finds the near spellings.
OTHER_NAMES = {"reward": ("rewards", "score", "scores", "reward_score", "returns"),
               "prompt_mask": ("prompt_masks", "prompts_mask", "prompt_attention_mask"),
               "input_ids": ("ids", "input_id", "tokens", "token_ids", "sequences")}


def named_otherwise(missing: list[str], keys) -> str:
    """`` ('rewards' is there: name it 'reward')`` for each missing column given under another name, else ""."""
    keys = [str(k) for k in keys]
    hints = []
    for name in missing:
        close = closest_name(name, keys, cutoff=0.75, synonyms=OTHER_NAMES.get(name, ()))
        if close:
            hints.append(f"{close!r} is there: name it {name!r}")
        keys = [k for k in keys if k != close]
    return f" ({'; '.join(hints)})" if hints else ""


def _tensor(value, name: str) -> torch.Tensor:
    """``value`` as one tensor; rows of several lengths (lists from a tokenizer without padding) are named with
    the fix, not torch's "expected sequence of length 4 at dim 1 (got 6)"."""
    if value is None:  # e.g. prompt_mask=None: "could not infer dtype of NoneType" before, and a padding hint
        raise VerlError(f"the batch's {name} is None; give a tensor [B, T] (one row per sequence). {NEEDS}")
    try:
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, (torch.Tensor, np.ndarray)) for v in value):
            return torch.stack([torch.as_tensor(v) for v in value])  # one tensor per row, as a loop collects them
        return torch.as_tensor(value)
    except (ValueError, TypeError, RuntimeError) as e:
        raise VerlError(f"{name} cannot be made one tensor ({e}): are its rows of different lengths? Pad them to "
                        f"one length (tokenizer(..., padding=True, return_tensors='pt')) and give attention_mask, "
                        f"0 on the padding") from None


def _token_ids(value) -> torch.Tensor:
    """Token ids as integers: a float tensor of whole numbers is taken (and converted), a fraction is not."""
    ids = _tensor(value, "input_ids")
    if ids.is_floating_point() or ids.is_complex():
        if ids.is_complex() or not torch.equal(ids, ids.round()):
            raise VerlError(f"input_ids must hold token ids (whole numbers), got a {ids.dtype} tensor with "
                            f"fractions; encode the text with the worker's tokenizer")
        ids = ids.long()
    return ids


def _mask(value, name: str, input_ids: torch.Tensor) -> torch.Tensor:
    mask = _tensor(value, name)
    if mask.numel() != input_ids.numel():
        raise VerlError(f"{name} has shape {list(mask.shape)} but input_ids has {list(input_ids.shape)}; give "
                        f"{name} the shape of input_ids (one entry per token)")
    return mask.reshape(input_ids.shape)


def _say_unmasked_padding(input_ids: torch.Tensor, pad_token_id: int) -> None:
    """Rows that begin with the pad token, or end with it twice, in a batch without attention_mask: padding that
    every token counts as (trained as prompt or response, the reward put on a pad token). Said once a process."""
    padded = (input_ids[:, 0] == pad_token_id)
    if input_ids.shape[1] > 1:
        padded |= (input_ids[:, -2:] == pad_token_id).all(dim=1)
    if padded.any() and "unmasked padding" not in _said:
        _said.add("unmasked padding")
        rows = padded.nonzero().flatten().tolist()
        logger.warning("PPOTrainer.step: %d of %d row(s) of input_ids begin or end with the pad token (id %d), e.g. "
                       "row %d, and the batch has no attention_mask, so that padding is trained as prompt or response "
                       "tokens; give attention_mask (0 on padding), as the tokenizer returns it", len(rows),
                       input_ids.shape[0], pad_token_id, rows[0])


LAYOUT = ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids", "reward")


def check_layout(batch: Batch) -> None:
    """A Batch handed to ``step`` is taken in verl's layout (``generate_sequences``' output) with a reward column;
    one without them is named here, before any model runs, not as a KeyError after the log-probs."""
    missing = [k for k in LAYOUT if k not in batch]
    if missing:
        raise VerlError(f"the Batch given to PPOTrainer.step lacks {missing} (it has {batch.keys()})"
                        f"{named_otherwise(missing, batch.keys())}; give a Batch "
                        f"in verl's layout, e.g. worker.generate_sequences' output with batch['reward'] = one reward "
                        f"per row [B], or the tutorial's dict. {NEEDS}")


def batch_from_dict(data: dict, pad_token_id: int, normalize_reward, vocab_size: int | None = None) -> Batch:
    """``vocab_size``: the model's number of token ids (its embedding rows); an id outside it is an error
    naming the row and position (ids of another tokenizer), not an index error deep in the model."""
    if not isinstance(data, Mapping):  # a list of row dicts, a tuple of tensors: the dict of stacked rows is meant
        got = f"a {type(data).__name__}" + (f" of {len(data)} {type(data[0]).__name__}(s)"
                                            if isinstance(data, (list, tuple)) and data else "")
        raise VerlError(f"the batch is {got}, not a dict; stack the rows into one dict of tensors. {NEEDS}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise VerlError(f"the batch dict lacks {missing}{named_otherwise(missing, data)}; {NEEDS}")
    unread = tuple(sorted(str(k) for k in data if k not in READ))
    if unread and unread not in _said:  # e.g. "advantages" or "labels": said once, not used silently
        _said.add(unread)
        logger.warning("PPOTrainer.step does not read %s of the batch dict (it computes log-probs, values and "
                       "advantages itself); it reads %s", list(unread), ", ".join(READ))
    input_ids = _token_ids(data["input_ids"])
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if input_ids.dim() != 2:
        raise VerlError(f"input_ids has shape {list(input_ids.shape)}; {NEEDS}")
    if not input_ids.shape[0]:
        raise VerlError(f"the batch has no rows (input_ids has shape {list(input_ids.shape)}); give at least one")
    refuse_ids_outside(input_ids, vocab_size)
    if data.get("attention_mask") is None:  # left out, or None as a Hugging Face model takes it: no padding
        _say_unmasked_padding(input_ids, pad_token_id)
        attention_mask = torch.ones_like(input_ids)
    else:
        attention_mask = _mask(data["attention_mask"], "attention_mask", input_ids)
    prompt_mask = _mask(data["prompt_mask"], "prompt_mask", input_ids)
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
        marks = prompt_mask[row][real].bool()
        if not marks[:len(prompts[-1])].all():  # a prompt token after a response token: the order would change
            first = int((~marks).nonzero()[0])
            raise VerlError(f"row {row} of the batch has a prompt token after its response begins (prompt_mask is 0 "
                            f"at real token {first}, 1 later): prompt_mask must be 1 on the prompt, which comes "
                            f"first, and 0 on the response after it (is it a response mask, 1 - prompt_mask?)")
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
