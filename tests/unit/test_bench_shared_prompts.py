"""benchmarks/bench_shared_prompts.py runs (a tiny shape), prints its table row, and the two ways agree."""

import re


def test_the_benchmark_times_both_ways_on_a_custom_shape(capsys, load_benchmark):
    bench = load_benchmark("bench_shared_prompts")
    batch = bench.make_batch(3, 2, 6, 4)
    # Each prompt's n rows hold the same prompt; response lengths vary, the padding is zeroed.
    assert (batch["input_ids"][0, :6] == batch["input_ids"][1, :6]).all()
    assert (batch["input_ids"] * (1 - batch["attention_mask"]) == 0).all()
    assert bench.main(["--shapes", "--shape", "3x2x6x4", "--repeats", "1"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 3x2x6x4")]
    assert len(row) == 1
    assert float(re.findall(r"\| ([0-9.e+-]+) \|$", row[0])[0]) < 1e-4  # max log-prob difference
