"""DAPO's techniques (Yu et al. 2025) and the rollout importance correction, against numbers
worked out by hand; then the step sampler that applies them, with stub workers."""


import pytest
import torch

from verl.algorithms import (
    add_to_last_token,
    compute_policy_loss,
    compute_policy_loss_gspo,
    groups_with_variance,
    overlong_penalty,
    truncated_is_weights,
    truncated_responses,
)
from verl.config import ConfigError, TrainerConfig
from verl.config.key_errors import check_choice
from verl.data.collate import collate_prompts
from verl.distributed.worker_group import LocalWorkerGroup
from verl.errors import VerlError
from verl.protocol import Batch
from verl.rollout import SamplingParams, assemble_rollout
from verl.trainer.ppo.sampling import StepSampler

# --------------------------------------------------------------------------- dynamic sampling


def test_groups_with_variance_keeps_groups_whose_values_differ():
    values = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 5.0, 0.0, 0.0])
    groups = ["a", "a", "b", "b", "c", "c", "d", "e", "b"]
    # a: {1, 1} uniform; b: {0, 1, 0} differs (its rows need not be adjacent); c: {2, 2} uniform;
    # d: a group of one is uniform; e: {0} uniform.
    assert groups_with_variance(values, groups).tolist() == [False, False, True, True, False, False, False, False,
                                                             True]


def test_groups_with_variance_takes_tensor_ids_and_rejects_a_length_mismatch():
    assert groups_with_variance(torch.tensor([0.5, 0.5, 0.1, 0.2]), torch.tensor([7, 7, 3, 3])).tolist() == \
        [False, False, True, True]
    with pytest.raises(ValueError, match="3 entries"):
        groups_with_variance(torch.zeros(2), ["a", "a", "b"])


# --------------------------------------------------------------------------- overlong reward shaping

def test_overlong_penalty_is_linear_inside_the_buffer():
    # L_max = 10, L_cache = 4: no penalty up to length 6, then -(len - 6) / 4, down to -1 at 10.
    lengths = torch.tensor([3, 6, 7, 8, 10])
    assert overlong_penalty(lengths, 10, 4, 1.0).tolist() == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert overlong_penalty(lengths, 10, 4, 0.5).tolist() == [0.0, 0.0, -0.125, -0.25, -0.5]
    # A buffer as long as the limit penalises from the first token: -len / 10.
    assert overlong_penalty(torch.tensor([0, 5]), 10, 10, 1.0).tolist() == [0.0, -0.5]
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(lengths, 10, 0, 1.0)


def test_add_to_last_token_puts_the_value_on_each_rows_last_valid_token():
    scores = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]])
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    out = add_to_last_token(scores, mask, torch.tensor([-0.5, -9.0, -1.0]))
    assert out.tolist() == [[0.0, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]
    assert scores[0, 2] == 1.0  # the input is not modified


# --------------------------------------------------------------------------- overlong filtering

def test_truncated_responses_are_full_length_without_a_final_eos():
    eos = [2, 9]
    responses = torch.tensor([[5, 6, 7, 8],   # runs to the limit: truncated
                              [5, 2, 0, 0],   # stopped early
                              [5, 6, 7, 2],   # ends with EOS exactly at the limit: complete
                              [5, 6, 7, 9],   # the second EOS id also ends a response
                              [2, 0, 0, 0]])  # EOS at once
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]])
    assert truncated_responses(responses, mask, eos).tolist() == [True, False, False, False, False]


# --------------------------------------------------------------------------- rollout importance correction

def test_truncated_is_weights_by_hand():
    # old - rollout = [ln 0.5, 0, ln 3, junk]: ratios 0.5, 1, 3 -> capped at 2; the 4th is padding.
    rollout = torch.tensor([[0.0, -1.0, -2.0, 50.0]])
    old = rollout + torch.log(torch.tensor([[0.5, 1.0, 3.0, 1.0]]))
    mask = torch.tensor([[1, 1, 1, 0]])
    weights, m = truncated_is_weights(old.requires_grad_(True), rollout, mask, threshold=2.0)
    torch.testing.assert_close(weights, torch.tensor([[0.5, 1.0, 2.0, 0.0]]))
    assert not weights.requires_grad
    assert float(m["actor/rollout_is_weight"]) == pytest.approx(3.5 / 3)
    assert float(m["actor/rollout_is_clipfrac"]) == pytest.approx(1 / 3)


@pytest.mark.parametrize("loss_fn", [compute_policy_loss, compute_policy_loss_gspo])
def test_policy_losses_multiply_each_token_by_the_rollout_weight(loss_fn):
    # logp = old = 0: ratio 1, no clipping. Per-token loss -A * r * w = [-1 * 0.5, +1 * 2] = [-0.5, 2.0];
    # token-mean 0.75. Gradient -A * w * r / 2 tokens = [-0.25, 1.0].
    logp = torch.zeros(1, 2, requires_grad=True)
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    loss, _ = loss_fn(torch.zeros(1, 2), logp, adv, mask, loss_agg_mode="token-mean",
                      rollout_is_weights=torch.tensor([[0.5, 2.0]]))
    assert loss.item() == pytest.approx(0.75)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, 1.0]]))


