"""benchmarks/bench_lora.py on a small model: it runs both trainings and its table shows LoRA
saving what it should (the trained parameters, their optimiser state, the checkpoint)."""

import re

import pytest

pytestmark = pytest.mark.slow


def test_the_lora_benchmark_measures_what_lora_saves(tmp_path, capsys, load_benchmark):
    bench = load_benchmark("bench_lora")
    bench.main(["--hidden", "128", "--layers", "2", "--rank", "4", "--out", str(tmp_path)])
    table = capsys.readouterr().out
    params, optimizer, checkpoint, peak = map(float, re.search(r"^LoRA/full\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)$", table,
                                                               re.M).groups())
    # rank 4 on a hidden size of 128: a few percent of the weights train, and that is all that is saved
    assert 0 < params < 0.2 and 0 < optimizer < 0.2 and 0 < checkpoint < 0.3 and peak > 0
