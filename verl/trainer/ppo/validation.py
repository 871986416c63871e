"""Validation: greedy and sampled decoding on the validation set, scored per data source.

Passes, each over every validation batch:

* greedy (always): one response per prompt -> ``val-core/<source>/reward/mean@1``;
* sampled, when ``trainer.val_sampled`` or ``rollout.val_kwargs.do_sample`` or
  ``rollout.val_kwargs.n > 1``: N = ``val_kwargs.n`` responses per prompt, sampled with
  ``val_kwargs`` when ``val_kwargs.do_sample`` is true, else with the training rollout's settings.
  N = 1 logs ``val-aux/<source>/reward/sampled_mean@1``; N > 1 logs, under ``val-core``:

  - ``mean@N``: the mean score of all N x prompts responses;
  - ``best@N``: the mean over prompts of the best of its N scores (pass@N for 0/1 rewards);
  - ``maj@N``: the mean over prompts of the score of its majority answer. A response's answer is
    the ``pred`` its reward function returned (``{"score": ..., "pred": ...}``; with several
    functions, the first that returned one), else its text
    with surrounding whitespace stripped. Ties go to the answer seen first; when responses
    with the same answer scored differently, their mean is taken.

The numeric keys a reward function's dict returns beside ``"score"`` are averaged per data source
too: ``val-aux/<source>/<key>/mean@1`` (greedy), ``.../sampled_mean@1`` or ``.../mean@N`` (sampled);
``acc``, verl's accuracy key, goes under ``val-core``. Text values (``pred``) are not averaged.

``trainer.log_val_generations: N`` also logs N greedy samples (prompt, response, score) at each
validation, the same prompts every time (``select_generations``), through every logger.
"""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from typing import Sequence

from verl.rollout.seeding import with_prompt_seeds
from verl.trainer.ppo.core import extra_number


def at_n_metrics(scores: Sequence[float], answers: Sequence[object], groups: Sequence[object]) -> dict[str, float]:
    """``{"mean": ..., "best": ..., "maj": ...}`` over prompts whose N samples share a group id."""
    by_group: dict[object, list[int]] = defaultdict(list)
    for i, group in enumerate(groups):
        by_group[group].append(i)
    best, maj = [], []
    for members in by_group.values():
        best.append(max(scores[i] for i in members))
        votes: dict[object, list[float]] = {}
        for i in members:
            votes.setdefault(_hashable(answers[i]), []).append(scores[i])
        top = max(votes.values(), key=len)  # max keeps the first of equal counts: ties go to the earliest
        maj.append(sum(top) / len(top))
    return {"mean": sum(scores) / len(scores), "best": sum(best) / len(best), "maj": sum(maj) / len(maj)}


def _hashable(answer: object) -> object:
    if isinstance(answer, str):
        return answer.strip()
    try:
        hash(answer)
        return answer
    except TypeError:
        return repr(answer)


def _answers(scored, size: int) -> list:
    """Each response's ``pred`` (of the first function that returned one, with several), else None."""
    keys = [k for k in scored.keys() if k == "reward_extra/pred" or
            (k.startswith("reward_extra/") and k.endswith("/pred"))]
    columns = [list(scored[k]) for k in keys]
    return [next((c[i] for c in columns if c[i] is not None), None) for i in range(size)]


def validation_passes(actor_rollout_ref, config) -> list[tuple[str, object]]:
    """``[(kind, sampling params)]``: "greedy" always; "sampled" when asked for (see module doc)."""
    val = config.actor_rollout_ref.rollout.val_kwargs
    greedy = dataclasses.replace(actor_rollout_ref.call("sampling_params", validate=True), n=1, do_sample=False)
    passes = [("greedy", greedy)]
    if config.trainer.val_sampled or val.do_sample or val.n > 1:
        params = actor_rollout_ref.call("sampling_params", validate=val.do_sample)
        passes.append(("sampled", dataclasses.replace(params, n=val.n, do_sample=True, logprobs=False)))
    return passes


def select_generations(rows: list[dict], n: int) -> list[dict]:
    """``n`` of the greedy validation samples, the same prompts at every validation (as verl: the
    rows sorted by prompt, shuffled with seed 42)."""
    rows = sorted(rows, key=lambda row: row["prompt"])
    random.Random(42).shuffle(rows)
    return rows[:n]


