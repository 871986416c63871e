"""Partial rollouts: new weights arrive while a batch is being generated, and its unfinished responses
go on with them (``async_training.partial_rollout=true``, docs/async.md).

The engine is asked after every decode step whether a swap waits (:meth:`WeightSwap.pending`); if so,
every row stops there. Rows that finished keep what they drew; the weights are swapped
(:meth:`WeightSwap.apply`), and the unfinished rows go on from their prompt and the tokens drawn so
far, prefilled again under the new weights, their sampling seeds continued at the step where they
stopped (:mod:`verl.rollout.seeding`: the token of step ``t`` is drawn with ``(seed, t)``). So a
swap to the same weights changes nothing, and after a real one every token's log-prob is that of the
weights that drew it: the rollout's log-probs describe the mixture of versions the response came from.
Each row reports the version that drew its last token (``policy_version_last``). An engine with a row
bound (``max_num_seqs``) is handed that many rows at a time: a swap stops every row, and rows still
waiting for a slot would have drawn nothing. This is how hf and native take a swap (they decode their rows
in step); the vllm engine steps vLLM's own and takes it there (``VLLMRollout.generate_resumable``).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch
import torch.nn.functional as F


class WeightSwap(Protocol):
    """What the rollout side offers a generation: new weights, when the trainer has sent some."""

    version: int
    """The policy version of the weights held now."""

    def pending(self) -> bool:
        """Whether newer weights wait to be loaded (never blocks)."""

    def apply(self) -> None:
        """Load the newest weights that wait; ``version`` becomes theirs."""


def join_generations(parts: list[tuple[torch.Tensor, torch.Tensor | None]],
                     pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``(responses, log_probs or None)`` of generations of consecutive rows as one: padded to the widest
    (pad tokens, log-prob 0) and stacked in order."""
    width = max(responses.shape[1] for responses, _ in parts)
    responses = torch.cat([F.pad(r, (0, width - r.shape[1]), value=pad_token_id) for r, _ in parts])
    if parts[0][1] is None:
        return responses, None
    return responses, torch.cat([F.pad(lp, (0, width - lp.shape[1])) for _, lp in parts])


def generate_resumable(engine, input_ids: torch.Tensor, attention_mask: torch.Tensor, params, seeds: torch.Tensor,
                       swap: WeightSwap, media: list | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``engine.generate_responses`` (hf or native) that swaps weights whenever ``swap`` has new ones:
    responses ``[B, W]``, their log-probs (with ``params.logprobs``) and each row's last version ``[B]``.
    ``media``: each row's images (a vision-language model's ``multi_modal_inputs``, None for a row without);
    a row that goes on after a swap is prefilled again with its images, the tokens it drew being text."""
    cap = engine.rows_at_once(params)
    if cap is not None and input_ids.shape[0] > cap:  # a pause stops every row: no slots refilled across it
        parts = [generate_resumable(engine, input_ids[at:at + cap], attention_mask[at:at + cap], params,
                                    seeds[at:at + cap], swap, None if media is None else media[at:at + cap])
                 for at in range(0, input_ids.shape[0], cap)]
        responses, log_probs = join_generations([part[:2] for part in parts], engine.pad_token_id)
        return responses, log_probs, torch.cat([part[2] for part in parts])
    if swap.pending():
        swap.apply()
    batch, max_new = input_ids.shape[0], params.max_new_tokens
    responses = torch.full((batch, max_new), engine.pad_token_id, dtype=torch.long)
    log_probs = torch.zeros(batch, max_new)
    last = torch.full((batch,), swap.version, dtype=torch.long)
    rows = torch.arange(batch)  # the output rows still generating
    eos = torch.tensor(engine.eos_token_ids)
    done = 0  # tokens drawn by every row still generating
    ids, mask = input_ids, attention_mask
    while True:
        part_params = dataclasses.replace(params, max_new_tokens=max_new - done)
        images = {} if media is None else {"media": [media[row] for row in rows.tolist()]}
        part, part_log_probs = engine.generate_responses(ids, mask, part_params, seeds[rows], first_step=done,
                                                         pause=swap.pending, **images)
        part = part.cpu()
        width = part.shape[1]
        responses[rows, done:done + width] = part
        if part_log_probs is not None:
            log_probs[rows, done:done + width] = part_log_probs.float().cpu()
        last[rows] = swap.version
        done += width
        going = ~torch.isin(part, eos).any(dim=1)
        if done >= max_new or not going.any():
            break
        # Stopped for a swap: the unfinished rows go on under the new weights from where they are.
        swap.apply()
        kept = going.nonzero().squeeze(-1)
        ids = torch.cat([ids[kept.to(ids.device)], part[kept].to(ids.device)], dim=1)
        mask = torch.cat([mask[kept.to(mask.device)], mask.new_ones(len(kept), width)], dim=1)
        rows = rows[kept]
    return responses[:, :done], (log_probs[:, :done] if params.logprobs else None), last
