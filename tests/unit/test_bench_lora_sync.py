"""benchmarks/bench_lora_sync.py on a small shape: both ways of syncing a LoRA policy run, and the adapters
are a small share of the merged weights' bytes (the seconds are measured, not asserted)."""

import re


def test_the_lora_sync_benchmark_sends_the_adapters_alone_for_a_fraction_of_the_bytes(capsys, load_benchmark):
    bench = load_benchmark("bench_lora_sync")
    rows = bench.main(["--hidden", "128", "--layers", "2", "--inter", "256", "--vocab", "512", "--rank", "4",
                       "--dtype", "float32", "--repeats", "1"])
    table = capsys.readouterr().out
    ratio = float(re.search(r"^adapters/merged\s+(\S+)", table, re.M).group(1))
    # rank 4 on 7 linear layers of 2 blocks (q, k, v, o, gate, up, down) against every weight of the model
    params = 2 * sum(4 * (i + o) for i, o in ((128, 128), (128, 64), (128, 64), (128, 128), (128, 256), (128, 256),
                                               (256, 128)))
    assert rows["adapters"][0] == params * 4 + 2 * 7 * 2 * 8  # float32 adapters, and a [scaling, transposed] each
    assert 0 < ratio < 0.5 and rows["merged"][0] > rows["adapters"][0]
