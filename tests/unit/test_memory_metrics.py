import subprocess
import sys

import torch

from verl.utils.memory import GiB, memory_metrics, peak_rss_bytes


def test_peak_rss_counts_a_tensor_the_process_touched_and_not_its_parents_memory():
    """A fresh process that fills 512 MiB reports a peak RSS of at least that (and not wildly more);
    the 1 GiB its parent holds at the fork is not counted (getrusage's ru_maxrss would count it)."""
    held = torch.ones(256 * 1024 * 1024)  # 1 GiB, touched, in this (the parent) process
    code = ("import torch; from verl.utils.memory import peak_rss_bytes, GiB; before = peak_rss_bytes(); "
            "t = torch.ones(128 * 1024 * 1024); print(before / GiB, peak_rss_bytes() / GiB)")
    before, after = map(float, subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                              text=True).stdout.split())
    assert after - before >= 0.45, (before, after)
    assert after < before + 2
    assert before < 0.9 and held.sum() > 0  # torch's import alone, not the parent's gigabyte


def test_cpu_runs_log_the_peak_rss_and_no_cuda_keys():
    first = memory_metrics(torch.device("cpu"))
    assert set(first) == {"perf/cpu_memory_used_gb"}
    assert first["perf/cpu_memory_used_gb"] > 0.05  # torch alone is more than 50 MiB resident
    assert memory_metrics(torch.device("cpu"))["perf/cpu_memory_used_gb"] >= first["perf/cpu_memory_used_gb"]
