"""A KV-cache decode loop of our own around a Hugging Face causal LM: fast rollout on CPU and small models.

The engine runs one prefill, then one token per row per step, itself, instead of
``transformers.generate``, which decodes every row of the batch until the last one stops and
prefills every sample of a prompt. For Qwen2, Qwen3, Llama, Mistral and Phi-3 the steps run through
:class:`verl.rollout.fast_decoder.FastDecoder`, a lean functional copy of their forward that reads
the module's weights at every call (at these sizes most of a Hugging Face forward is per-op
overhead: mask building, cache bookkeeping, module calls); any other model, or one the fast path
does not cover (forward hooks, sharded parameters, another RoPE type, ...), runs its own forward
with a transformers KV cache. ``last_path`` and ``fallback_reason`` tell which ran. Either way:

- **the samples of a prompt share its prefill**: each distinct (prompt, mask) row is prefilled once
  and its cache rows are then gathered out to its ``n`` samples (they arrive as adjacent rows);
- **finished rows leave the batch**: a row that emits EOS is dropped from the decode batch and its
  cache rows from the cache (a batch gather) once finished rows make up ``compact_fraction`` of the
  batch, so decode compute follows the rows still going instead of the longest response;
- **continuous batching** (``max_num_seqs``, the rollout section's key): at most that many rows decode at
  once; the others wait, and take the cache rows of finished ones (their prompts prefilled, placed to end
  at the cache's last column, the columns before masked), so the decode batch stays full while rows wait
  and the KV cache holds ``max_num_seqs`` rows, not the whole batch. The model-forward path runs waves of
  ``max_num_seqs`` rows instead. A row's tokens do not depend on when it got its slot;
- **the cache** (Hugging Face forward) is transformers' ``DynamicCache`` (``cache="dynamic"``, the default) or a
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

import logging
import re

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from verl.models.shared_prompt import cache_kwarg, distinct_prompts
from verl.models.vision import forbid_placeholders, forward_inputs, placeholder_ids
from verl.rollout.base import RolloutEngine, SamplingParams, policy_eos
from verl.rollout.fast_decoder import FastDecoder, unsupported_reason
from verl.rollout.partial import join_generations
from verl.rollout.row_decoder import RowDecoder, Rows, assemble
from verl.rollout.seeding import draw, filter_logits

logger = logging.getLogger(__name__)
_reported: set[str] = set()  # fallback reasons said (their numbers left out: a window and a length vary per call)

CACHE_KINDS = ("dynamic", "static")


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


class _HFSteps:
    """Prefill and decode through the model's own forward and a transformers cache: any causal LM."""

    def __init__(self, engine: "NativeRollout"):
        self.engine = engine

    def prefill(self, input_ids, attention_mask, positions, capacity: int, **extra) -> torch.Tensor:
        """``extra``: more inputs of the prefill (a vision-language model's images)."""
        self.cache = make_cache(self.engine.model, self.engine.cache, capacity)
        self.mask = attention_mask
        return self._forward(input_ids, positions, **extra)

    def select(self, index: torch.Tensor) -> None:
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(tokens), 1)], dim=1)
        return self._forward(tokens.unsqueeze(-1), positions.unsqueeze(-1))

    def _forward(self, input_ids, position_ids, **extra) -> torch.Tensor:
        """Float32 logits ``[b, V]`` of the last position."""
        engine = self.engine
        out = engine.model(input_ids=input_ids, attention_mask=self.mask, position_ids=position_ids,
                           use_cache=True, logits_to_keep=1, **{engine._cache_kwarg: self.cache}, **extra)
        return out.logits[:, -1].float()