def validation_requests(actor_rollout_ref, val_batches, config) -> list[tuple[str, object, object]]:
    """``[(kind, sampling params, prompts)]``: every generation a validation asks for, pass by pass
    (:func:`validation_passes`), batch by batch. The same seeds at every validation: the sampled
    scores of two steps differ by the policy, not by the luck of the draw."""
    return [(kind, params, with_prompt_seeds(prompts, config.trainer.seed, -1 - number))
            for kind, params in validation_passes(actor_rollout_ref, config)
            for number, prompts in enumerate(val_batches)]


def run_validation(actor_rollout_ref, reward, val_batches, config,
                   generations: list[dict] | None = None) -> dict[str, float]:
    """All validation metrics (names in the module doc), generated by the ``actor_rollout_ref`` group. With a
    ``generations`` list, each greedy sample is appended to it as ``{"prompt", "response", "score"}`` (texts
    decoded, special tokens dropped)."""
    # one batch generated, then scored, at a time
    answers = ((kind, params.n, actor_rollout_ref.run("generate_sequences", prompts, params=params))
               for kind, params, prompts in validation_requests(actor_rollout_ref, val_batches, config))
    return validation_metrics(actor_rollout_ref, reward, answers, generations)


def validation_metrics(actor_rollout_ref, reward, answers, generations: list[dict] | None = None
                       ) -> dict[str, float]:
    """The metrics of ``answers``, ``(kind, n, generated batch)`` in :func:`validation_requests`' order;
    ``generations`` as :func:`run_validation`'s."""
    metrics: dict[str, float] = {}
    passes: dict[str, tuple[int, dict]] = {}
    for kind, n, out in answers:
        rows = passes.setdefault(kind, (n, defaultdict(lambda: ([], [], [], defaultdict(list)))))[1]
        # scored here even where the rollout scored it: its scores carry training's shaping (overlong penalty,
        # agent rewards), validation's are the reward functions' alone
        scored = reward.run("score", out)
        scores = scored["token_level_scores"].sum(-1).tolist()
        if kind == "greedy" and generations is not None:
            prompt_texts = actor_rollout_ref.call("decode", out["prompts"])
            response_texts = actor_rollout_ref.call("decode", out["responses"])
            generations += [{"prompt": p, "response": r, "score": s}
                            for p, r, s in zip(prompt_texts, response_texts, scores)]
        # Answers are only voted on by maj@N; the response text stands in where no pred came back.
        voted = _answers(scored, len(out)) if kind == "sampled" and n > 1 else [""] * len(out)
        unanswered = [i for i, a in enumerate(voted) if a is None]
        if unanswered:
            texts = actor_rollout_ref.call("decode", out["responses"][unanswered])
            for i, text in zip(unanswered, texts):
                voted[i] = text
        extras = {k.split("/", 1)[1]: list(scored[k]) for k in scored.keys()
                  if k.startswith("reward_extra/") and k != "reward_extra/reward_error"}
        for i, source in enumerate(out["data_source"]):
            bucket = rows[str(source)]
            bucket[0].append(scores[i])
            bucket[1].append(voted[i])
            bucket[2].append(out["uid"][i])
            for key, values in extras.items():
                number = extra_number(values[i])
                if number is not None:
                    bucket[3][key].append(number)
    for kind, (n, rows) in passes.items():
        for source, (scores, voted, groups, extras) in rows.items():
            if kind == "greedy":
                metrics[f"val-core/{source}/reward/mean@1"] = sum(scores) / len(scores)
            elif n == 1:
                metrics[f"val-aux/{source}/reward/sampled_mean@1"] = sum(scores) / len(scores)
            else:
                for name, value in at_n_metrics(scores, voted, groups).items():
                    metrics[f"val-core/{source}/reward/{name}@{n}"] = value
            # A dict's other numeric keys, as verl logs them (its "acc" under val-core).
            mean = "mean@1" if kind == "greedy" else ("sampled_mean@1" if n == 1 else f"mean@{n}")
            for key, values in extras.items():
                section = "val-core" if key == "acc" else "val-aux"
                metrics[f"{section}/{source}/{key}/{mean}"] = sum(values) / len(values)
    return metrics