# --------------------------------------------------------------------------- config checks

def test_unknown_names_get_a_did_you_mean():
    with pytest.raises(ConfigError, match=r"did you mean a\.loss_mode=gspo\? choose one of vanilla, gspo"):
        check_choice("a.loss_mode", "gpso", ["vanilla", "gspo"], "policy loss")
    check_choice("a.loss_mode", "gspo", ["vanilla", "gspo"])


@pytest.mark.parametrize("sections,message", [
    (dict(algorithm=dict(filter_groups=dict(enable=True)), actor_rollout_ref=dict(rollout=dict(n=1)),
          data=dict(train_batch_size=4)), "needs actor_rollout_ref.rollout.n >= 2"),
    (dict(algorithm=dict(filter_groups=dict(enable=True, max_num_gen_batches=0))), "max_num_gen_batches=0"),
    (dict(reward_model=dict(overlong_buffer=dict(enable=True, len=600))), "overlong_buffer.len=600"),
    (dict(actor_rollout_ref=dict(actor=dict(rollout_is_threshold=0.0))), "rollout_is_threshold=0.0"),
])
def test_dapo_settings_are_checked_before_training(sections, message):
    cfg = TrainerConfig(actor_rollout_ref=dict(rollout=dict(n=4), actor=dict(ppo_mini_batch_size=4)),
                        data=dict(train_batch_size=4))
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        cfg.update(sections)  # a single key's range is the schema's (refused when set), the rest validate()'s
        if cfg.actor_rollout_ref.rollout.n == 1:
            cfg.algorithm.adv_estimator = "reinforce_plus_plus"
        cfg.validate()


def test_verls_dapo_max_resp_len_is_taken_when_it_is_the_response_length_and_refused_when_not(caplog):
    """verl's DAPO scripts pass +reward_model.reward_kwargs.max_resp_len=<max_response_length>. Before, it was said
    to have no effect ('the naive reward manager takes no arguments'), and one that differed was dropped: the
    penalty counted from data.max_response_length."""
    def cfg(max_resp_len):
        return TrainerConfig.from_overrides(["reward_model.reward_manager=dapo", "data.max_response_length=64",
                                             "reward_model.overlong_buffer.enable=true",
                                             f"+reward_model.reward_kwargs.max_resp_len={max_resp_len}"])
    with caplog.at_level("WARNING", logger="verl.config"):
        same = cfg(64)
        same.validate()
    assert same.reward_model.reward_kwargs == {} and "max_resp_len" not in caplog.text
    with pytest.raises(ConfigError, match=r"reward_model\.reward_kwargs\.max_resp_len=32 differs from "
                                          r"data\.max_response_length=64"):
        cfg(32).validate()


# --------------------------------------------------------------------------- the step sampler

PAD, EOS = 0, 2


class Policy:
    """Every response is 4 tokens without EOS (a full-length response)."""

    def __init__(self, n):
        self.n = n
        self.greedy_calls = 0

    def pad_token_id(self):
        return PAD

    def sampling_params(self, validate=False):
        return SamplingParams(max_new_tokens=4, n=self.n)

    def generate_sequences(self, prompts, params=None):
        params = params or self.sampling_params()
        self.greedy_calls += params.greedy
        batch = prompts.repeat(params.n) if params.n > 1 else prompts
        return assemble_rollout(batch, torch.full((len(batch), 4), 7), 4, [EOS], PAD)


class Reward:
    """Scores each call's responses with the next list of numbers (on the last token)."""

    def __init__(self, *scores):
        self.scores = list(scores)

    def score(self, batch):
        scores = torch.zeros(batch["responses"].shape)
        scores[:, -1] = torch.tensor(self.scores.pop(0))
        return Batch({"token_level_scores": scores})


def prompts(*lengths):
    items = [dict(input_ids=list(range(10, 10 + n)), raw_prompt=f"p{n}", data_source="t", ground_truth="0",
                  extra_info={}, index=i) for i, n in enumerate(lengths)]
    return collate_prompts(items, PAD)


def sampler(reward, n=2, **algorithm):
    cfg = TrainerConfig(data=dict(train_batch_size=2, max_response_length=4),
                        actor_rollout_ref=dict(rollout=dict(n=n)), algorithm=algorithm)
    return StepSampler(cfg, LocalWorkerGroup(Policy(n), "actor_rollout_ref"), LocalWorkerGroup(reward, "reward"))


