"""Rule rewards: decode each response, score it with one or more weighted functions, place the score.

The score of a response is the weighted sum of its functions' scores and goes on its last valid
token (the last position where ``response_mask`` is 1); all other positions are 0. A response
with no valid token has nowhere to put its score: the functions still see it (so per-sample
extras stay aligned), the score is dropped, and a warning counts such responses.

A function that raises, or returns NaN, None, a string or anything else that is not a number
stops the step with a ``RewardError`` naming the function, the sample index and the value.
With ``on_error="zero"`` such a sample scores 0 for that function instead, and is counted in
``reward_error`` (logged as ``reward/num_errors``).
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import math
import numbers
from typing import Any, Callable, Sequence

import numpy as np
import torch

from verl.errors import RewardError
from verl.protocol import Batch
from verl.rewards.functions import RewardFunction, run_all
from verl.rewards.scorers import SCORERS, get_scorer

logger = logging.getLogger(__name__)

ON_ERROR = ("raise", "zero")


async def default_scorer(data_source, solution_str, ground_truth, extra_info=None):
    """The built-in scorer registered for each row's ``data_source`` (``verl.rewards.scorers``).
    Async so that async scorers (code in a sandbox) run concurrently; sync ones run as they are."""
    result = get_scorer(data_source)(data_source=data_source, solution_str=solution_str,
                                     ground_truth=ground_truth, extra_info=extra_info)
    return await result if inspect.isawaitable(result) else result


def as_score(value: Any, name: str, sample: int, where: str = "") -> tuple[float, dict]:
    """``(score, extras)`` from one returned value: a number, a bool, or a dict with "score". ``where`` follows
    the sample's number in an error (its row, data source and response)."""
    extras: dict = {}
    raw = value
    if isinstance(value, BaseException):
        raise RewardError(f"reward function {name} raised {type(value).__name__}: {value} on sample {sample}{where}; "
                          f"make it return a score for such a response (or set reward.on_error=zero to score such "
                          f"samples 0)")
    if isinstance(value, dict):
        if "score" not in value:
            raise RewardError(f"reward function {name} returned a dict without a 'score' key for sample {sample}"
                              f"{where}: {value!r:.300}; put the reward under 'score' (other keys are logged)")
        extras = {k: v for k, v in value.items() if k != "score"}
        value = value["score"]
    if isinstance(value, torch.Tensor) and value.numel() == 1 or isinstance(value, np.ndarray) and value.size == 1:
        value = value.item()
    if isinstance(value, (bool, np.bool_)):
        return float(value), extras
    if isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return float(value), extras
    what = (f"a dict whose 'score' is {value!r:.100} ({type(value).__name__})" if isinstance(raw, dict)
            else f"{raw!r:.300} ({type(raw).__name__})")
    raise RewardError(f"reward function {name} returned {what} for sample {sample}{where}; "
                      f"it must return a finite float, an int, a bool, or a dict with a 'score' "
                      f"(or set reward.on_error=zero to score such samples 0)")


