"""DPO (sigmoid / IPO / hinge) and KTO losses against numbers worked out by hand."""

import math

import pytest
import torch

from verl.algorithms import DPO_LOSS_TYPES, dpo_loss, kto_loss, kto_reference_point


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def t(*values, grad=False):
    return torch.tensor(values, dtype=torch.float64, requires_grad=grad)


# One pair where the policy moved towards chosen: log-ratios chosen = -1 - (-1.5) = +0.5,
# rejected = -2 - (-1.5) = -0.5, so h = 0.5 - (-0.5) = 1.0.
PAIR = dict(policy_chosen_logps=t(-1.0), policy_rejected_logps=t(-2.0), ref_chosen_logps=t(-1.5),
            ref_rejected_logps=t(-1.5))


def test_dpo_sigmoid_by_hand():
    loss, m = dpo_loss(**PAIR, beta=0.5)
    # beta * h = 0.5; -log sigmoid(0.5) = log(1 + e^-0.5) = log(1.60653) = 0.474077
    assert loss.item() == pytest.approx(0.474077, abs=1e-6)
    # implicit rewards: 0.5 * 0.5 = 0.25 and 0.5 * -0.5 = -0.25; margin 0.5; chosen wins
    assert m["rewards/chosen"].item() == pytest.approx(0.25)
    assert m["rewards/rejected"].item() == pytest.approx(-0.25)
    assert m["rewards/margins"].item() == pytest.approx(0.5)
    assert m["rewards/accuracies"].item() == 1.0
    assert m["logps/chosen"].item() == -1.0 and m["logps/rejected"].item() == -2.0


def test_dpo_sigmoid_with_equal_logps_is_log_2_and_a_tie_is_not_accurate():
    loss, m = dpo_loss(t(-3.0), t(-3.0), t(-3.0), t(-3.0), beta=0.1)
    # h = 0: -log sigmoid(0) = -log(1/2) = log 2
    assert loss.item() == pytest.approx(math.log(2))
    assert m["rewards/margins"].item() == 0.0 and m["rewards/accuracies"].item() == 0.0


def test_dpo_sigmoid_averages_over_pairs():
    # pair 1 is PAIR (loss 0.474077, chosen ahead), pair 2 is a tie (loss log 2 = 0.693147)
    loss, m = dpo_loss(t(-1.0, -3.0), t(-2.0, -3.0), t(-1.5, -3.0), t(-1.5, -3.0), beta=0.5)
    # (0.474077 + 0.693147) / 2 = 0.583612
    assert loss.item() == pytest.approx(0.583612, abs=1e-6)
    assert m["rewards/accuracies"].item() == 0.5
    assert m["rewards/margins"].item() == pytest.approx(0.25)  # (0.5 + 0) / 2


def test_dpo_sigmoid_gradient_raises_chosen_and_lowers_rejected():
    chosen, rejected = t(-1.0, grad=True), t(-2.0, grad=True)
    loss, _ = dpo_loss(chosen, rejected, t(-1.5), t(-1.5), beta=0.5)
    loss.backward()
    # d/d chosen of -log sigmoid(beta h) = -beta * sigmoid(-beta h) = -0.5 * sigmoid(-0.5) = -0.188770
    assert chosen.grad.item() == pytest.approx(-0.188770, abs=1e-6)
    assert rejected.grad.item() == pytest.approx(+0.188770, abs=1e-6)


@pytest.mark.parametrize("beta, h, expected", [
    (0.5, 1.0, 0.0),    # 1 / (2 * 0.5) = 1: (1 - 1)^2 = 0, the IPO target is met
    (0.25, 1.0, 1.0),   # 1 / (2 * 0.25) = 2: (1 - 2)^2 = 1
    (0.1, 0.0, 25.0),   # 1 / (2 * 0.1) = 5: (0 - 5)^2 = 25
    (0.5, 3.0, 4.0),    # overshooting is penalised too: (3 - 1)^2 = 4
])
def test_ipo_is_squared_distance_of_h_from_one_over_two_beta(beta, h, expected):
    # policy_chosen = h, all else 0, so h is exactly the log-ratio difference
    loss, _ = dpo_loss(t(h), t(0.0), t(0.0), t(0.0), beta=beta, loss_type="ipo")
    assert loss.item() == pytest.approx(expected)


@pytest.mark.parametrize("beta, h, expected", [
    (0.5, 1.0, 0.5),    # relu(1 - 0.5 * 1) = 0.5
    (2.0, 1.0, 0.0),    # relu(1 - 2) = relu(-1) = 0: past the margin, no loss
    (0.5, -1.0, 1.5),   # relu(1 + 0.5) = 1.5
    (0.1, 0.0, 1.0),    # relu(1 - 0) = 1
])
def test_hinge_is_relu_of_one_minus_beta_h(beta, h, expected):
    loss, _ = dpo_loss(t(h), t(0.0), t(0.0), t(0.0), beta=beta, loss_type="hinge")
    assert loss.item() == pytest.approx(expected)