def test_dynamic_sampling_draws_until_the_step_is_full_then_trims_to_whole_groups():
    more = iter([prompts(5, 2), prompts(1, 1)])
    s = sampler(Reward([1, 1, 0, 1], [0, 1, 1, 0]), filter_groups=dict(enable=True, max_num_gen_batches=5))
    timing = {}
    batch, metrics = s.generate_and_score(prompts(3, 4), more, timing)
    # Draw 1: group p3 {1, 1} dropped, p4 {0, 1} kept. Draw 2: both kept; the step takes 2 groups.
    assert metrics == {"filter_groups/num_gen_batches": 2, "filter_groups/kept_groups": 3,
                       "filter_groups/dropped_groups": 1, "filter_groups/trained_groups": 2,
                       "filter_groups/cap_hit": 0.0}
    assert batch["raw_prompt"].tolist() == ["p4", "p4", "p5", "p5"]
    assert batch["token_level_scores"].sum(-1).tolist() == [0, 1, 0, 1]
    # Prompts of the two draws (widths 4 and 5) are left-padded to one width, tokens kept.
    assert batch["prompts"].shape[1] == 5 and batch["prompts"][0].tolist() == [PAD, 10, 11, 12, 13]
    assert batch["input_ids"].shape[1] == 9 and batch["attention_mask"][0].tolist() == [0] + [1] * 8
    assert batch["position_ids"][0].tolist() == [0, 0, 1, 2, 3, 4, 5, 6, 7]
    assert next(more)["raw_prompt"].tolist() == ["p1", "p1"]  # exactly one extra batch was drawn
    assert timing["timing_s/gen"] > 0 and timing["timing_s/reward"] > 0


def test_dynamic_sampling_at_the_cap_trains_on_the_kept_groups():
    s = sampler(Reward([1, 1, 0, 0], [0, 1, 1, 1]), filter_groups=dict(enable=True, max_num_gen_batches=2))
    batch, metrics = s.generate_and_score(prompts(3, 4), iter([prompts(5, 6)]), {})
    assert (metrics["filter_groups/kept_groups"], metrics["filter_groups/trained_groups"],
            metrics["filter_groups/cap_hit"]) == (1, 1, 1.0)
    assert batch["raw_prompt"].tolist() == ["p5", "p5"]


def test_dynamic_sampling_without_any_informative_group_keeps_the_last_batch():
    s = sampler(Reward([1, 1, 0, 0], [0, 0, 0, 0]), filter_groups=dict(enable=True, max_num_gen_batches=2))
    batch, metrics = s.generate_and_score(prompts(3, 4), iter([prompts(5, 6)]), {})
    assert (metrics["filter_groups/kept_groups"], metrics["filter_groups/dropped_groups"],
            metrics["filter_groups/trained_groups"], metrics["filter_groups/cap_hit"]) == (0, 4, 2, 1.0)
    assert batch["raw_prompt"].tolist() == ["p5", "p5", "p6", "p6"]


def test_filter_metric_can_be_a_key_the_reward_function_returns():
    class WithAcc(Reward):
        def score(self, batch):
            out = super().score(batch)
            out["reward_extra/acc"] = [True, False, True, True]
            return out

    s = sampler(WithAcc([0, 0, 0, 0]), filter_groups=dict(enable=True, metric="acc", max_num_gen_batches=1))
    batch, metrics = s.generate_and_score(prompts(3, 4), iter([]), {})
    assert metrics["filter_groups/kept_groups"] == 1 and metrics["filter_groups/cap_hit"] == 1.0
    s = sampler(Reward([0, 1, 0, 1]), filter_groups=dict(enable=True, metric="accuracy"))
    with pytest.raises(VerlError, match="metric='accuracy'.*no such key"):
        s.generate_and_score(prompts(3, 4), iter([]), {})


def test_remax_baseline_is_the_greedy_score_of_each_prompt():
    s = sampler(Reward([0.5, 0.25], [1, 0, 0, 1]), adv_estimator="remax")
    timing = {}
    batch, metrics = s.generate_and_score(prompts(3, 4), iter([]), timing)
    assert metrics == {}
    assert batch["reward_baselines"].tolist() == [0.5, 0.5, 0.25, 0.25]
    assert batch["token_level_scores"].sum(-1).tolist() == [1, 0, 0, 1]
    assert s.actor_rollout_ref.worker.greedy_calls == 1 and "timing_s/gen_baseline" in timing


def test_overlong_shaping_lowers_training_scores_of_full_length_responses():
    cfg = dict(overlong_buffer=dict(enable=True, len=2, penalty_factor=0.5))
    s = sampler(Reward([1, 0, 1, 1]))
    s.config.reward_model.update(cfg)
    batch, _ = s.generate_and_score(prompts(3, 4), iter([]), {})
    # Length 4 = L_max: the whole factor, -0.5, on the last token.
    assert batch["token_level_scores"][:, -1].tolist() == [0.5, -0.5, 0.5, 0.5]
    assert batch["reward_extra/overlong_penalty"].tolist() == [-0.5] * 4
