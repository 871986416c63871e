"""benchmarks/bench_config_types.py: the findings docs/architecture.md gives for keeping the config's own
type system (pydantic refuses text that our text path takes; OmegaConf cannot hold the schema's
annotations) still hold with the installed pydantic and OmegaConf."""


def test_the_type_system_findings_hold(load_benchmark):
    bench = load_benchmark("bench_config_types")
    out = bench.main()
    assert out["python '1e-4' for a float: ours"].startswith("actor_rollout_ref.actor.optim.lr expects float")
    assert "float_type" in out["python '1e-4' for a float: pydantic strict"]
    # `trainer.project_name=2.5` is the text '2.5' here (as with OmegaConf's typed nodes); pydantic refuses it.
    assert out["text 2.5 for a str: ours"] == "accepted"
    assert "string_type" in out["text 2.5 for a str: pydantic lax"]
    assert out["omegaconf_structured"].startswith("ConfigValueError")
    assert all(out[k] > 0 for k in ("ours_from_dict_ms", "pydantic_strict_ms", "pydantic_lax_ms"))
