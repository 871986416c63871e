"""KL estimators, KL controllers and the in-reward KL penalty, against hand-worked numbers."""

import math

import pytest
import torch

from verl.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_in_reward,
    kl_penalty,
    make_kl_controller,
)

LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])  # logp - ref = [0.5, -1.0]; log r = ref - logp = [-0.5, 1.0]


@pytest.mark.parametrize(
    "kinds, expected",
    [
        (("k1", "kl"), [0.5, -1.0]),
        (("abs",), [0.5, 1.0]),
        (("k2", "mse"), [0.125, 0.5]),  # 0.5 * 0.25, 0.5 * 1
        # r - 1 - log r: e^-0.5 - 1 + 0.5 = 0.60653066 - 0.5; e^1 - 1 - 1 = 2.71828183 - 2
        (("k3", "low_var_kl"), [0.10653066, 0.71828183]),
    ],
)
def test_kl_estimators_by_hand(kinds, expected):
    for kind in kinds:
        assert torch.allclose(kl_penalty(LOGP, REF, kind), torch.tensor([expected]), atol=1e-6), kind


def test_k3_is_clamped_to_ten_and_stays_differentiable():
    logp = torch.tensor([[0.0, 0.0, 0.0]], requires_grad=True)
    # log r = 5: e^5 - 5 - 1 = 148.41 - 6 = 142.41 -> 10; log r = 100 would overflow without the
    # log-ratio clamp (e^100 > float32 max) -> still 10; log r = -100: e^-20 + 20 - 1 ~ 19 -> 10
    ref = torch.tensor([[5.0, 100.0, -100.0]])
    kl = kl_penalty(logp, ref, "k3")
    assert torch.equal(kl, torch.full((1, 3), 10.0))
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_unknown_kl_kind_lists_allowed_names():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(LOGP, REF, "k4")


def test_fixed_controller_never_moves():
    ctl = FixedKLController(0.05)
    ctl.update(current_kl=123.0, n_steps=1000)
    assert ctl.value == 0.05


def test_adaptive_controller_update_by_hand():
    ctl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    # error = clip(9 / 6 - 1 = 0.5, -0.2, 0.2) = 0.2; value = 0.1 * (1 + 0.2 * 256 / 10000) = 0.1 * 1.00512
    ctl.update(current_kl=9.0, n_steps=256)
    assert ctl.value == pytest.approx(0.100512)
    # error = 5.4 / 6 - 1 = -0.1 (inside the clip); value = 0.100512 * (1 - 0.1 * 1000 / 10000) = 0.100512 * 0.99
    ctl.update(current_kl=5.4, n_steps=1000)
    assert ctl.value == pytest.approx(0.09950688)


def test_make_kl_controller():
    assert isinstance(make_kl_controller("fixed", 0.1), FixedKLController)
    adaptive = make_kl_controller("adaptive", 0.2, target_kl=1.0, horizon=100)
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.value == 0.2
    with pytest.raises(ValueError, match="target_kl"):
        make_kl_controller("adaptive", 0.2)
    with pytest.raises(ValueError, match="fixed, adaptive"):
        make_kl_controller("pid", 0.2)


def test_apply_kl_in_reward_by_hand():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
    logp = torch.full((3, 3), -1.0)
    ref = torch.tensor([[-1.5, -1.0, -2.0], [-0.5, -3.0, 0.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])  # row 2 is an empty response
    rewards, metrics = apply_kl_in_reward(scores, logp, ref, mask, kl_coef=0.1, kind="k1")
    # k1 = logp - ref: row 0 [0.5, 0, 1.0]; row 1 [-0.5, 2.0, (masked)]; row 2 all masked
    # rewards = scores - 0.1 * k1 on valid tokens
    expected = torch.tensor([[-0.05, 0.0, 0.9], [0.05, 1.8, 0.0], [0.0, 0.0, 0.0]])
    assert torch.allclose(rewards, expected, atol=1e-6)
    # per-sequence means: 1.5 / 3 = 0.5 and 1.5 / 2 = 0.75; the empty row is left out: 0.625
    assert float(metrics["actor/reward_kl_penalty"]) == pytest.approx(0.625)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1


def test_apply_kl_in_reward_all_empty_is_zero_not_nan():
    zeros = torch.zeros(2, 3)
    rewards, metrics = apply_kl_in_reward(zeros, zeros, zeros + 1, zeros, kl_coef=0.1, kind="k3")
    assert torch.equal(rewards, zeros)
    assert float(metrics["actor/reward_kl_penalty"]) == 0.0
    assert not math.isnan(float(metrics["actor/reward_kl_penalty"]))
