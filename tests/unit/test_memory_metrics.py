import subprocess
import sys

import torch

from verl.utils.memory import GiB, memory_metrics, peak_rss_bytes


def test_peak_rss_counts_a_tensor_the_process_touched():
    """A fresh process that fills 512 MiB reports a peak RSS of at least that (and not wildly more)."""
    code = ("import torch; from verl.utils.memory import peak_rss_bytes, GiB; before = peak_rss_bytes(); "
            "t = torch.ones(128 * 1024 * 1024); print(before / GiB, peak_rss_bytes() / GiB)")
    before, after = map(float, subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                              text=True).stdout.split())
    assert after - before >= 0.45, (before, after)
    assert after < before + 2


def test_cpu_runs_log_the_peak_rss_and_no_cuda_keys():
    first = memory_metrics(torch.device("cpu"))
    assert set(first) == {"perf/cpu_memory_used_gb"}
    assert first["perf/cpu_memory_used_gb"] > 0.05  # torch alone is more than 50 MiB resident
    assert memory_metrics(torch.device("cpu"))["perf/cpu_memory_used_gb"] >= first["perf/cpu_memory_used_gb"]
