import math

import numpy as np
import pytest
import torch

from verl.models.tiny import build_char_tokenizer
from verl.protocol import Batch
from verl.rewards import SCORERS, RewardError, RuleRewardManager, default_compute_score

TOK = build_char_tokenizer()


def make_batch(texts, data_source="exact_match", ground_truths=None, width=6):
    """Right-padded responses of the given texts; an EOS closes each one that fits."""
    ids = torch.zeros(len(texts), width, dtype=torch.long)
    mask = torch.zeros(len(texts), width, dtype=torch.long)
    for i, text in enumerate(texts):
        toks = (TOK(text, add_special_tokens=False)["input_ids"] + [TOK.eos_token_id])[:width]
        if not text:
            toks = []
        ids[i, :len(toks)] = torch.tensor(toks, dtype=torch.long)
        mask[i, :len(toks)] = 1
    return Batch({"responses": ids, "response_mask": mask},
                 {"data_source": [data_source] * len(texts),
                  "ground_truth": ground_truths or ["12"] * len(texts),
                  "extra_info": [{"i": i} for i in range(len(texts))]})


def test_score_sits_on_the_last_valid_token_and_eos_is_not_decoded():
    batch = make_batch(["12", "13", "12"])
    scores, extra = RuleRewardManager(TOK)(batch)
    assert scores.dtype == torch.float32 and scores.shape == (3, 6)
    # "12" + eos occupies positions 0..2
    assert scores.tolist() == [[0, 0, 1, 0, 0, 0], [0] * 6, [0, 0, 1, 0, 0, 0]]
    assert extra == {}


def test_custom_function_gets_verl_arguments_by_keyword():
    seen = []

    def compute_score(*, data_source, solution_str, ground_truth, extra_info):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return len(solution_str)

    scores, _ = RuleRewardManager(TOK, compute_score)(make_batch(["abc", "abcdefgh"], data_source="src"))
    assert seen == [("src", "abc", "12", {"i": 0}), ("src", "abcdef", "12", {"i": 1})]
    assert scores[0, 3] == 3 and scores[1, 5] == 6  # a cut response: the score goes on its last token


def test_each_sample_gets_its_own_extra_info_and_ground_truth():
    """The samples of one prompt share its extra_info and ground truth objects in the batch. Before, a function
    that popped a key (verl's reward loop gives each sample its own copy) left the prompt's next samples
    without it, and the dataset row too."""
    info, answers = {"index": 3, "answer": "12"}, ["12", "twelve"]
    batch = make_batch(["12", "12", "12"])
    batch["extra_info"], batch["ground_truth"] = [info] * 3, [answers] * 3
    seen = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((extra_info.pop("answer", None), ground_truth.pop(0)))
        return 1.0

    RuleRewardManager(TOK, compute_score)(batch)
    assert seen == [("12", "12")] * 3
    assert info == {"index": 3, "answer": "12"} and answers == ["12", "twelve"]


def test_verls_batch_manager_passes_reward_model_reward_kwargs_to_the_function(tmp_path, caplog):
    """verl's batch reward manager passes reward_model.reward_kwargs to custom_reward_function at every call.
    Before, they were dropped with a warning about the naive manager, and the function ran with its defaults."""
    from verl.config import ConfigError, TrainerConfig
    from verl.trainer.ppo.roles import reward_worker

    (tmp_path / "r.py").write_text(
        "def scaled(data_sources, solution_strs, ground_truths, extra_infos, scale=1.0, bonus=0.0):\n"
        "    return [scale * float(s == g) + bonus for s, g in zip(solution_strs, ground_truths)]\n")
    args = ["reward_model.reward_manager=batch", f"custom_reward_function.path={tmp_path / 'r.py'}",
            "custom_reward_function.name=scaled", "+reward_model.reward_kwargs.scale=3.0"]
    cfg = TrainerConfig.from_overrides([*args, "custom_reward_function.reward_kwargs={bonus: 0.5}"])
    with caplog.at_level("WARNING", logger="verl.config"):
        cfg.validate()
    assert "reward_kwargs" not in caplog.text
    scores, _ = reward_worker(cfg, tokenizer=TOK).manager(make_batch(["12", "13"]))
    assert scores.sum(-1).tolist() == [3.5, 0.5]
    with pytest.raises(ConfigError, match=r"both give \['scale'\]"):
        TrainerConfig.from_overrides([*args, "custom_reward_function.reward_kwargs={scale: 2.0}"]).validate()


def test_reward_fn_key_picks_the_data_source_column():
    batch = make_batch(["x"])
    batch["task"] = ["exact_match"]
    batch["data_source"] = ["unknown"]
    scores, _ = RuleRewardManager(TOK, reward_fn_key="task")(batch)
    assert scores.sum() == 0


