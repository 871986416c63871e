"""The clipped surrogate the policy losses share (``losses`` and ``losses_extra``).

Log-ratios are clamped to [-20, 20] before ``exp``: a stale or broken log-prob must give a
large-but-finite ratio, not inf/NaN. Inside the clamp nothing changes.
"""

from __future__ import annotations

import torch

_LOG_RATIO_CLAMP = 20.0


def _clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high):
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    return low, high


def _clipped_surrogate(ratio, advantages, low, high):
    """Per-token max(-A r, -A clip(r, 1-low, 1+high)) and where the clipped branch wins."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    return torch.maximum(unclipped, clipped), clipped > unclipped