class NativeRollout(RolloutEngine):
    """``fast=True`` (the default): Llama-family models (:mod:`verl.rollout.fast_decoder`) decode
    through :class:`~verl.rollout.fast_decoder.FastDecoder`, every other model (or one with forward
    hooks, sharded parameters, ...) through its Hugging Face forward; after each call ``last_path``
    says which ran (``"fast"`` or ``"hf"``) and ``fallback_reason`` why the fast one did not."""

    name = "native"
    takes_images = True

    def __init__(self, model: torch.nn.Module, tokenizer, *, device: torch.device | str | None = None,
                 seed: int = 0, cache: str = "dynamic", compact_fraction: float = 0.125, fast: bool = True,
                 max_num_seqs: int | None = None, generation_batch_size: int | None = None):
        super().__init__(policy_eos(model, tokenizer), tokenizer.pad_token_id, seed)
        if cache not in CACHE_KINDS:
            raise ValueError(f"unknown native rollout cache {cache!r}; choose one of {CACHE_KINDS}")
        self.model, self.cache, self.fast = model, cache, fast
        # Finished rows are dropped from the decode batch once they are this share of it (at least one).
        self.compact_fraction = compact_fraction
        # Most rows decoded at once (max_num_seqs, and generation_batch_size prompts' samples); the others
        # wait, and take the slots of rows that finish (None: all at once).
        self.max_num_seqs, self.generation_batch_size = max_num_seqs, generation_batch_size
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self._cache_kwarg = cache_kwarg(model)
        self.last_path: str | None = None
        self.fallback_reason: str | None = None
        # Rows of each decode forward of the last call (prefill excluded): what compaction left.
        self.last_decode_rows: list[int] = []

    def _steps(self, total_length: int):
        """The decoder for one call: the fast one when the model allows it, else the HF forward.
        Decided (and the weights read) at every call: in the hybrid engine they change between calls."""
        self.fallback_reason = self._fast_reason(total_length)
        self.last_path = "hf" if self.fallback_reason else "fast"
        said = re.sub(r"\d+", "N", self.fallback_reason or "")
        if self.fast and self.fallback_reason and said not in _reported:
            _reported.add(said)
            logger.warning("rollout native: its lean decoder does not run this model (%s); it decodes with the "
                           "model's own Hugging Face forward instead (the same samples, at about the hf engine's "
                           "speed)", self.fallback_reason)
        return _HFSteps(self) if self.fallback_reason else FastDecoder(self.model)

    def _fast_reason(self, total_length: int | None) -> str | None:
        """Why the fast decoder cannot run sequences of ``total_length`` positions (None: it can)."""
        reason = unsupported_reason(self.model, total_length) if self.fast else "fast=False"
        where = next(self.model.parameters()).device
        if reason is None and (where.type != self.device.type or self.device.index not in (None, where.index)):
            reason = f"the parameters are on {where}, the engine computes on {self.device}"
        return reason

    def takes_rows(self, total_length: int | None) -> bool:
        """Whether :meth:`row_decoder` runs sequences of ``total_length`` positions (None: any length)."""
        return self._fast_reason(total_length) is None

    @staticmethod
    def _pick(logits: torch.Tensor, params: SamplingParams, seeds: torch.Tensor, step: int):
        """Tokens ``[b]`` and their log-probs ``[b]`` under the distribution they were drawn from."""
        if params.greedy:
            tokens = logits.argmax(dim=-1)
            return tokens, torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return draw(filter_logits(logits, params.temperature, params.top_k, params.top_p), seeds, step)

    def generate_responses(self, input_ids, attention_mask, params: SamplingParams, seeds, *, first_step: int = 0,
                           pause=None, media=None):
        """``first_step``: the decode step of the first token (a continued response's seeds go on from
        there); ``pause``: a callable asked after every step, True stops every row there (a partial
        rollout's weight swap, :mod:`verl.rollout.partial`); ``media``: each row's ``multi_modal_inputs``
        (a vision-language model: the model's forward, each row prefilled with its images at its M-RoPE
        positions, then decoding on from its largest position)."""
        was_training = self.model.training
        self.model.eval()
        try:
            # Inference mode saves a little on every op; the results are cloned out of it, so that
            # the caller gets ordinary tensors (inference tensors cannot join autograd later).
            with torch.inference_mode():
                responses, log_probs = self._generate(input_ids.to(self.device), attention_mask.to(self.device),
                                                      params, seeds.cpu(), first_step, pause, media)
        finally:
            self.model.train(was_training)
        return responses.clone(), None if log_probs is None else log_probs.clone()

    def _generate(self, input_ids, attention_mask, params: SamplingParams, seeds, first_step: int = 0, pause=None,
                  media=None, bounded: bool = True):
        """``bounded``: at most :meth:`rows_at_once` rows decode at once (False: a wave, all of them)."""
        batch, prompt_len = input_ids.shape
        max_new = params.max_new_tokens
        self.last_decode_rows = []
        if max_new == 0 or batch == 0:
            responses = torch.full((batch, max_new), self.pad_token_id, dtype=torch.long, device=self.device)
            return responses, torch.zeros(batch, max_new, device=self.device) if params.logprobs else None
        cap = min(batch, self.rows_at_once(params) or batch) if bounded else batch
        if cap < batch and pause is not None:  # generate_resumable hands the engine that many rows at a time
            raise ValueError(f"a pausable generation takes at most {cap} rows at once, got {batch}")

        mask = attention_mask.long()
        forbidden = placeholder_ids(self.model)
        images = forward_inputs(media, input_ids, mask, self.model)
        if images:
            if cap < batch:  # the HF forward's cache takes no new rows: waves of max_num_seqs rows
                return self._waves(input_ids, attention_mask, params, seeds, first_step, media, cap)
            # Each row prefills with its own images (two prompts of the same ids may show different ones),
            # at the model's M-RoPE positions; text then goes on from each row's largest position.
            rope = images.pop("position_ids")
            shift = rope.amax(dim=(0, 2)) + 1 - mask.sum(dim=1)
            self.fallback_reason, self.last_path = "the prompts have images", "hf"
            steps = _HFSteps(self)
            logits = steps.prefill(input_ids, mask, rope, prompt_len + max_new, **images)
        else:
            steps = self._steps(prompt_len + max_new)
            if cap < batch and not isinstance(steps, FastDecoder):
                return self._waves(input_ids, attention_mask, params, seeds, first_step, media, cap)

        rows = Rows(input_ids, mask, seeds.to(self.device), torch.arange(batch), torch.full((batch,), first_step),
                    torch.full((batch,), max_new))
        # The rows (every one of them, or cap at a time, waiting rows taking the slots of finished ones).
        decoder = RowDecoder(self, steps, params, cap, forbidden, decode_rows=self.last_decode_rows)
        if images:
            decoder.begin(logits, rows, mask.sum(dim=1) + shift)
        else:
            decoder.add(rows)
        decoder.run(pause)
        responses, log_probs, _ = assemble(decoder.out, batch, max_new, self.pad_token_id,
                                           torch.tensor(self.eos_token_ids), self.device)
        return responses, log_probs if params.logprobs else None

    @staticmethod
    def _prefill(steps, input_ids, mask, positions, capacity: int):
        """Logits of each row's prompt: every distinct prompt prefilled once, its cache rows and logits then
        given to each of its samples."""
        first, inverse = distinct_prompts(input_ids, mask)
        logits = steps.prefill(input_ids[first], mask[first], positions[first], capacity)
        if len(first) < len(input_ids):
            steps.select(inverse)
        return logits[inverse]

    def _waves(self, input_ids, attention_mask, params, seeds, first_step, media, cap: int):
        """``cap`` rows at a time, one generation after another (the HF forward's path)."""
        return join_generations([self._generate(input_ids[at:at + cap], attention_mask[at:at + cap], params,
                                                seeds[at:at + cap], first_step, None,
                                                None if media is None else media[at:at + cap], bounded=False)
                                 for at in range(0, len(input_ids), cap)], self.pad_token_id)

    def row_decoder(self, params: SamplingParams, total_length: int) -> RowDecoder | None:
        """An empty :class:`~verl.rollout.row_decoder.RowDecoder` that takes rows as they come, at most
        :meth:`rows_at_once` decoding at once (the asynchronous rollout's continuous batching across requests;
        call it under ``torch.inference_mode()``, the model in eval mode); None where the model runs its own
        forward, whose cache takes no new rows. It reads the weights now: build another after a sync."""
        steps = self._steps(total_length)
        if not isinstance(steps, FastDecoder):
            return None
        return RowDecoder(self, steps, params, self.rows_at_once(params))

    def sync_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(weights)
