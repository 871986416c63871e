"""Advantage estimators against hand-worked numbers, plus their edge cases."""

import math

import numpy as np
import pytest
import torch

from verl.algorithms.advantages import (
    ADV_ESTIMATORS,
    compute_advantage,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
)


def close(a, b, atol=1e-5):
    return torch.allclose(a, torch.as_tensor(b, dtype=a.dtype), atol=atol)


# ---------------------------------------------------------------- GAE


def test_gae_one_row_by_hand_before_whitening():
    # gamma = 0.9, lam = 0.8 (gamma * lam = 0.72); the 4th position is padding with junk in it.
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0]])
    values = torch.tensor([[0.5, 0.4, 0.6, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8, whiten=False)
    # t=2 (last valid, terminal): delta = 1 + 0.9*0 - 0.6 = 0.4;             A2 = 0.4
    # t=1: delta = 0 + 0.9*0.6 - 0.4 = 0.14;   A1 = 0.14 + 0.72*0.4 = 0.428
    # t=0: delta = 0 + 0.9*0.4 - 0.5 = -0.14;  A0 = -0.14 + 0.72*0.428 = 0.16816
    assert close(adv, [[0.16816, 0.428, 0.4, 0.0]])
    # returns = A + V = [0.66816, 0.828, 1.0], padding 0
    assert close(ret, [[0.66816, 0.828, 1.0, 0.0]])


def test_gae_whitened_by_hand():
    # gamma = lam = 1 and V = 0 make A the undiscounted return-to-go.
    rewards = torch.tensor([[1.0, 0.0, 7.0], [3.0, 0.0, 7.0]])
    values = torch.tensor([[0.0, 0.0, 9.0], [0.0, 0.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    # raw A: row 0 [1, 0], row 1 [3, 0]; mean 4/4 = 1; deviations 0, -1, 2, -1
    # unbiased var (0 + 1 + 4 + 1) / 3 = 2 -> whitened [0, -1/sqrt2, 2/sqrt2, -1/sqrt2]
    s = 1.0 / math.sqrt(2.0)
    assert close(adv, [[0.0, -s, 0.0], [2 * s, -s, 0.0]])
    assert close(ret, [[1.0, 0.0, 0.0], [3.0, 0.0, 0.0]])  # returns are not whitened


def test_gae_skips_holes_in_the_mask():
    # A masked token inside the response (e.g. tool output) neither adds reward nor cuts the chain.
    rewards = torch.tensor([[0.0, 100.0, 1.0]])
    values = torch.tensor([[0.0, 50.0, 0.2]])
    mask = torch.tensor([[1, 0, 1]])
    adv, _ = compute_gae_advantage_return(rewards, values, mask, gamma=0.5, lam=1.0, whiten=False)
    # t=2: delta = 1 - 0.2 = 0.8, A2 = 0.8; t=1 skipped
    # t=0: next valid value is V2 = 0.2: delta = 0 + 0.5*0.2 - 0 = 0.1; A0 = 0.1 + 0.5*0.8 = 0.5
    assert close(adv, [[0.5, 0.0, 0.8]])


def test_gae_fully_masked_and_zero_length():
    adv, ret = compute_gae_advantage_return(torch.ones(2, 3), torch.ones(2, 3), torch.zeros(2, 3), 1.0, 1.0)
    assert torch.equal(adv, torch.zeros(2, 3)) and torch.equal(ret, torch.zeros(2, 3))
    adv, ret = compute_gae_advantage_return(torch.zeros(2, 0), torch.zeros(2, 0), torch.zeros(2, 0), 1.0, 1.0)
    assert adv.shape == (2, 0) and ret.shape == (2, 0)


# ---------------------------------------------------------------- group estimators

# Six samples, T = 3, the score on the last valid token (one row splits it over two tokens).
GROUPS = ["a", "a", "a", "b", "b", "c"]
REWARDS = torch.tensor(
    [
        [0.0, 0.0, 1.0],  # a: score 1
        [0.0, 0.0, 0.0],  # a: score 0
        [0.0, 3.0, 1.0],  # a: score 4 (3 + 1)
        [0.0, 5.0, 9.0],  # b: score 5 (the 9 sits in padding)
        [5.0, 0.0, 0.0],  # b: score 5
        [0.0, 0.0, 3.0],  # c: score 3, alone in its group
    ]
)
MASK = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])


def per_token(per_seq):
    return torch.tensor(per_seq).unsqueeze(-1) * MASK


def test_grpo_by_hand():
    adv, ret = compute_grpo_outcome_advantage(REWARDS, MASK, GROUPS, epsilon=1e-6)
    # group a: scores 1, 0, 4; mean 5/3; deviations -2/3, -5/3, 7/3
    #   unbiased var (4 + 25 + 49) / 9 / 2 = 78/18 = 13/3; std = sqrt(13/3) = 2.0816660
    #   A = -0.6666667/2.0816660, -1.6666667/2.0816660, 2.3333333/2.0816660 = -0.3202563, -0.8006408, 1.1208971
    # group b: 5, 5 -> std 0, A = 0 / (0 + eps) = 0 (no NaN)
    # group c: a single sample -> A = 0
    expected = per_token([-0.3202563, -0.8006408, 1.1208971, 0.0, 0.0, 0.0])
    assert close(adv, expected)
    assert torch.equal(adv, ret)


def test_dr_grpo_drops_the_std():
    adv, _ = compute_grpo_outcome_advantage(REWARDS, MASK, GROUPS, norm_adv_by_std_in_grpo=False)
    # scores - group mean: 1 - 5/3, 0 - 5/3, 4 - 5/3; 0, 0; 0
    assert close(adv, per_token([-2 / 3, -5 / 3, 7 / 3, 0.0, 0.0, 0.0]))


@pytest.mark.parametrize(
    "groups",
    [
        np.array(GROUPS, dtype=object),
        np.array(GROUPS),
        torch.tensor([7, 7, 7, 2, 2, 0]),
        [10, 10, 10, "x", "x", None],
    ],
)
def test_group_index_types(groups):
    adv, _ = compute_grpo_outcome_advantage(REWARDS, MASK, groups, norm_adv_by_std_in_grpo=False)
    assert close(adv, per_token([-2 / 3, -5 / 3, 7 / 3, 0.0, 0.0, 0.0]))


def test_group_index_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="5 entries but there are 6"):
        compute_grpo_outcome_advantage(REWARDS, MASK, GROUPS[:5])


def test_rloo_by_hand():
    adv, ret = compute_rloo_outcome_advantage(REWARDS, MASK, GROUPS)
    # group a: 1 - (0 + 4)/2 = -1; 0 - (1 + 4)/2 = -2.5; 4 - (1 + 0)/2 = 3.5
    # group b: 5 - 5 = 0 twice; group c alone: 0
    assert close(adv, per_token([-1.0, -2.5, 3.5, 0.0, 0.0, 0.0]))
    assert torch.equal(adv, ret)


def test_group_estimators_with_an_empty_response():
    # The empty response scores 0 and still counts in its group; its advantage row is all 0.
    rewards = torch.tensor([[0.0, 2.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, ["p", "p"], epsilon=0.0)
    # scores 2, 0: mean 1, unbiased std sqrt((1 + 1) / 1) = sqrt2 -> A0 = 1/sqrt2
    assert close(adv, [[1 / math.sqrt(2), 1 / math.sqrt(2)], [0.0, 0.0]])
    adv, _ = compute_rloo_outcome_advantage(rewards, mask, ["p", "p"])
    assert close(adv, [[2.0, 2.0], [0.0, 0.0]])  # 2 - 0


def test_group_estimators_zero_length():
    z = torch.zeros(2, 0)
    for fn in (compute_grpo_outcome_advantage, compute_rloo_outcome_advantage):
        adv, ret = fn(z, z, ["p", "p"])
        assert adv.shape == (2, 0) and ret.shape == (2, 0)


# ---------------------------------------------------------------- REINFORCE++ and ReMax


def test_reinforce_plus_plus_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 4.0], [2.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    # returns-to-go, gamma 0.5: row 0: t2 = 4, t1 = 0 + 0.5*4 = 2, t0 = 0 + 0.5*2 = 1; row 1: [2]
    assert close(ret, [[1.0, 2.0, 4.0], [2.0, 0.0, 0.0]])
    # whiten 1, 2, 4, 2: mean 9/4 = 2.25; deviations -1.25, -0.25, 1.75, -0.25
    # squares 1.5625 + 0.0625 + 3.0625 + 0.0625 = 4.75; unbiased var 4.75 / 3; std 1.2583057
    std = math.sqrt(4.75 / 3)
    assert close(adv, [[-1.25 / std, -0.25 / std, 1.75 / std], [-0.25 / std, 0.0, 0.0]])


def test_reinforce_plus_plus_baseline_by_hand():
    rewards = torch.tensor([[0.0, 2.0], [0.0, 0.0], [3.0, 8.0], [1.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1]])
    adv, ret = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, ["a", "a", "b", "b"], 0.0)
    # scores 2, 0 | 3, 1: group means 1 and 2 -> +1, -1 | +1, -1, broadcast over valid tokens:
    # valid values 1, 1, -1, -1, 1, -1, -1: mean -1/7; deviations +8/7 (x3), -6/7 (x4)
    # squares 3*64/49 + 4*36/49 = 336/49 = 48/7; unbiased var 48/7 / 6 = 8/7
    # whitened: (8/7)/sqrt(8/7) = sqrt(8/7) = 1.0690450; (-6/7)/sqrt(8/7) = -0.8017837
    hi, lo = math.sqrt(8 / 7), -6 / 7 / math.sqrt(8 / 7)
    assert close(adv, [[hi, hi], [lo, lo], [hi, 0.0], [lo, lo]])
    assert torch.equal(adv, ret)


def test_remax_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.5, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_remax_outcome_advantage(rewards, torch.tensor([0.4, 2.0]), mask)
    # returns-to-go (gamma 1): row 0 [1, 1, 1]; row 1 [1.0, 0.5, (pad)]
    assert close(ret, [[1.0, 1.0, 1.0], [1.0, 0.5, 0.0]])
    # minus the greedy baseline: row 0 - 0.4; row 1 - 2.0
    assert close(adv, [[0.6, 0.6, 0.6], [-1.0, -1.5, 0.0]])


# ---------------------------------------------------------------- dispatch


def test_estimator_names():
    expected = {"gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "gpg", "optimal_token_baseline", "gdpo"}
    assert set(ADV_ESTIMATORS) == expected


def test_compute_advantage_passes_each_estimator_its_inputs():
    # RLOO via the dispatcher, same hand numbers as test_rloo_by_hand; the unused inputs are ignored.
    adv, _ = compute_advantage("rloo", token_level_rewards=REWARDS, response_mask=MASK, group_index=GROUPS,
                               values=torch.zeros_like(REWARDS), gamma=0.3)
    assert close(adv, per_token([-1.0, -2.5, 3.5, 0.0, 0.0, 0.0]))
    # GAE gets gamma and lam: same hand numbers as test_gae_whitened_by_hand
    rewards = torch.tensor([[1.0, 0.0], [3.0, 0.0]])
    adv, _ = compute_advantage("gae", token_level_rewards=rewards, response_mask=torch.ones(2, 2),
                               values=torch.zeros(2, 2), gamma=1.0, lam=1.0)
    s = 1.0 / math.sqrt(2.0)
    assert close(adv, [[0.0, -s], [2 * s, -s]])
    # Dr. GRPO switch reaches GRPO
    adv, _ = compute_advantage("grpo", token_level_rewards=REWARDS, response_mask=MASK, group_index=GROUPS,
                               norm_adv_by_std_in_grpo=False)
    assert close(adv, per_token([-2 / 3, -5 / 3, 7 / 3, 0.0, 0.0, 0.0]))


@pytest.mark.parametrize(
    "name, message",
    [("gae", "gae needs values from a critic"), ("grpo", "grpo needs group_index"),
     ("rloo", "rloo needs group_index"), ("reinforce_plus_plus_baseline", "needs group_index"),
     ("remax", "remax needs reward_baselines")],
)
def test_compute_advantage_missing_input(name, message):
    with pytest.raises(ValueError, match=message):
        compute_advantage(name, token_level_rewards=REWARDS, response_mask=MASK)


def test_compute_advantage_unknown_name_suggests():
    with pytest.raises(ValueError, match="Did you mean 'grpo'"):
        compute_advantage("grpoo", token_level_rewards=REWARDS, response_mask=MASK)


def test_reinforce_plus_plus_and_remax_zero_length():
    z = torch.zeros(2, 0)
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(z, z, gamma=1.0)
    assert adv.shape == (2, 0) and ret.shape == (2, 0)
    adv, ret = compute_remax_outcome_advantage(z, torch.zeros(2), z)
    assert adv.shape == (2, 0) and ret.shape == (2, 0)