class RuleRewardManager:
    """Turns responses into ``token_level_scores`` with weighted reward functions.

    Args:
        tokenizer: decodes prompts and responses (special tokens skipped).
        compute_score: a single function (verl or TRL style), or None for the built-in scorer of
            each row's data source. Kept for the one-function case; ``functions`` generalises it.
        functions: ``RewardFunction`` objects (or plain callables, weight 1) summed with weights.
        reward_fn_key: the column whose value is passed as ``data_source``.
        on_error: "raise" (stop the step) or "zero" (score the sample 0 and count it).
        max_concurrency: how many samples an async verl-style function scores at once.
    """

    def __init__(self, tokenizer, compute_score: Callable[..., Any] | None = None, *,
                 functions: Sequence[RewardFunction | Callable] | None = None,
                 reward_fn_key: str = "data_source", on_error: str = "raise", max_concurrency: int = 64):
        if on_error not in ON_ERROR:
            raise RewardError(f"reward.on_error={on_error!r} is not one of {ON_ERROR}")
        if compute_score is not None and functions:
            raise RewardError("give either compute_score or functions, not both")
        if functions:
            self.functions = [f if isinstance(f, RewardFunction) else RewardFunction(f) for f in functions]
        else:
            self.functions = [RewardFunction(compute_score or default_scorer)]
        names = [f.name for f in self.functions]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise RewardError(f"two reward functions are both named {duplicates}; give them distinct names")
        # With no function given, rows are scored by their data source's built-in scorer; an
        # unknown data source is a setup mistake, reported whatever reward.on_error says.
        self.builtin = compute_score is None and not functions
        self.tokenizer = tokenizer
        self.reward_fn_key = reward_fn_key
        self.on_error = on_error
        self.max_concurrency = max_concurrency

    def _samples(self, batch: Batch) -> list[dict]:
        responses = batch["responses"]
        # The whole response as the model read it: in a multi-turn trajectory the tool results too
        # (attended, though not trained on); in a single turn the same tokens as response_mask.
        mask = (batch["attention_mask"][:, -responses.shape[1]:] if "attention_mask" in batch
                else batch["response_mask"]).bool()
        size = len(batch)
        response_ids = [responses[i][mask[i]].tolist() for i in range(size)]
        texts = self.tokenizer.batch_decode(response_ids, skip_special_tokens=True)
        column = {key: batch[key] if key in batch else [None] * size
                  for key in (self.reward_fn_key, "ground_truth", "extra_info", "raw_prompt", "index")}
        prompt_texts = [None] * size
        if "prompts" in batch and any(p is None for p in column["raw_prompt"]):
            width = batch["prompts"].shape[1]
            prompt_mask = batch["attention_mask"][:, :width].bool()
            prompt_texts = self.tokenizer.batch_decode(
                [batch["prompts"][i][prompt_mask[i]].tolist() for i in range(size)], skip_special_tokens=True)
        # Each sample its own ground truth and extra_info, as verl's reward loop scores each apart: the samples
        # of one prompt share these objects in the batch, so a function that changed one in place (popped a
        # key of extra_info) changed what it was given for the prompt's other samples.
        return [{"data_source": column[self.reward_fn_key][i], "response": texts[i], "response_ids": response_ids[i],
                 "ground_truth": copy.deepcopy(column["ground_truth"][i]),
                 "extra_info": copy.deepcopy(column["extra_info"][i]),
                 "raw_prompt": column["raw_prompt"][i], "prompt_text": prompt_texts[i], "row": column["index"][i]}
                for i in range(size)]

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, dict[str, list]]:
        """``(token_level_scores [B, T_resp] float32, columns)``.

        ``columns`` maps each extra key a dict return held to a list of length B (None where a
        sample did not return it; with several functions the key is prefixed ``<function>/``),
        plus ``reward_fn/<name>`` (each function's unweighted score) when there are several
        functions and ``reward_error`` (1 where a score was replaced by 0) with ``on_error=zero``.
        """
        samples = self._samples(batch)
        size = len(samples)
        if self.builtin:
            for source in dict.fromkeys(s["data_source"] for s in samples):
                get_scorer(source)
        raw = run_all(self.functions, samples, self.max_concurrency)
        total = [0.0] * size
        columns: dict[str, list] = {}
        errors = [0] * size
        first_error = None
        several = len(self.functions) > 1
        for fn, results in zip(self.functions, raw):
            per_fn = [0.0] * size
            for i, value in enumerate(results):
                try:
                    score, extras = as_score(value, fn.name, i)
                except RewardError as e:
                    if self.on_error == "raise":
                        sample = samples[i]
                        row = "" if sample["row"] is None else f"row {sample['row']} of the data, "
                        where = (f" ({row}data_source={sample['data_source']!r}, "
                                 f"solution_str={sample['response']!r:.200})")
                        try:
                            as_score(value, fn.name, i, where)
                        except RewardError as named:
                            raise named from (value if isinstance(value, BaseException) else None)
                    errors[i] = 1
                    first_error = first_error or str(e)
                    score, extras = 0.0, {}
                per_fn[i] = score
                total[i] += fn.weight * score
                for key, v in extras.items():
                    columns.setdefault(f"{fn.name}/{key}" if several else key, [None] * size)[i] = v
            if several:
                columns[f"reward_fn/{fn.name}"] = per_fn
        if self.on_error == "zero":
            columns["reward_error"] = errors
            if any(errors):
                logger.warning("%d of %d samples had a reward error and were scored 0 (reward.on_error=zero); "
                               "first: %s", sum(errors), size, first_error)
        return self._place(batch, total), columns

    def _place(self, batch: Batch, total: list[float]) -> torch.Tensor:
        responses, mask = batch["responses"], batch["response_mask"].bool()
        scores = torch.zeros(responses.shape, dtype=torch.float32)
        num_empty = 0
        for i, value in enumerate(total):
            valid = mask[i].nonzero()
            if len(valid) == 0:
                num_empty += 1
                continue
            scores[i, valid[-1, 0]] = value
        if num_empty:
            logger.warning("%d of %d responses are empty; their scores were not placed", num_empty, len(total))
        return scores.to(responses.device)


