"""A KV-cache decode loop of our own around a Hugging Face causal LM: fast rollout on CPU and small models.

The engine calls the model's forward itself (one prefill, then one token per row per step, with
the model's own KV cache class) instead of ``transformers.generate``, which decodes every row of
the batch until the last one stops and prefills every sample of a prompt. Here:

- **the samples of a prompt share its prefill**: each distinct (prompt, mask) row is prefilled once
  and its cache rows are then gathered out to its ``n`` samples (they arrive as adjacent rows);
- **finished rows leave the batch**: a row that emits EOS is dropped from the decode batch and its
  cache rows from the cache (a batch gather) once finished rows make up ``compact_fraction`` of the
  batch, so decode compute follows the rows still going instead of the longest response;
- **the cache** is transformers' ``DynamicCache`` (``cache="dynamic"``, the default) or a
  preallocated one (``cache="static"``): each layer's keys and values in one buffer sized for the
  whole generation, written in place, attention reading views of the filled part. On a CPU the two
  measure the same or dynamic slightly ahead (docs/performance.md): a view of a growing buffer is
  not contiguous, so attention pays the copy that the dynamic cache's concatenation pays.

Sampling is exactly :mod:`verl.rollout.seeding`, as in the ``hf`` engine: ``filter_logits`` then
``draw`` with each row's own seed and the decode step, so both engines draw the same tokens for the
same seeds (up to float rounding of the logits) and a row's response does not depend on the batch.
Greedy decoding is the argmax; its log-probs are the raw logits' ``log_softmax`` (temperature 1).
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from verl.rollout.base import RolloutEngine, SamplingParams
from verl.rollout.seeding import draw, filter_logits

CACHE_KINDS = ("dynamic", "static")


def distinct_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, inverse)``: the index ``[U]`` of the first row of each distinct (ids, mask) row, in
    increasing order, and for every row ``[B]`` the position of its prompt among them, so that
    ``rows[first][inverse] == rows``. All rows distinct: both are ``arange(B)``."""
    rows = torch.cat([input_ids, attention_mask.to(input_ids.dtype)], dim=1)
    _, groups = torch.unique(rows, dim=0, return_inverse=True)  # groups numbered in sorted order
    index = torch.arange(len(groups), device=groups.device)
    first = torch.full((int(groups.max()) + 1,), len(groups), dtype=torch.long, device=groups.device)
    first.scatter_reduce_(0, groups, index, reduce="amin")
    order = first.argsort()
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=order.device)
    return first[order], rank[groups]


