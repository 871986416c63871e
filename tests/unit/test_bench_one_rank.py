"""benchmarks/bench_one_rank.py: one process's plain model and the same model in FSDP2 over one rank take
the same updates to the same weights (what lets ``parallelize`` leave FSDP out there), and the
benchmark prints its table."""


def test_plain_and_one_rank_fsdp_reach_the_same_weights(load_benchmark, capsys):
    bench = load_benchmark("bench_one_rank")
    result = bench.measure(rows=4, steps=2)
    assert result["diff"] == 0.0 and result["plain"] > 0 and result["fsdp"] > 0
    bench.main(["--rows", "4", "--steps", "1"])
    table = capsys.readouterr().out.splitlines()
    assert table[1].startswith("| rows x tokens | plain | FSDP2 over one rank") and table[3].startswith("| 4 x 22 |")