def _number_as_acc(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` whose number results come back as ``{"score": x, "acc": x}`` (verl's DAPO manager logs a
    plain score as ``acc``); dicts and anything else (an error to report) as they are. Its signature and
    async-ness are kept, so its calling style is read as before."""
    def as_dict(result):
        is_number = isinstance(result, (numbers.Real, np.generic)) and not isinstance(result, dict)
        return {"score": result, "acc": result} if is_number else result

    if inspect.iscoroutinefunction(fn.func if isinstance(fn, functools.partial) else fn):
        @functools.wraps(fn)
        async def scored(*args, **kwargs):
            return as_dict(await fn(*args, **kwargs))
    else:
        @functools.wraps(fn)
        def scored(*args, **kwargs):
            return as_dict(fn(*args, **kwargs))
    return scored


def build_reward_functions(entries: Sequence[dict], custom_path: str | None = None, custom_name: str = "compute_score",
                           custom_kwargs: dict | None = None, reward_manager: str = "naive") -> list[RewardFunction]:
    """Reward functions from config: ``custom_reward_function`` (weight 1) and ``reward.functions``.
    With ``reward_manager="batch"`` (verl's ``reward_model.reward_manager``), ``custom_reward_function``
    is called as verl's batch manager calls it, once per batch with lists, whatever its parameters say.
    With ``"dapo"``, a number it returns is also its ``acc``, as verl's DAPO manager logs it.

    Each entry of ``reward.functions`` is a dict with ``name`` (a function in ``path``, or a
    built-in scorer name such as ``format/think`` when there is no ``path``), and optionally
    ``path``, ``weight`` (default 1.0) and ``kwargs`` (extra keyword arguments bound to it).
    An empty result means: the built-in scorer of each row's data source.
    """
    from verl.rewards.loader import load_reward_function

    functions: list[RewardFunction] = []
    if custom_path:
        fn = load_reward_function(custom_path, custom_name)
        if custom_kwargs:
            fn = functools.partial(fn, **custom_kwargs)
        if reward_manager == "dapo":
            fn = _number_as_acc(fn)
        functions.append(RewardFunction(fn, name=custom_name, style="batch" if reward_manager == "batch" else ""))
    allowed = {"name", "path", "weight", "kwargs"}
    for i, entry in enumerate(entries):
        where = f"reward.functions[{i}]"
        if not isinstance(entry, dict) or "name" not in entry:
            raise RewardError(f"{where} must be a mapping with at least a 'name', e.g. "
                              f"{{name: compute_score, path: my_reward.py, weight: 1.0}}; got {entry!r:.200}")
        unknown = sorted(set(entry) - allowed)
        if unknown:
            raise RewardError(f"{where} has unknown keys {unknown}; allowed: {sorted(allowed)}")
        if entry.get("path"):
            fn = load_reward_function(entry["path"], entry["name"])
        elif entry["name"] in SCORERS:
            fn = SCORERS[entry["name"]]
        else:
            raise RewardError(f"{where}: {entry['name']!r} is not a built-in scorer ({sorted(SCORERS)}); "
                              f"give a 'path' to the python file that defines it")
        if entry.get("kwargs"):
            fn = functools.partial(fn, **dict(entry["kwargs"]))
        given = entry.get("weight", 1.0)
        try:  # text too: a value read from the command line or YAML ("0.5")
            weight = float(given) if not isinstance(given, (bool, np.bool_)) else math.nan
        except (TypeError, ValueError):
            weight = math.nan
        if not math.isfinite(weight):  # before: True weighed 1 and nan made every reward nan, without a word
            raise RewardError(f"{where}.weight must be a finite number, got {given!r}")
        functions.append(RewardFunction(fn, weight=weight, name=entry["name"]))
    return functions
