"""Memory figures of this process, logged with every actor update (verl's metric names).

- ``perf/max_memory_allocated_gb`` and ``perf/max_memory_reserved_gb`` (CUDA only): the peak of
  tensors allocated, and of memory held by PyTorch's caching allocator, on this rank's GPU since the
  process started.
- ``perf/cpu_memory_used_gb``: this process's peak resident memory (RSS) since it started; on a CPU
  run this is where the model, optimizer and activations live.
Rank 0's figures are logged (every rank holds about the same under FSDP).
"""

from __future__ import annotations

import resource
import sys

import torch

GiB = 1024**3


def peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def memory_metrics(device: torch.device) -> dict[str, float]:
    metrics = {"perf/cpu_memory_used_gb": peak_rss_bytes() / GiB}
    if device.type == "cuda":
        metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / GiB
        metrics["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(device) / GiB
    return metrics
