"""Several weighted reward functions, TRL's calling style, async functions, and reward.on_error."""

import asyncio
import functools
import re

import pytest
import torch

from verl.models.tiny import build_char_tokenizer
from verl.protocol import Batch
from verl.rewards import RewardError, RuleRewardManager
from verl.rewards.functions import RewardFunction
from verl.rewards.manager import build_reward_functions
from verl.workers.reward import RewardWorker

TOK = build_char_tokenizer()


def make_batch(texts, prompts=None, width=8):
    ids = torch.zeros(len(texts), width, dtype=torch.long)
    mask = torch.zeros(len(texts), width, dtype=torch.long)
    for i, text in enumerate(texts):
        toks = TOK(text, add_special_tokens=False)["input_ids"][:width]
        ids[i, :len(toks)] = torch.tensor(toks, dtype=torch.long)
        mask[i, :len(toks)] = 1
    prompts = prompts or [[{"role": "user", "content": f"q{i}"}] for i in range(len(texts))]
    return Batch({"responses": ids, "response_mask": mask},
                 {"data_source": ["src"] * len(texts), "ground_truth": ["12"] * len(texts),
                  "extra_info": [{"i": i, "level": i * 10} for i in range(len(texts))], "raw_prompt": prompts})


def last_token_scores(scores, batch):
    mask = batch["response_mask"]
    return [scores[i, int(mask[i].sum()) - 1].item() for i in range(len(batch))]


def is_twelve(data_source, solution_str, ground_truth, extra_info):
    return float(solution_str == ground_truth)


def short(prompts, completions, **kwargs):
    return [1.0 if len(c[0]["content"]) <= 2 else 0.0 for c in completions]


def test_weighted_sum_of_a_verl_and_a_trl_function():
    # "12": is_twelve 1, short 1 -> 1*1 + 0.5*1 = 1.5; "123": 0 + 0 = 0; "7": 0 + 0.5 = 0.5
    batch = make_batch(["12", "123", "7"])
    manager = RuleRewardManager(TOK, functions=[RewardFunction(is_twelve, 1.0), RewardFunction(short, 0.5)])
    assert [f.style for f in manager.functions] == ["verl", "trl"]
    scores, columns = manager(batch)
    assert last_token_scores(scores, batch) == [1.5, 0.0, 0.5]
    assert columns["reward_fn/is_twelve"] == [1.0, 0.0, 0.0]
    assert columns["reward_fn/short"] == [1.0, 0.0, 1.0]


def test_trl_functions_get_prompts_completions_and_columns():
    seen = {}

    def spy(prompts, completions, ground_truth, level, **kwargs):
        seen.update(prompts=prompts, completions=completions, ground_truth=ground_truth, level=level,
                    solution=kwargs["solution"], completion_ids=kwargs["completion_ids"])
        return [0.0] * len(completions)

    plain = make_batch(["ab", "c"], prompts=["what?", "who?"])
    RuleRewardManager(TOK, spy)(plain)
    assert seen["prompts"] == ["what?", "who?"] and seen["completions"] == ["ab", "c"]
    assert seen["ground_truth"] == ["12", "12"] and seen["solution"] == ["12", "12"]
    assert seen["level"] == [0, 10]  # extra_info keys are passed as columns, as TRL passes dataset columns
    assert seen["completion_ids"] == [TOK("ab", add_special_tokens=False)["input_ids"], [TOK.convert_tokens_to_ids("c")]]
    chat = make_batch(["ab"])
    RuleRewardManager(TOK, spy)(chat)
    assert seen["completions"] == [[{"role": "assistant", "content": "ab"}]]


def test_a_trl_function_returning_the_wrong_count_is_named():
    def two_short(prompts, completions, **kwargs):
        return [1.0] * (len(completions) - 1)

    with pytest.raises(RewardError, match=r"two_short returned 2 scores for 3 completions"):
        RuleRewardManager(TOK, two_short)(make_batch(["a", "b", "c"]))