def test_dict_returns_fill_extra_lists_of_batch_length():
    def compute_score(data_source, solution_str, ground_truth, extra_info):
        if extra_info["i"] == 0:
            return {"score": 0.5, "acc": True, "pred": solution_str}
        return {"score": 1, "acc": False}

    scores, extra = RuleRewardManager(TOK, compute_score)(make_batch(["a", "b"]))
    assert scores[:, 1].tolist() == [0.5, 1.0]
    assert extra == {"acc": [True, False], "pred": ["a", None]}


def test_empty_response_score_is_not_placed(caplog):
    scores, extra = RuleRewardManager(TOK, lambda **kw: {"score": 1.0, "n": len(kw["solution_str"])})(
        make_batch(["", "ab"]))
    assert scores[0].abs().sum() == 0 and scores[1, 2] == 1.0
    assert extra == {"n": [0, 2]}
    assert "1 of 2 responses are empty" in caplog.text


def test_unknown_data_source_lists_known_ones_and_the_setting():
    with pytest.raises(RewardError, match=r"'mystery'.*exact_match.*custom_reward_function\.path"):
        RuleRewardManager(TOK)(make_batch(["1"], data_source="mystery"))


@pytest.mark.parametrize("bad", [None, float("nan"), "1.0", [1.0], {"acc": 1.0}])
def test_bad_return_values_are_named_with_the_function_and_sample(bad):
    def flaky(data_source, solution_str, ground_truth, extra_info):
        return bad if extra_info["i"] == 1 else 0.0

    with pytest.raises(RewardError, match=r"flaky.*sample 1") as info:
        RuleRewardManager(TOK, flaky)(make_batch(["a", "b"]))
    if not (isinstance(bad, float) and math.isnan(bad)):
        assert repr(bad) in str(info.value)


def test_a_scorer_that_raises_is_named_with_the_sample():
    def broken(data_source, solution_str, ground_truth, extra_info):
        return int(solution_str)

    with pytest.raises(RewardError, match=r"broken raised ValueError.*sample 0"):
        RuleRewardManager(TOK, broken)(make_batch(["x"]))


def test_a_failing_sample_is_named_by_its_row_of_the_data_with_the_fix():
    """Before, a raise said 'on sample 1' alone (its place in the step's batch, no row of the data and no
    fix), and a dict's score of text said the dict needed a 'score' it had."""
    def strict(data_source, solution_str, ground_truth, extra_info):
        if extra_info["i"] == 1:
            raise ValueError("cannot parse")
        return {"score": "1.0"} if extra_info.get("text") else 1.0

    batch = make_batch(["a", "b"])
    batch["index"] = [40, 41]
    with pytest.raises(RewardError, match=r"strict raised ValueError: cannot parse on sample 1 \(row 41 of the data, "
                                          r"data_source='exact_match', solution_str='b'\); make it return a score .*"
                                          r"reward\.on_error=zero"):
        RuleRewardManager(TOK, strict)(batch)
    batch["extra_info"] = [{"i": 0, "text": True}, {"i": 0}]
    with pytest.raises(RewardError, match=r"strict returned a dict whose 'score' is '1\.0' \(str\) for sample 0 "
                                          r"\(row 40 of the data, "):
        RuleRewardManager(TOK, strict)(batch)


def test_numpy_and_bool_scores_are_accepted():
    values = iter([np.float32(0.25), True])
    scores, _ = RuleRewardManager(TOK, lambda **kw: next(values))(make_batch(["a", "b"]))
    assert scores[:, 1].tolist() == [0.25, 1.0]


def test_default_dispatcher_uses_the_scorers_dict():
    assert "exact_match" in SCORERS
    assert default_compute_score("exact_match", " 12\n", 12) == 1.0
    assert default_compute_score("exact_match", "13", "12") == 0.0
    with pytest.raises(RewardError, match="known"):
        default_compute_score("nope", "1", "1")


def test_a_reward_call_that_does_not_return_is_said_with_the_sample_and_the_line_it_is_at(monkeypatch):
    """Before: a reward function that never returned (a request without a timeout, a loop) left the run
    waiting at the step without a word. Here the function waits until the warning has been said."""
    import logging
    import threading

    from verl.rewards import functions

    said = threading.Event()
    messages = []

    class Catch(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())
            said.set()

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "12":
            said.wait(timeout=30)  # stands in for a call that hangs; released once it has been said
        return 1.0

    monkeypatch.setattr(functions, "SLOW_CALL_S", 0.05)
    handler = Catch(level=logging.WARNING)
    logging.getLogger("verl.rewards.functions").addHandler(handler)
    try:
        scores, _ = RuleRewardManager(TOK, compute_score)(make_batch(["7", "12"]))
    finally:
        logging.getLogger("verl.rewards.functions").removeHandler(handler)
    assert scores.sum().item() == 2.0  # the step goes on once it returns
    assert len(messages) == 1
    assert messages[0].startswith("reward function compute_score has been scoring sample 1 (solution_str='12') for "
                                  "over 0 s and has not returned; it is at ")
    assert "test_rewards_manager.py" in messages[0] and "said.wait(timeout=30)" in messages[0]
