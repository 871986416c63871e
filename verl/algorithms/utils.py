"""Masked statistics and loss aggregation shared by every estimator and loss.

Shapes: ``x`` and ``mask`` are ``[B, T]`` (B samples, T response tokens, right-padded);
``mask`` is 1 on real response tokens and may be float, int or bool.

Decisions written down once, here:

* Masked positions are selected out with ``torch.where``, not multiplied by 0, so a NaN or
  inf sitting in padding (e.g. a log-prob of a pad token) can never leak into a result or a
  gradient.
* Every division by a count is "safe": a count of 0 gives 0 (the numerator is 0 then too),
  never NaN, and never a NaN gradient.
* ``masked_var`` with fewer than 2 valid elements (unbiased) or 0 (biased) returns 0: there is
  no information about spread, and 0 makes ``masked_whiten`` map such input to 0.
* ``masked_whiten`` returns 0 on masked positions, and computes in float64 (cast back to ``x``'s
  dtype): the squares of a large but finite value (a return of 1e30) overflow float32.
"""

from __future__ import annotations

import torch

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _as_bool(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def _weights(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # A float mask may carry weights other than 1; a bool/int mask becomes 0/1 in x's dtype.
    return mask.to(x.dtype) if mask.is_floating_point() else _as_bool(mask).to(x.dtype)


def _safe_div(num: torch.Tensor, den) -> torch.Tensor:
    """num / den, and 0 where den == 0 (where num is 0 as well)."""
    den = torch.as_tensor(den, dtype=num.dtype, device=num.device)
    # Replace the zero denominator itself: dividing first and selecting after would put a NaN
    # into the backward pass of the unselected branch.
    return num / torch.where(den == 0, torch.ones_like(den), den)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Sum of ``x`` over positions where ``mask`` is non-zero (weighted by a float mask)."""
    w = _weights(x, mask)
    selected = torch.where(_as_bool(mask), x * w, torch.zeros_like(x))
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean of ``x`` over valid positions; 0 (not NaN) where there are none."""
    count = _weights(x, mask).sum() if dim is None else _weights(x, mask).sum(dim=dim)
    return _safe_div(masked_sum(x, mask, dim), count)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over all valid positions (Bessel-corrected when ``unbiased``)."""
    mean = masked_mean(x, mask)
    count = _weights(x, mask).sum()
    sq_sum = masked_sum((x - mean) ** 2, mask)
    den = count - 1 if unbiased else count
    return _safe_div(sq_sum, torch.clamp(den, min=0.0))


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the valid positions; mean is added back if not shift_mean."""
    dtype, x = x.dtype, x.double()
    mean = masked_mean(x, mask)
    whitened = (x - mean) * torch.rsqrt(masked_var(x, mask) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(_as_bool(mask), whitened, torch.zeros_like(whitened)).to(dtype)


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    global_tokens=None,
    global_seqs=None,
    norm_len=None,
) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar.

    The denominators are passed in, not computed here, so that a mini-batch split into
    micro-batches (and over data-parallel ranks) gives the same gradient as the whole
    mini-batch: give every micro-batch the *mini-batch* counts and sum the micro losses.

    Modes:
      * ``token-mean``: sum(loss * mask) / global_tokens (default: valid tokens here).
      * ``seq-mean-token-sum``: per-sequence token sum, summed over sequences / global_seqs.
      * ``seq-mean-token-mean``: per-sequence token mean, summed over sequences / global_seqs.
      * ``seq-mean-token-sum-norm``: sum(loss * mask) / (global_seqs * norm_len), the constant
        normaliser of Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training").
        ``norm_len`` defaults to T = mask.shape[-1]; pass the configured maximum response
        length when micro-batches are padded to different T, or the sum property breaks.

    ``global_seqs`` defaults to B, i.e. rows with no valid token still count as sequences.
    """
    if mode == "token-mean":
        den = _weights(loss_mat, mask).sum() if global_tokens is None else global_tokens
        return _safe_div(masked_sum(loss_mat, mask), den)
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; allowed: {', '.join(AGG_MODES)}")
    seqs = loss_mat.shape[0] if global_seqs is None else global_seqs
    if mode == "seq-mean-token-sum":
        return _safe_div(masked_sum(loss_mat, mask, dim=-1).sum(), seqs)
    if mode == "seq-mean-token-mean":
        return _safe_div(masked_mean(loss_mat, mask, dim=-1).sum(), seqs)
    length = mask.shape[-1] if norm_len is None else norm_len
    return _safe_div(masked_sum(loss_mat, mask), torch.as_tensor(seqs) * length)