def test_a_batch_function_returning_an_array_a_column_or_one_number():
    """A [B] array or tensor scores as its list, a [B, 1] column (a model's scores) as [B]; one number for the
    batch (np.mean(...), a 0-d tensor) is named. Before: the column failed as "returned [0.5] (list) for
    sample 0", and the number with "TypeError: object of type 'float' has no len()"."""
    import numpy as np

    batch = make_batch(["a", "bc"])
    expected = RuleRewardManager(TOK, lambda prompts, completions, **kw: [0.5, 1.0])(batch)[0]
    for out in (np.array([0.5, 1.0]), torch.tensor([0.5, 1.0], dtype=torch.float64), torch.tensor([[0.5], [1.0]]),
                np.array([[0.5], [1.0]], dtype=np.float32)):
        assert torch.equal(RuleRewardManager(TOK, lambda prompts, completions, out=out, **kw: out)(batch)[0], expected)
    for out in (np.float64(0.75), torch.tensor(0.75)):
        def mean(data_sources, solution_strs, ground_truths, extra_infos, out=out):
            return out

        with pytest.raises(RewardError, match=r"mean returned one number \(0.75\) for the batch of 2 completions; "
                                              r"a function taking \(data_sources, .*one score per completion"):
            RuleRewardManager(TOK, mean)(batch)


def test_a_trl_function_returning_none_names_the_sample_and_value():
    def gaps(prompts, completions, **kwargs):
        return [1.0, None]

    with pytest.raises(RewardError, match=r"gaps returned None \(NoneType\) for sample 1"):
        RuleRewardManager(TOK, gaps)(make_batch(["a", "b"]))


def test_async_verl_function_scores_samples_concurrently():
    in_flight = {"now": 0, "max": 0}

    async def slow(data_source, solution_str, ground_truth, extra_info):
        in_flight["now"] += 1
        in_flight["max"] = max(in_flight["max"], in_flight["now"])
        await asyncio.sleep(0.05)
        in_flight["now"] -= 1
        return float(len(solution_str))

    batch = make_batch(["a", "bb", "ccc", "dddd", "eeeee", "ffffff"])
    scores, _ = RuleRewardManager(TOK, slow, max_concurrency=4)(batch)
    assert last_token_scores(scores, batch) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert in_flight["max"] == 4  # the cap, reached: they overlapped


def test_async_functions_of_both_styles_overlap_each_other():
    started = []

    async def a(prompts, completions, **kwargs):
        started.append("a")
        await asyncio.sleep(0.05)
        return [float("b" in started)] * len(completions)  # b started while a was waiting

    async def b(prompts, completions, **kwargs):
        started.append("b")
        await asyncio.sleep(0.05)
        return [float("a" in started)] * len(completions)

    batch = make_batch(["x"])
    scores, _ = RuleRewardManager(TOK, functions=[a, b])(batch)
    assert last_token_scores(scores, batch) == [2.0]


def test_manager_works_inside_a_running_event_loop():
    async def inside():
        return RuleRewardManager(TOK, is_twelve)(make_batch(["12"]))[0]

    scores = asyncio.run(inside())
    assert scores.sum().item() == 1.0


@pytest.mark.parametrize("bad", [None, float("nan"), "0.5", ValueError("boom")])
def test_on_error_zero_scores_the_sample_0_and_counts_it(bad, caplog):
    def flaky(data_source, solution_str, ground_truth, extra_info):
        if extra_info["i"] == 1:
            if isinstance(bad, Exception):
                raise bad
            return bad
        return 1.0

    batch = make_batch(["a", "b", "c"])
    scores, columns = RuleRewardManager(TOK, flaky, on_error="zero")(batch)
    assert last_token_scores(scores, batch) == [1.0, 0.0, 1.0]
    assert columns["reward_error"] == [0, 1, 0]
    assert "1 of 3 samples had a reward error" in caplog.text and "flaky" in caplog.text


def test_on_error_raise_names_function_sample_and_value():
    def flaky(data_source, solution_str, ground_truth, extra_info):
        return "oops" if extra_info["i"] == 2 else 1.0

    with pytest.raises(RewardError, match=r"flaky returned 'oops' \(str\) for sample 2.*reward\.on_error=zero"):
        RuleRewardManager(TOK, flaky)(make_batch(["a", "b", "c"]))


def test_unknown_data_source_is_an_error_even_with_on_error_zero():
    batch = make_batch(["a"])
    with pytest.raises(RewardError, match="no built-in reward scorer for data_source='src'.*custom_reward_function.path"
                                          ".*or, for rows a learned reward model scores .*reward_model.enable=true"):
        RuleRewardManager(TOK, on_error="zero")(batch)


def test_extras_of_several_functions_are_prefixed_by_function():
    def with_pred(data_source, solution_str, ground_truth, extra_info):
        return {"score": 1.0, "pred": solution_str}

    _, columns = RuleRewardManager(TOK, functions=[with_pred, is_twelve])(make_batch(["12", "3"]))
    assert columns["with_pred/pred"] == ["12", "3"]