class PreallocatedLayer(DynamicLayer):
    """A transformers ``DynamicLayer`` whose keys and values live in one buffer of ``capacity``
    positions, written in place; ``update`` returns views of the filled part, so attention costs
    what the dynamic cache's does without re-copying the whole cache at every step."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.length = capacity, 0

    def lazy_initialization(self, key_states, value_states):
        super().lazy_initialization(key_states, value_states)
        batch, heads, _, _ = key_states.shape
        self.key_buffer = key_states.new_empty(batch, heads, self.capacity, key_states.shape[-1])
        self.value_buffer = value_states.new_empty(batch, heads, self.capacity, value_states.shape[-1])

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        self.key_buffer[:, :, self.length:end] = key_states
        self.value_buffer[:, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if not self.length:
            return
        if len(indices) > len(self.key_buffer):  # growing: the prefill's rows handed out to their samples
            self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
        else:  # shrinking: the kept rows' filled part moves to the front, and the buffer stays
            kept = len(indices)
            self.key_buffer[:kept, :, :self.length] = self.key_buffer[indices, :, :self.length]
            self.value_buffer[:kept, :, :self.length] = self.value_buffer[indices, :, :self.length]
            self.key_buffer, self.value_buffer = self.key_buffer[:kept], self.value_buffer[:kept]
        self.keys, self.values = self.key_buffer[:, :, :self.length], self.value_buffer[:, :, :self.length]


def make_cache(model, kind: str, capacity: int) -> DynamicCache:
    """An empty KV cache of ``kind`` (see :data:`CACHE_KINDS`) for ``model``, ``capacity`` positions long."""
    cache = DynamicCache(config=model.config)
    if kind == "static":
        # Only plain full-attention layers are swapped: sliding-window and other special layers keep
        # transformers' own behaviour.
        cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer
                        for layer in cache.layers]
    return cache


class NativeRollout(RolloutEngine):
    name = "native"

    def __init__(self, model: torch.nn.Module, tokenizer, *, device: torch.device | str | None = None,
                 seed: int = 0, cache: str = "dynamic", compact_fraction: float = 0.125):
        eos = model.generation_config.eos_token_id if model.generation_config.eos_token_id is not None \
            else tokenizer.eos_token_id
        super().__init__(eos, tokenizer.pad_token_id, seed)
        if cache not in CACHE_KINDS:
            raise ValueError(f"unknown native rollout cache {cache!r}; choose one of {CACHE_KINDS}")
        self.model, self.cache = model, cache
        # Finished rows are dropped from the decode batch once they are this share of it (at least one).
        self.compact_fraction = compact_fraction
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        # transformers renamed the forward's ``past_key_values`` to ``cache`` (the old name warns, then goes).
        self._cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def _forward(self, input_ids, attention_mask, position_ids, cache) -> torch.Tensor:
        """Float32 logits ``[b, V]`` of the last position."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=1, **{self._cache_kwarg: cache})
        return out.logits[:, -1].float()

    @staticmethod
    def _pick(logits: torch.Tensor, params: SamplingParams, seeds: torch.Tensor, step: int):
        """Tokens ``[b]`` and their log-probs ``[b]`` under the distribution they were drawn from."""
        if params.greedy:
            tokens = logits.argmax(dim=-1)
            return tokens, torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return draw(filter_logits(logits, params.temperature, params.top_k, params.top_p), seeds, step)

    @torch.no_grad()
    def generate_responses(self, input_ids, attention_mask, params: SamplingParams, seeds):
        was_training = self.model.training
        self.model.eval()
        try:
            return self._generate(input_ids.to(self.device), attention_mask.to(self.device), params, seeds.cpu())
        finally:
            self.model.train(was_training)

    def _generate(self, input_ids, attention_mask, params: SamplingParams, seeds):
        batch, prompt_len = input_ids.shape
        max_new = params.max_new_tokens
        responses = torch.full((batch, max_new), self.pad_token_id, dtype=torch.long, device=self.device)
        log_probs = torch.zeros(batch, max_new, device=self.device)
        if max_new == 0 or batch == 0:
            return responses, log_probs if params.logprobs else None

        # Prefill once per distinct prompt, then give every sample its prompt's cache rows and logits.
        first, inverse = distinct_prompts(input_ids, attention_mask)
        mask = attention_mask.long()
        positions = mask.cumsum(dim=1) - 1
        positions = positions.masked_fill(mask == 0, 1)  # pads attend nowhere; as transformers' generate does
        cache = make_cache(self.model, self.cache, prompt_len + max_new)
        logits = self._forward(input_ids[first], mask[first], positions[first], cache)[inverse]
        if len(first) < batch:
            cache.batch_select_indices(inverse)

        rows = torch.arange(batch, device=self.device)  # the output row of each decode row
        live = torch.ones(batch, dtype=torch.bool, device=self.device)  # decode rows still generating
        seeds = seeds.to(self.device)
        next_position = mask.sum(dim=1, keepdim=True)
        eos = torch.tensor(self.eos_token_ids, device=self.device)
        width = 0
        for step in range(max_new):
            tokens, token_log_probs = self._pick(logits, params, seeds[rows], step)
            responses[rows[live], step] = tokens[live]
            log_probs[rows[live], step] = token_log_probs[live]
            width = step + 1
            live &= ~torch.isin(tokens, eos)
            still_going = int(live.sum())
            if step + 1 == max_new or still_going == 0:
                break
            # Finished rows leave the batch and the cache once enough of them gather: every compaction
            # copies the cache, every dead row left in costs one row of decode compute per step.
            if len(rows) - still_going >= max(1, int(self.compact_fraction * len(rows))):
                keep = live.nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                rows, live, mask, next_position, tokens = (rows[keep], live[keep], mask[keep], next_position[keep],
                                                           tokens[keep])
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
            logits = self._forward(tokens.unsqueeze(-1), mask, next_position, cache)
            next_position = next_position + 1
        return responses[:, :width], log_probs[:, :width] if params.logprobs else None

    def sync_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(weights)
