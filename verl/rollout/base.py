"""The rollout interface: every engine turns a batch of prompts into a batch of responses.

All engines share one sampling definition (:class:`SamplingParams`) and one output layout
(:func:`assemble_rollout`), so the trainer never knows which engine produced a batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from verl.data.chat import turn_end_ids
from verl.models.vision import images_of
from verl.protocol import Batch
from verl.rollout.partial import generate_resumable
from verl.rollout.seeding import random_seeds, sample_seeds


@dataclass(frozen=True)
class SamplingParams:
    """How responses are drawn. ``top_k=-1`` and ``top_p=1.0`` switch those filters off.

    ``logprobs``: the engine also reports ``rollout_log_probs``, the log-prob of each sampled
    token under the distribution it was drawn from (after temperature, top-k and top-p).
    """

    max_new_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    logprobs: bool = False

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0

    @property
    def logprob_temperature(self) -> float:
        """The temperature log-probs must use to describe this sampling distribution."""
        return 1.0 if self.greedy else self.temperature


def policy_eos(model, tokenizer) -> list[int]:
    """The token ids that end a response of ``model``, each once, in this order: its generation config's (Llama 3
    Instruct lists three: ``<|end_of_text|>``, ``<|eom_id|>``, ``<|eot_id|>``), the tokenizer's eos, and the special
    token its chat template closes an assistant turn with (``<|im_end|>``, ``<|eot_id|>``, Phi-3's ``<|end|>``,
    Gemma's ``<end_of_turn>``). A response stops at the first of any of them: a checkpoint whose
    generation_config.json names ``<|endoftext|>`` while its tokenizer and template end turns with ``<|im_end|>``
    stops where its SFT data taught it to."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    ids = list(dict.fromkeys(int(i) for i in [*ids, *turn_end_ids(tokenizer)] if i is not None))
    if not ids:
        raise ValueError("neither the model's generation config nor its tokenizer names an eos token, so a response "
                         "could never end: set eos_token_id in generation_config.json or eos_token in the tokenizer")
    return ids


class RolloutEngine(ABC):
    """Generates ``n`` responses per prompt. Subclasses implement :meth:`generate_responses`."""

    name: str = "base"
    takes_images: bool = False
    """Whether ``generate_responses`` takes ``media`` (a vision-language model's images per row)."""

    generation_batch_size: int | None = None
    """Prompts per generate call (``rollout.generation_batch_size``): with ``n`` samples each, that many rows."""
    max_num_seqs: int | None = None
    """Rows decoded at once (``rollout.max_num_seqs``)."""

    def __init__(self, eos_token_id: int | list[int], pad_token_id: int, seed: int = 0):
        self.eos_token_ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        self.pad_token_id = pad_token_id
        # Seeds for prompts that carry no rollout_seed: two engines built with one seed draw alike.
        self.seed_generator = torch.Generator().manual_seed(seed)

    def rows_at_once(self, params: SamplingParams) -> int | None:
        """The most rows one decode batch holds under ``generation_batch_size`` and ``max_num_seqs`` (None: all)."""
        bounds = [b for b in (self.generation_batch_size and self.generation_batch_size * params.n,
                              self.max_num_seqs) if b]
        return min(bounds) if bounds else None

    @abstractmethod
    def generate_responses(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           params: SamplingParams, seeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Response ids ``[B, <= max_new_tokens]`` for left-padded prompts (one per row), and
        with ``params.logprobs`` the log-prob of each of them under the sampling distribution
        (same shape; anything after the end of a response is ignored), else None.

        ``seeds`` ``[B]`` (int64): each row's own sampling seed (:mod:`verl.rollout.seeding`); a
        row's response must depend on its prompt, seed and the weights only, not on the other rows.
        """

    def generate(self, prompts: Batch, params: SamplingParams, swap=None) -> Batch:
        """Prompts ``[B, T_prompt]`` -> the batch repeated ``n`` times with responses appended.

        Rows of the same prompt are adjacent (interleaved repeat) and share ``uid``. Sample ``j``
        of a prompt is drawn with ``sample_seeds(prompts["rollout_seed"], n)``; prompts without a
        ``rollout_seed`` column get seeds from the engine's own generator (seeded by its ``seed``).
        ``swap``: new weights may arrive while generating (:mod:`verl.rollout.partial`);
        each row's ``policy_version_last`` says which version drew its last token.
        """
        batch, seeds = self.sample_rows(prompts, params)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        media = images_of(batch)
        if media is not None and not self.takes_images:
            raise ValueError(f"the {self.name} rollout engine generates from text only and these prompts have "
                             f"images: use actor_rollout_ref.rollout.name=hf or native with a vision-language model")
        images = {} if media is None else {"media": media}
        if swap is None:
            responses, log_probs = self.generate_responses(ids, mask, params, seeds, **images)
        else:
            responses, log_probs, last = self.generate_resumable(ids, mask, params, seeds, swap, **images)
        out = self.finish(batch, responses, params, log_probs)
        if swap is not None:
            out["policy_version_last"] = last
        return out

    def finish(self, rows: Batch, responses: torch.Tensor, params: SamplingParams,
               log_probs: torch.Tensor | None = None) -> Batch:
        """The rollout batch of ``rows`` (prompts x n, from :meth:`sample_rows`) and their generated responses."""
        out = assemble_rollout(rows, responses, params.max_new_tokens, self.eos_token_ids, self.pad_token_id,
                               log_probs=log_probs)
        out.meta["temperature"] = params.logprob_temperature
        return out

    def generate_resumable(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams,
                           seeds: torch.Tensor, swap, media: list | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """:meth:`generate_responses` that takes new weights from ``swap`` midway: responses, their log-probs and
        the version that drew each row's last token (:func:`verl.rollout.partial.generate_resumable`, for the
        engines that decode their rows in step, hf and native; vllm steps its own engine)."""
        return generate_resumable(self, input_ids, attention_mask, params, seeds, swap, media)

    def sample_rows(self, prompts: Batch, params: SamplingParams) -> tuple[Batch, torch.Tensor]:
        """``prompts`` repeated ``params.n`` times (interleaved) and each row's sampling seed ``[B * n]``
        (see :meth:`generate`); a multi-turn loop draws its samples from the same rows and seeds."""
        base = prompts["rollout_seed"] if "rollout_seed" in prompts else random_seeds(len(prompts), self.seed_generator)
        seeds = sample_seeds(base.cpu(), params.n)
        return (prompts.repeat(params.n, interleave=True) if params.n > 1 else prompts), seeds

    def sync_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Make the engine generate with ``weights``: the actor's full state dict (parameter name ->
        tensor), for engines that hold a copy of their own. Engines that share the actor's module
        (the hybrid engine's ``hf``) and engines without a model need nothing: the default."""


def response_mask_from_ids(responses: torch.Tensor, eos_token_ids: list[int]) -> torch.Tensor:
    """1 on every token up to and including the first EOS, 0 after it."""
    is_eos = torch.isin(responses, torch.tensor(eos_token_ids, device=responses.device)).long()
    seen_before = is_eos.cumsum(dim=1) - is_eos
    return (seen_before == 0).long()


def assemble_rollout(prompts: Batch, responses: torch.Tensor, max_new_tokens: int,
                     eos_token_ids: list[int], pad_token_id: int, *, log_probs: torch.Tensor | None = None) -> Batch:
    """Build the standard rollout layout (see :data:`verl.protocol.FIELDS`) from raw responses.

    ``log_probs`` (the engine's, aligned with ``responses``) become ``rollout_log_probs``, 0
    wherever ``response_mask`` is 0.
    """
    prompt_ids, prompt_mask = prompts["input_ids"], prompts["attention_mask"]
    responses = responses.to(prompt_ids.device)
    # The mask comes from the engine's own output; padding added here to reach max_new_tokens is
    # never a response token, even after a row that stopped without EOS.
    response_mask = response_mask_from_ids(responses, eos_token_ids)
    if responses.shape[1] < max_new_tokens:
        extra = max_new_tokens - responses.shape[1]
        responses = F.pad(responses, (0, extra), value=pad_token_id)
        response_mask = F.pad(response_mask, (0, extra), value=0)
    responses = responses.masked_fill(response_mask == 0, pad_token_id)
    if log_probs is not None:
        log_probs = F.pad(log_probs.to(prompt_ids.device).float(), (0, responses.shape[1] - log_probs.shape[1]))
        # torch.where, not a product: a filtered-out pad token after EOS has log-prob -inf.
        log_probs = torch.where(response_mask.bool(), log_probs, torch.zeros_like(log_probs))
    return rollout_batch(prompts, prompt_ids, prompt_mask, responses, response_mask, log_probs=log_probs)


def rollout_batch(rows: Batch, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor,
                  response_mask: torch.Tensor, *, response_attention: torch.Tensor | None = None,
                  log_probs: torch.Tensor | None = None) -> Batch:
    """The standard rollout layout of :data:`verl.protocol.FIELDS` from left-padded prompts and
    right-padded responses with their masks; ``rows``' other columns are kept.

    ``response_attention``: the response tokens the model read, where they differ from those it is
    trained on (``response_mask``): a multi-turn trajectory's tool results. ``log_probs``: the
    engine's, already 0 off ``response_mask``.
    """
    attention_mask = torch.cat([prompt_mask, response_mask if response_attention is None else response_attention],
                               dim=1)
    # Padding after the response continues from the last real position, like the prompt's pads.
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    out = rows.select(*[k for k in rows.keys() if k not in ("input_ids", "attention_mask", "position_ids")])
    out["prompts"] = prompt_ids
    out["responses"] = responses
    out["response_mask"] = response_mask
    out["input_ids"] = torch.cat([prompt_ids, responses], dim=1)
    out["attention_mask"] = attention_mask
    out["position_ids"] = position_ids
    if log_probs is not None:
        out["rollout_log_probs"] = log_probs
    return out


def concat_rollouts(batches: list[Batch], pad_token_id: int) -> Batch:
    """Rows of several rollout batches in one, their prompts left-padded to a common width.

    Prompt batches are padded to their own longest prompt, so rollouts of different prompt
    batches differ in ``T_prompt``; the response columns all have ``max_new_tokens``.
    """
    width = max(b["prompts"].shape[1] for b in batches)
    padded = []
    for batch in batches:
        extra = width - batch["prompts"].shape[1]
        if extra:
            batch = Batch(dict(batch.tensors), dict(batch.non_tensors), batch.meta)
            for key, value in (("prompts", pad_token_id), ("input_ids", pad_token_id), ("attention_mask", 0),
                               ("position_ids", 0)):
                batch[key] = F.pad(batch[key], (extra, 0), value=value)
        padded.append(batch)
    return Batch.concat(padded)