def test_duplicate_function_names_are_refused():
    with pytest.raises(RewardError, match="both named"):
        RuleRewardManager(TOK, functions=[is_twelve, is_twelve])


def test_functions_from_config_entries(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text("def length_bonus(data_source, solution_str, ground_truth, extra_info, scale=1.0):\n"
                    "    return scale * len(solution_str)\n")
    functions = build_reward_functions([{"name": "length_bonus", "path": str(path), "weight": 2, "kwargs": {"scale": 0.5}},
                                        {"name": "exact_match", "weight": 0.25}])
    batch = make_batch(["12", "1234"])
    scores, _ = RuleRewardManager(TOK, functions=functions)(batch)
    # "12": 2 * 0.5 * 2 + 0.25 * 1 = 2.25; "1234": 2 * 0.5 * 4 + 0 = 4.0
    assert last_token_scores(scores, batch) == [2.25, 4.0]


@pytest.mark.parametrize("entry, message", [
    ({"path": "x.py"}, r"reward\.functions\[0\] must be a mapping with at least a 'name'"),
    ({"name": "exact_match", "wieght": 2}, r"unknown keys \['wieght'\]"),
    ({"name": "nope"}, r"'nope' is not a built-in scorer.*give a 'path'"),
    ({"name": "exact_match", "weight": "heavy"}, r"weight must be a finite number, got 'heavy'"),
    # Before: True weighed 1, and nan made every reward nan, without a word.
    ({"name": "exact_match", "weight": True}, r"reward\.functions\[0\]\.weight must be a finite number, got True"),
    ({"name": "exact_match", "weight": float("nan")}, r"weight must be a finite number, got nan"),
])
def test_bad_config_entries_are_explained(entry, message):
    with pytest.raises(RewardError, match=message):
        build_reward_functions([entry])
    if "weight" in entry:  # a number as text (the command line, YAML) and numpy's numbers weigh as the number
        import numpy as np

        weights = [f.weight for f in build_reward_functions([{**entry, "weight": w} for w in ("0.5", np.float32(2), 3)])]
        assert weights == [0.5, 2.0, 3.0]


def test_custom_function_with_bound_kwargs(tmp_path):
    path = tmp_path / "r.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info, bonus=0.0):\n"
                    "    return bonus\n")
    [fn] = build_reward_functions([], str(path), "compute_score", {"bonus": 0.75})
    assert isinstance(fn.fn, functools.partial) and fn.name == "compute_score"
    batch = make_batch(["a"])
    assert last_token_scores(RuleRewardManager(TOK, functions=[fn])(batch)[0], batch) == [0.75]


class ConstantRewardModel:
    def score(self, batch):
        return torch.arange(len(batch), dtype=torch.float32) + 10


def test_reward_worker_adds_the_reward_model_score_with_its_weight():
    batch = make_batch(["12", "abc"])
    out = RewardWorker(RuleRewardManager(TOK, is_twelve), ConstantRewardModel(), reward_model_weight=0.5).score(batch)
    # rule 1 + 0.5 * 10 = 6; rule 0 + 0.5 * 11 = 5.5, each on its last valid token only
    assert last_token_scores(out["token_level_scores"], batch) == [6.0, 5.5]
    assert out["token_level_scores"].sum().item() == 11.5
    assert list(out["reward_extra/rm_score"]) == [10.0, 11.0]
    rm_only = RewardWorker(None, ConstantRewardModel()).score(batch)
    assert last_token_scores(rm_only["token_level_scores"], batch) == [10.0, 11.0]


@pytest.mark.parametrize("define, missing", [
    ("def compute_score(solution, gt):\n    return 1.0\n", "missing a required argument: 'solution'"),
    ("def compute_score(data_source, solution_str, ground_truth):\n    return 1.0\n",
     "got an unexpected keyword argument 'extra_info'"),
    ("def compute_score(data_source, response, ground_truth, extra_info=None):\n    return 1.0\n",
     "missing a required argument: 'response'"),
])
def test_a_function_that_cannot_take_verls_arguments_fails_when_loaded_not_at_the_first_step(tmp_path, define, missing):
    # With reward.on_error=zero its TypeError would otherwise score every sample of the run 0.
    path = tmp_path / "my_reward.py"
    path.write_text(define)
    with pytest.raises(RewardError, match=r"^reward function compute_score\(.*\) cannot be called with the arguments "
                                          r"data_source, solution_str, ground_truth, extra_info \(" + re.escape(missing)
                                          + r"\); define it as def compute_score\(data_source, solution_str, "
                                            r"ground_truth, extra_info=None\)"):
        build_reward_functions([], custom_path=str(path))