@pytest.mark.parametrize("loss_type", DPO_LOSS_TYPES)
def test_micro_batch_losses_with_the_step_pair_count_add_up_to_the_step_loss(loss_type):
    g = torch.Generator().manual_seed(0)
    logps = [-torch.rand(6, generator=g, dtype=torch.float64) * 5 for _ in range(4)]
    whole, _ = dpo_loss(*logps, beta=0.3, loss_type=loss_type)
    halves = [dpo_loss(*(x[s] for x in logps), beta=0.3, loss_type=loss_type, num_pairs=6)[0]
              for s in (slice(0, 2), slice(2, 6))]
    assert (halves[0] + halves[1]).item() == pytest.approx(whole.item())


def test_unknown_dpo_loss_type_names_the_choices():
    with pytest.raises(ValueError, match="sigmoid, ipo, hinge"):
        dpo_loss(t(0.0), t(0.0), t(0.0), t(0.0), beta=0.1, loss_type="robust")


# ---------------------------------------------------------------- KTO

def test_kto_reference_point_is_the_mean_log_ratio_clamped_at_zero_and_detached():
    policy = t(-1.0, -2.0, grad=True)
    # log-ratios 0.5 and 0.3: mean 0.4
    z0 = kto_reference_point(policy, t(-1.5, -2.3))
    assert z0.item() == pytest.approx(0.4)
    assert not z0.requires_grad
    # log-ratios 0.5 and -1.0: mean -0.25, clamped to 0
    assert kto_reference_point(t(-1.0, -2.0), t(-1.5, -1.0)).item() == 0.0


def test_kto_by_hand():
    # example 0 desirable with log-ratio +1, example 1 undesirable with log-ratio -1; z0 = 0.2, beta = 0.5
    policy = t(-1.0, -3.0, grad=True)
    loss, m = kto_loss(policy, t(-2.0, -2.0), torch.tensor([True, False]), 0.2, beta=0.5,
                       desirable_weight=1.0, undesirable_weight=2.0)
    # desirable:   1 * (1 - sigmoid(0.5 * (1 - 0.2)))    = 1 - sigmoid(0.4) = 0.401312
    # undesirable: 2 * (1 - sigmoid(0.5 * (0.2 - -1)))   = 2 * (1 - sigmoid(0.6)) = 2 * 0.354344 = 0.708687
    # mean: (0.401312 + 0.708687) / 2 = 0.555000
    assert loss.item() == pytest.approx(0.555000, abs=1e-6)
    assert m["rewards/chosen"].item() == pytest.approx(0.5)    # 0.5 * +1
    assert m["rewards/rejected"].item() == pytest.approx(-0.5)  # 0.5 * -1
    assert m["rewards/margins"].item() == pytest.approx(1.0)
    assert m["kl"].item() == pytest.approx(0.2)
    assert (m["count/chosen"], m["count/rejected"]) == (1.0, 1.0)
    loss.backward()
    # d/dpolicy_0 of 1 - sigmoid(0.5 (r - z0)) = -0.5 * s(0.4) * (1 - s(0.4)) = -0.5 * 0.598688 * 0.401312
    assert policy.grad[0].item() == pytest.approx(-0.5 * sigmoid(0.4) * (1 - sigmoid(0.4)) / 2)
    # undesirable: d/dr of 2 (1 - s(0.5 (z0 - r))) = +2 * 0.5 * s(0.6) (1 - s(0.6)); halved by the mean
    assert policy.grad[1].item() == pytest.approx(2 * 0.5 * sigmoid(0.6) * (1 - sigmoid(0.6)) / 2)


def test_kto_at_the_reference_is_one_half_per_example_and_a_batch_of_one_kind_reports_zero_for_the_other():
    loss, m = kto_loss(t(-4.0, -5.0), t(-4.0, -5.0), torch.tensor([True, True]), 0.0, beta=0.1)
    # r = 0 and z0 = 0: 1 - sigmoid(0) = 0.5 for each example
    assert loss.item() == pytest.approx(0.5)
    assert m["rewards/rejected"].item() == 0.0 and m["count/rejected"] == 0.0
    assert m["logps/chosen"].item() == pytest.approx(-4.5)


def test_kto_micro_batches_with_the_step_count_add_up_to_the_step_loss():
    g = torch.Generator().manual_seed(1)
    policy, ref = (-torch.rand(8, generator=g, dtype=torch.float64) * 4 for _ in range(2))
    labels = torch.tensor([True, False, False, True, True, False, True, False])
    whole, _ = kto_loss(policy, ref, labels, 0.1, beta=0.2, undesirable_weight=1.5)
    parts = [kto_loss(policy[s], ref[s], labels[s], 0.1, beta=0.2, undesirable_weight=1.5, num_examples=8)[0]
             for s in (slice(0, 3), slice(3, 8))]
    assert (parts[0] + parts[1]).item() == pytest.approx(whole.item())
