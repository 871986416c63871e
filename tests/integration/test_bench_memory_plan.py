"""benchmarks/bench_memory_plan.py: on this machine's CPU the plan's peak is within 15% of the peak
RSS a real GRPO step with a reference reaches (a 55M-parameter Qwen2; fp32 without, bf16 with
gradient checkpointing). The peak RSS of identical runs moves by up to ~0.2 GiB (the allocator), so
the model is large enough that this stays well inside 15% (with a 24M model it did not always)."""

import sys

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow


def test_the_plan_is_within_15_percent_of_the_measured_peak_rss():
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_memory_plan import main

    model = ["--hidden", "768", "--layers", "8", "--intermediate", "2304", "--heads", "12", "--kv-heads", "4",
             "--micro", "4"]
    # bf16 with checkpointing on fewer, shorter samples (2 prompts x 2, 32 tokens; one micro-batch of 4 as
    # in fp32): bf16 matmuls are emulated on CPUs without AVX-512 BF16, where 4 x 4 samples of 64 tokens
    # took 211 s a step on an AVX2 EPYC (32 s so); the plan still met the measured peak (1.12 / 1.09 GiB).
    results = main(["--runs", "fp32:plain", "--response", "64", *model]) + main(
        ["--runs", "bf16:ckpt", "--response", "32", "--prompts", "2", "--n", "2", *model])
    assert [(row["dtype"], row["variant"]) for row in results] == [("fp32", "plain"), ("bf16", "ckpt")]
    for row in results:
        assert abs(row["plan"] / row["measured"] - 1) <= 0.15, row