def test_verl_and_trl_signatures_that_take_the_arguments_load():
    def keywords(**kwargs):
        return 1.0

    def with_defaults(data_source, solution_str, ground_truth, extra_info=None, scale=2.0):
        return scale

    def trl_with_a_column(prompts, completions, level, **kwargs):  # level: a column of the data, given at the call
        return [0.0] * len(completions)

    for fn in (keywords, with_defaults, trl_with_a_column, functools.partial(with_defaults, scale=3.0)):
        RewardFunction(fn)
    with pytest.raises(RewardError, match=r"^reward function strict\(prompts, completions\) cannot be called with "
                                          r"the arguments prompts, completions, completion_ids, .*unexpected keyword "
                                          r"argument 'completion_ids'.*def reward\(prompts, completions, \*\*kwargs\)"):
        RewardFunction(lambda prompts, completions: [0.0], name="strict")


def batch_first_is_twelve(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
    """verl's batch reward manager's signature: lists in, one result per response out."""
    return [{"score": float(s == g), "level": e["level"], "source_is_src": d == "src"}
            for d, s, g, e in zip(data_sources, solution_strs, ground_truths, extra_infos)]


def test_a_function_in_verls_batch_manager_signature_is_called_once_with_lists():
    calls = []

    def spy(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
        calls.append((list(data_sources), list(solution_strs), list(ground_truths), kwargs))
        return batch_first_is_twelve(data_sources, solution_strs, ground_truths, extra_infos)

    batch = make_batch(["12", "123", "12"])
    manager = RuleRewardManager(TOK, functions=[RewardFunction(functools.partial(spy, scale=2))])
    assert manager.functions[0].style == "batch"
    scores, columns = manager(batch)
    assert calls == [(["src"] * 3, ["12", "123", "12"], ["12"] * 3, {"scale": 2})]
    assert last_token_scores(scores, batch) == [1.0, 0.0, 1.0]
    assert columns["level"] == [0, 10, 20] and columns["source_is_src"] == [True] * 3


def test_reward_manager_batch_calls_the_custom_function_once_per_batch(tmp_path):
    path = tmp_path / "batched.py"
    path.write_text("def compute_score(**kwargs):\n"  # nothing in the signature says batch: the manager does
                    "    return [float(s == '12') for s in kwargs['solution_strs']]\n")
    [fn] = build_reward_functions([], str(path), "compute_score", reward_manager="batch")
    batch = make_batch(["12", "7"])
    scores, _ = RuleRewardManager(TOK, functions=[fn])(batch)
    assert last_token_scores(scores, batch) == [1.0, 0.0]


def test_reward_manager_batch_with_a_per_sample_function_says_both_fixes(tmp_path):
    path = tmp_path / "per_sample.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    with pytest.raises(RewardError, match=r"cannot be called with the arguments data_sources, solution_strs.*"
                                          r"leave reward_model.reward_manager at naive"):
        build_reward_functions([], str(path), "compute_score", reward_manager="batch")


def test_reward_manager_batch_is_accepted_by_the_config():
    from verl.config import TrainerConfig

    assert TrainerConfig.from_overrides(["reward_model.reward_manager=batch"]).reward_model.reward_manager == "batch"


def test_reward_manager_dapo_logs_a_number_result_as_acc_too(tmp_path):
    # verl's DAPO manager: a plain score is also reward_extra_info["acc"]; a dict is taken as it is
    path = tmp_path / "dapo.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return solution_str == '12'\n"
                    "async def as_dict(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return {'score': 0.5, 'acc': False}\n"
                    "def broken(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return None\n")
    batch = make_batch(["12", "7"])
    [fn] = build_reward_functions([], str(path), "compute_score", reward_manager="dapo")
    scores, columns = RuleRewardManager(TOK, functions=[fn])(batch)
    assert last_token_scores(scores, batch) == [1.0, 0.0] and columns["acc"] == [True, False]
    [fn] = build_reward_functions([], str(path), "as_dict", reward_manager="dapo")
    assert fn.is_async and RuleRewardManager(TOK, functions=[fn])(batch)[1]["acc"] == [False, False]
    [fn] = build_reward_functions([], str(path), "broken", reward_manager="dapo")
    with pytest.raises(RewardError, match="returned None"):
        RuleRewardManager(TOK, functions=[fn])(batch)
    [fn] = build_reward_functions([], str(path), "compute_score")  # naive: no acc added
    assert "acc" not in RuleRewardManager(TOK, functions=[fn])(batch)[1]
