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
from pathlib import Path

import torch

GiB = 1024**3


def peak_rss_bytes() -> int:
    """This process's peak resident set size: Linux's ``VmHWM`` (of this program's memory since it
    started; ``getrusage``'s ``ru_maxrss`` would also count the parent's memory at the fork before
    the exec), else ``ru_maxrss`` (macOS reports bytes, others KiB)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def memory_metrics(device: torch.device) -> dict[str, float]:
    metrics = {"perf/cpu_memory_used_gb": peak_rss_bytes() / GiB}
    if device.type == "cuda":
        metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / GiB
        metrics["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(device) / GiB
    return metrics


def read_memory() -> tuple[int | None, int | None]:
    """(available, total) bytes: psutil when installed, else /proc/meminfo, else (None, None)."""
    try:
        import psutil
    except ImportError:
        meminfo = Path("/proc/meminfo")
        if not meminfo.exists():
            return None, None
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        kib = {key: int(value.split()[0]) * 1024 for key, value in fields.items()}
        return kib.get("MemAvailable", kib.get("MemFree")), kib.get("MemTotal")
    memory = psutil.virtual_memory()
    return memory.available, memory.total
