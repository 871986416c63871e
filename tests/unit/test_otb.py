"""verl's optimal token baseline, checked against numbers worked out by hand."""

import math

import pytest
import torch

from verl.algorithms.advantages import compute_advantage


def _log(p):
    return math.log(p)


def test_equal_weights_give_the_groups_return_average_and_the_lone_tail_has_no_baseline():
    # Group of two: sample 0 answers right (score 1 on its 3rd token), sample 1 wrong (0, 2 tokens).
    # pi_t = 0.5 and sum pi^2 = 0.5 everywhere: w_t = 1 - 1 + 0.5 = 0.5, so W = [0.5, 1.0, 1.5].
    # Returns-to-go G: sample 0 [1, 1, 1], sample 1 [0, 0, 0].
    # B_0 = (1*0.5 + 0*0.5) / (0.5 + 0.5) = 0.5; B_1 = (1*1 + 0*1) / 2 = 0.5; B_2 = 1*1.5 / 1.5 = 1
    # (sample 1 has no 3rd token). With handle_zero_tail, sample 0 is the only one past length 2:
    # its baseline there is 0, so A_2 = 1 - 0 = 1; without, A_2 = 1 - 1 = 0.
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    old = torch.full((2, 3), _log(0.5))
    spp = torch.full((2, 3), 0.5)
    kwargs = dict(token_level_rewards=rewards, response_mask=mask, group_index=["a", "a"], old_log_probs=old,
                  sum_pi_squared=spp)
    adv, returns = compute_advantage("optimal_token_baseline", **kwargs)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 1.0], [-0.5, -0.5, 0.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    from verl.algorithms.advantages import compute_optimal_token_baseline_advantage

    adv, _ = compute_optimal_token_baseline_advantage(rewards, mask, ["a", "a"], old, spp, handle_zero_tail=False)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.0], [-0.5, -0.5, 0.0]]), atol=1e-6, rtol=0)


def test_a_confident_sample_weighs_little_in_the_baseline_and_importance_weights_square():
    # One token each. Sample 0: pi = 0.9, sum pi^2 = 0.82 -> w = 1 - 1.8 + 0.82 = 0.02, G = 1.
    # Sample 1: pi = 0.1, sum pi^2 = 0.5 -> w = 1 - 0.2 + 0.5 = 1.3, G = 0.
    # B = (1*0.02 + 0*1.3) / 1.32 = 0.0151515...: A = [0.9848485, -0.0151515].
    # With rho = [2, 1]: w0 = 0.02 * 4 = 0.08, B = 0.08 / 1.38 = 0.0579710: A = [0.9420290, -0.0579710].
    rewards = torch.tensor([[1.0], [0.0]])
    mask = torch.ones(2, 1)
    old = torch.tensor([[_log(0.9)], [_log(0.1)]])
    spp = torch.tensor([[0.82], [0.5]])
    base = dict(token_level_rewards=rewards, response_mask=mask, group_index=[7, 7], old_log_probs=old,
                sum_pi_squared=spp)
    adv, _ = compute_advantage("optimal_token_baseline", **base)
    torch.testing.assert_close(adv, torch.tensor([[1 - 0.02 / 1.32], [-0.02 / 1.32]]), atol=1e-6, rtol=0)
    adv, _ = compute_advantage("optimal_token_baseline", **base, rollout_is_weights=torch.tensor([[2.0], [1.0]]))
    torch.testing.assert_close(adv, torch.tensor([[1 - 0.08 / 1.38], [-0.08 / 1.38]]), atol=1e-6, rtol=0)


def test_a_group_of_one_keeps_its_return_and_groups_do_not_mix():
    rewards = torch.tensor([[0.0, 2.0], [1.0, 0.0], [0.0, 0.0]])
    mask = torch.ones(3, 2)
    old = torch.full((3, 2), _log(0.5))
    spp = torch.full((3, 2), 0.5)
    adv, _ = compute_advantage("optimal_token_baseline", token_level_rewards=rewards, response_mask=mask,
                               group_index=["solo", "pair", "pair"], old_log_probs=old, sum_pi_squared=spp)
    # solo: G = [2, 2], no baseline. pair: G = [1, 0] and [0, 0]; W equal, B = [0.5, 0].
    torch.testing.assert_close(adv, torch.tensor([[2.0, 2.0], [0.5, 0.0], [-0.5, 0.0]]), atol=1e-6, rtol=0)


def test_missing_inputs_are_named():
    with pytest.raises(ValueError, match="optimal_token_baseline needs old_log_probs"):
        compute_advantage("optimal_token_baseline", token_level_rewards=torch.zeros(2, 1),
                          response_mask=torch.ones(2, 1), group_index=[0, 0], sum_pi_squared=torch.zeros(2, 1))


def test_sum_pi_squared_of_the_log_prob_pass_matches_the_softmax_by_hand_and_packed_equals_padded(tiny_model_dir):
    from verl.models.loading import load_causal_lm
    from verl.models.logprob import compute_response_logprobs, sum_pi_squared_from_logits

    # softmax([0, ln 3]) = [0.25, 0.75]: 0.0625 + 0.5625 = 0.625
    assert sum_pi_squared_from_logits(torch.tensor([[0.0, math.log(3.0)]])).item() == pytest.approx(0.625)
    model = load_causal_lm(str(tiny_model_dir)).eval()
    torch.manual_seed(0)
    ids = torch.randint(3, 100, (2, 7))
    attention = torch.ones_like(ids)
    attention[1, :2] = 0  # a left-padded prompt
    position = (attention.cumsum(-1) - 1).clamp(min=0)
    responses = ids[:, -3:]
    with torch.no_grad():
        lp, _, spp = compute_response_logprobs(model, ids, attention, position, responses, with_sum_pi_squared=True)
        logits = model(input_ids=ids, attention_mask=attention, position_ids=position).logits[:, -4:-1]
        _, _, packed = compute_response_logprobs(model, ids, attention, position, responses,
                                                 with_sum_pi_squared=True, remove_padding=True)
    torch.testing.assert_close(spp, torch.softmax(logits.float(), -1).pow(2).sum(-1), atol=1e-6, rtol=0)
    torch.testing.assert_close(packed, spp, atol=1e-5, rtol=0)
    assert ((spp > 0) & (spp <= 1)).all() and (spp >= lp.exp() ** 2 - 1e-6).all()  # sum pi^2 >= pi_t^2
