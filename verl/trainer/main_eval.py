"""``python -m verl.trainer.main_eval data.path=<file with responses> [key=value ...]``

Scores every response of every row with the scorer of the row's data source (``verl.rewards.scorers``;
or ``custom_reward_function.path``/``name``) and prints, per data source, the mean score and pass@k
(the fraction of rows with a response scoring at least ``pass_score``; k = responses per row), as
verl's ``test_score/<data_source>`` and ``pass@k/<data_source>``. The input is
``verl.trainer.main_generation``'s output, or any parquet/jsonl file with a column of responses. Keys
follow verl's evaluation.yaml; see docs/after_training.md.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
from collections import defaultdict

from verl.config.after_training import EvalConfig
from verl.errors import RewardError, VerlError
from verl.trainer.entry import config_entry


def responses_of(row: dict, key: str, position: int) -> list[str]:
    """Row ``position``'s responses: a list (or array) of texts; one text counts as a list of one."""
    if key not in row:
        raise VerlError(f"data.path: row {position} has no {key!r} column (data.response_key); columns found: "
                        f"{sorted(row)}. Generate them with python -m verl.trainer.main_generation, or set "
                        f"data.response_key to the column that holds the responses")
    value = row[key]
    if isinstance(value, str):
        return [value]
    answers = list(value) if value is not None and not isinstance(value, dict) else None
    if not answers or not all(isinstance(a, str) for a in answers):
        raise VerlError(f"data.path: row {position}'s {key!r} is {value!r:.120}, not a non-empty list of texts")
    return answers


def scorer(config: EvalConfig):
    """``(name, fn)``: the user's function, or the built-in scorer of each call's data source."""
    from verl.rewards import load_reward_function
    from verl.rewards.scorers import get_scorer

    custom = config.custom_reward_function
    if custom.path:
        fn = load_reward_function(custom.path, custom.name)
        kwargs = dict(custom.reward_kwargs)
        return f"{custom.path}:{custom.name}", lambda **call: fn(**call, **kwargs)
    return "the built-in scorer", lambda **call: get_scorer(call["data_source"])(**call)


def score(fn, name: str, call: dict, where: str) -> float:
    from verl.rewards.manager import as_score

    try:
        value = fn(**call)
        if inspect.isawaitable(value):
            value = asyncio.run(value)
    except VerlError:
        raise
    except Exception as error:
        raise RewardError(f"{name} raised {type(error).__name__}: {error} on {where}") from None
    try:
        return as_score(value, name, 0)[0]
    except RewardError as error:
        raise RewardError(f"{where}: {error}") from None


def evaluate(config: EvalConfig) -> dict[str, float]:
    """The metrics ``config`` asks for: ``test_score/<source>`` and ``pass@k/<source>`` (printed too)."""
    from verl.data.prompt_rows import ground_truth_of, json_object
    from verl.data.io import read_rows
    from verl.rewards.scorers import NEEDS_NO_GROUND_TRUTH, get_scorer

    config.validate()
    data = config.data
    rows = read_rows(data.path, config_key="data.path")
    name, fn = scorer(config)
    means, passes, ks = defaultdict(list), defaultdict(list), defaultdict(set)
    for position, row in enumerate(rows):
        answers = responses_of(row, data.response_key, position)
        source = row.get(data.data_source_key)
        truth = ground_truth_of(row, data.reward_model_key)
        if not config.custom_reward_function.path:
            if source is None:
                raise RewardError(f"data.path: row {position} has no {data.data_source_key!r} (data.data_source_key), "
                                  f"so no built-in scorer can be picked; columns found: {sorted(row)}. Set "
                                  f"data.data_source_key, or custom_reward_function.path to your own scorer")
            get_scorer(source)  # an unknown data source: one error naming the known ones
            if truth is None and source not in NEEDS_NO_GROUND_TRUTH:
                raise RewardError(f"data.path: row {position} ({data.data_source_key}={source!r}) has no ground "
                                  f"truth ({data.reward_model_key}.ground_truth, or a ground_truth / answer / solution "
                                  f"column): every response would score 0. Fill it in, or set "
                                  f"custom_reward_function.path")
        extra = json_object(row["extra_info"]) if "extra_info" in row else None
        scores = [score(fn, name, {"data_source": source, "solution_str": answer, "ground_truth": truth,
                                   "extra_info": extra}, f"row {position}, response {j}")
                  for j, answer in enumerate(answers)]
        key = str(source)
        means[key].append(sum(scores) / len(scores))
        passes[key].append(max(scores) >= config.pass_score)
        ks[key].add(len(scores))
    summary = {source: (len(means[source]), _k(ks[source]), sum(means[source]) / len(means[source]),
                        sum(passes[source]) / len(passes[source])) for source in sorted(means)}
    metrics = {}
    for source, (_, k, mean, passed) in summary.items():
        metrics[f"test_score/{source}"] = mean
        metrics[f"pass@{k}/{source}"] = passed
    print(format_table(summary, name, config.pass_score))
    print(json.dumps(metrics), flush=True)
    return metrics


def _k(counts: set[int]) -> str:
    """The responses per row: ``4``, or ``3-4`` when rows have different counts."""
    return str(min(counts)) if len(counts) == 1 else f"{min(counts)}-{max(counts)}"


def format_table(summary: dict[str, tuple[int, str, float, float]], name: str, pass_score: float) -> str:
    """One line per data source: ``summary[source] = (rows, k, mean score, pass@k)``."""
    width = max(len("data source"), *(len(s) for s in summary))
    lines = [f"Scored with {name}; a response passes at score >= {pass_score:g}",
             f"{'data source':<{width}}  {'rows':>5}  {'k':>3}  {'mean score':>10}  {'pass@k':>7}"]
    lines += [f"{source:<{width}}  {rows:>5}  {k:>3}  {mean:>10.4f}  {passed:>7.4f}"
              for source, (rows, k, mean, passed) in summary.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return config_entry(EvalConfig, evaluate, sys.argv[1:] if argv is None else argv, __doc__)


if __name__ == "__main__":
    from verl.utils.command import run_command

    run_command(main)
