"""The table printed at the end of a run: validation before and after RL, and time per stage."""

from __future__ import annotations

from pathlib import Path

STAGE_ORDER = ("gen", "gen_baseline", "reward", "old_log_prob", "ref", "values", "adv", "update_critic",
               "update_actor", "validate", "save_checkpoint")


def _label(key: str) -> str:
    # "val-core/builtin/addition/reward/mean@1" -> "builtin/addition greedy (mean@1)"
    prefix, rest = key.split("/", 1)
    source, _, stat = rest.rpartition("/reward/")
    kind = "greedy" if stat == "mean@1" else "sampled"  # sampled_mean@1, mean@N, best@N, maj@N
    return f"{source} {kind} reward ({stat.replace('sampled_', '')})" if prefix else key


def format_summary(result: dict, *, warm_start=None, out_dir=None) -> str:
    lines = []
    history = result.get("validation") or []
    if history:
        first_step, first = history[0]
        last_step, last = history[-1]
        # the reward rows; a reward function's other keys (val-aux/<source>/<key>/...) stay in the metrics
        rows = [(_label(k), first.get(k), last.get(k)) for k in last if "/reward/" in k or not k.startswith("val-")]
        width = max(len(r[0]) for r in rows)
        lines.append(f"{'held-out':<{width}}  {'step ' + str(first_step):>9}  {'step ' + str(last_step):>9}")
        for label, before, after in rows:
            before_s = f"{before:.3f}" if before is not None else "-"
            lines.append(f"{label:<{width}}  {before_s:>9}  {after:>9.3f}")
    seconds = result.get("stage_seconds", {})
    if seconds:
        step_total = seconds.get("step", 0.0)
        parts = [f"{name} {seconds[name]:.1f}s" for name in STAGE_ORDER if seconds.get(name)]
        lines.append(f"RL: {result.get('steps', 0)} steps in {step_total:.1f}s ({', '.join(parts)})")
    if warm_start is not None:
        how = "cached" if warm_start.cached else f"{warm_start.seconds:.1f}s"
        lines.append(f"SFT warm start: {warm_start.steps} steps, sampled accuracy {warm_start.accuracy:.2f} ({how})")
        if warm_start.direct:
            lines.append(f"  then direct answers: {direct_summary(warm_start.direct)}")
    if out_dir is not None:
        loader = "AutoModelForImageTextToText" if (Path(out_dir) / "huggingface" / "preprocessor_config.json").exists() \
            else "AutoModelForCausalLM"
        lines.append(f"Trained policy: {out_dir}/huggingface  ({loader}.from_pretrained)")
        lines.append(f"Metrics:        {out_dir}/metrics.jsonl")
    return "\n".join(lines)


def direct_summary(direct: dict) -> str:
    """One line on the direct-answer phase: its steps, and held-out accuracy and tool calls after it."""
    return (f"{direct['steps']} steps; held-out greedy accuracy {direct['greedy_accuracy']:.2f} (tool calls in "
            f"{direct['greedy_tool_calls']:.0%}), sampled {direct['sampled_accuracy']:.2f} (tool calls in "
            f"{direct['sampled_tool_calls']:.0%})")
