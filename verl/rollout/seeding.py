"""Sampling seeded per sample, so a response does not depend on where or with whom it was drawn.

A batched sampler that draws from one random stream gives row 5 a different token when the batch
is cut differently: on 2 data-parallel ranks, with another generation batch size, or after a
resume. Here every sample carries its own 63-bit seed, and the token it draws at decode step
``t`` is a pure function of (seed, t) and its next-token distribution: one uniform number
``u = hash(seed, t)`` picks the token by inverse CDF. 1 rank or N, any batch size: the same
prompt, seed and weights give the same response (up to float rounding of the probabilities
themselves, which can only matter when ``u`` falls on a boundary between two tokens).

Seeds: the controller gives each prompt a ``rollout_seed`` (from the run seed, the step and the
prompt's position in the step's batch, see :func:`prompt_seeds`); sample ``j`` of a prompt gets
``sample_seeds(rollout_seed, n)[j]``. Prompts without one draw seeds from the engine's generator
(seeded by the engine's ``seed``), so a run stays reproducible.

The hash is murmur3's 32-bit finaliser on int64 tensors, masked to 32 bits after every multiply:
int64 products wrap modulo 2**64, which leaves the low 32 bits exact on every device.
"""

from __future__ import annotations

import torch

from verl.protocol import Batch

_MASK32 = 0xFFFFFFFF


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)


def mix(a: torch.Tensor, b: torch.Tensor | int) -> torch.Tensor:
    """A 63-bit hash of two int64 values (element-wise), as a non-negative int64."""
    b = torch.as_tensor(b, dtype=torch.int64, device=a.device)
    lo = _fmix32(a ^ _fmix32(b + 0x9E3779B9))
    hi = _fmix32((a >> 32) ^ _fmix32(lo + (b >> 32) + 0x7F4A7C15))
    return ((hi & 0x7FFFFFFF) << 32) | lo


def prompt_seeds(base_seed: int, draw: int, num_prompts: int) -> torch.Tensor:
    """``[num_prompts]`` seeds for the prompts of one draw of prompts (a step, a validation batch)."""
    first = mix(torch.tensor([base_seed], dtype=torch.int64), draw)
    return mix(first.expand(num_prompts), torch.arange(num_prompts, dtype=torch.int64))


def with_prompt_seeds(prompts: Batch, base_seed: int, draw: int) -> Batch:
    """``prompts`` (not modified) with a ``rollout_seed`` column from :func:`prompt_seeds`."""
    seeded = Batch(dict(prompts.tensors), prompts.non_tensors, prompts.meta)
    seeded["rollout_seed"] = prompt_seeds(base_seed, draw, len(prompts))
    return seeded


def sample_seeds(rollout_seeds: torch.Tensor, n: int) -> torch.Tensor:
    """Seeds of the ``n`` samples of each prompt, in the interleaved order of ``Batch.repeat``."""
    return mix(rollout_seeds.repeat_interleave(n), torch.arange(n, dtype=torch.int64).repeat(len(rollout_seeds)))


def random_seeds(count: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Seeds drawn from ``generator`` (torch's global one by default), for prompts that carry none."""
    return torch.randint(0, 2**62, (count,), dtype=torch.int64, generator=generator)


def uniforms(seeds: torch.Tensor, step: int) -> torch.Tensor:
    """``[B]`` float64 numbers in (0, 1), one per sample for decode step ``step``."""
    bits = mix(seeds, step) >> 11  # 52 bits
    return (bits.double() + 0.5) / float(2**52)


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Logits after temperature, then top-k, then top-p (nucleus); filtered tokens become -inf.

    ``top_k <= 0`` and ``top_p >= 1`` switch those filters off. The most likely token always survives.
    """
    logits = logits.float() / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # A token is dropped when the tokens before it already reach top_p.
        drop = probs.cumsum(dim=-1) - probs >= top_p
        drop[..., 0] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def draw(logits: torch.Tensor, seeds: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``[B]`` drawn from ``softmax(logits)`` (already filtered) by inverse CDF with each
    row's uniform for ``step``, and their log-probs ``[B]`` under that distribution."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    cdf = log_probs.double().exp().cumsum(dim=-1)
    u = uniforms(seeds.to(logits.device), step).unsqueeze(-1) * cdf[..., -1:]
    tokens = torch.searchsorted(cdf, u).squeeze(-1).clamp(max=logits.shape[-1] - 1)
    # A token of probability 0 is never drawn, even where rounding puts u on its flat stretch of the CDF.
    tokens = torch.where(torch.isfinite(log_probs.gather(-1, tokens.unsqueeze(-1))).squeeze(-1), tokens,
                         log_probs.argmax(dim=-1))
    return tokens, log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
