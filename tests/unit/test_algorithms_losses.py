"""Policy, value, entropy and KL losses against hand-worked numbers."""

import math

import pytest
import torch

from verl.algorithms.losses import (
    POLICY_LOSSES,
    compute_entropy_loss,
    compute_kl_loss,
    compute_policy_loss,
    compute_policy_loss_gspo,
    compute_value_loss,
    entropy_from_logits,
)

# ---------------------------------------------------------------- PPO

# old log-prob 0, so ratio = exp(log_prob); the 5th token is padding with junk in it.
RATIOS = [1.5, 0.5, 0.5, 5.0, 1.0]
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0, 100.0]])
MASK = torch.tensor([[1, 1, 1, 1, 0]])


def ppo_inputs(ratios=RATIOS):
    log_prob = torch.log(torch.tensor([ratios])).requires_grad_(True)
    return torch.zeros_like(log_prob), log_prob


def test_ppo_clip_and_dual_clip_by_hand():
    old, logp = ppo_inputs()
    loss, m = compute_policy_loss(old, logp, ADV, MASK, clip_ratio=0.2, clip_ratio_c=3.0)
    # token 0: A=+1, r=1.5: max(-1.5, -clip(1.5)=-1.2) = -1.2              (PPO clip taken)
    # token 1: A=+1, r=0.5: max(-0.5, -0.8) = -0.5                          (unclipped)
    # token 2: A=-1, r=0.5: max(0.5, 0.8) = 0.8; dual cap 3 -> 0.8          (PPO clip taken)
    # token 3: A=-1, r=5.0: max(5.0, 1.2) = 5.0; dual cap -A*3 = 3 -> 3.0  (dual clip taken)
    # token-mean: (-1.2 - 0.5 + 0.8 + 3.0) / 4 = 2.1 / 4
    assert loss.item() == pytest.approx(0.525)
    assert float(m["actor/pg_clipfrac"]) == pytest.approx(0.5)  # tokens 0 and 2
    assert float(m["actor/pg_clipfrac_lower"]) == pytest.approx(0.25)  # token 3
    # ppo_kl = mean(old - logp) = -(ln1.5 + ln0.5 + ln0.5 + ln5) / 4 = -(0.405465 - 2*0.693147 + 1.609438) / 4
    assert float(m["actor/ppo_kl"]) == pytest.approx(-0.628609 / 4, abs=1e-6)
    # only the unclipped token 1 has a gradient: d(-A r)/dlogp = -r = -0.5, over 4 tokens
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -0.125, 0.0, 0.0, 0.0]]))


def test_asymmetric_clip_higher():
    # r = 1.25, A = +1: symmetric 0.2 clips at 1.2 -> -1.2; clip-higher 0.28 leaves 1.25 < 1.28 -> -1.25
    # r = 0.7,  A = -1: lower bound 1 - 0.2 = 0.8 in both: max(0.7, 0.8) = 0.8
    old, logp = ppo_inputs([1.25, 0.7])
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    sym, _ = compute_policy_loss(old, logp, adv, mask, clip_ratio=0.2)
    dapo, m = compute_policy_loss(old, logp, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert sym.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert dapo.item() == pytest.approx((-1.25 + 0.8) / 2)
    assert float(m["actor/pg_clipfrac"]) == pytest.approx(0.5)  # only token 1


def test_dual_clip_must_exceed_one():
    old, logp = ppo_inputs()
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        compute_policy_loss(old, logp, ADV, MASK, clip_ratio_c=1.0)


def test_log_ratio_guard_keeps_the_loss_finite():
    # log-ratio 50 is clamped to 20; A = -1: -A r = e^20 ~ 4.9e8, capped by dual clip at 3
    logp = torch.tensor([[50.0]], requires_grad=True)
    loss, _ = compute_policy_loss(torch.zeros(1, 1), logp, torch.tensor([[-1.0]]), torch.ones(1, 1))
    loss.backward()
    assert loss.item() == pytest.approx(3.0)
    assert torch.isfinite(logp.grad).all()


@pytest.mark.parametrize("fn", [compute_policy_loss, compute_policy_loss_gspo])
def test_policy_loss_fully_masked_rows_contribute_nothing(fn):
    old, logp = ppo_inputs([1.5, 0.5])
    logp = torch.cat([logp.detach(), torch.tensor([[float("nan"), 30.0]])]).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0], [5.0, 5.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    loss, metrics = fn(torch.zeros(2, 2), logp, adv, mask, loss_agg_mode="token-mean")
    loss.backward()
    # same as row 0 alone: PPO (-1.2 - 0.5) / 2; GSPO s = sqrt(1.5*0.5) = 0.866 -> -0.866 per token
    expected = -0.85 if fn is compute_policy_loss else -math.sqrt(0.75)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert torch.equal(logp.grad[1], torch.zeros(2))
    assert all(math.isfinite(float(v)) for v in metrics.values())
    # and a batch with no valid token at all is a zero loss, not NaN
    empty, _ = fn(torch.zeros(2, 2), logp.detach(), adv, torch.zeros(2, 2))
    assert empty.item() == 0.0


# ---------------------------------------------------------------- GSPO


def test_gspo_by_hand():
    # row 0: ratios 1.1, 1.3 (+ padding): s = exp((ln1.1 + ln1.3) / 2) = sqrt(1.43) = 1.1958261, inside [0.8, 1.2]
    # row 1: ratios 2, 2: s = 2 -> clipped to 1.2
    logp = torch.log(torch.tensor([[1.1, 1.3, 7.0], [2.0, 2.0, 1.0]])).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    loss, m = compute_policy_loss_gspo(torch.zeros(2, 3), logp, adv, mask, clip_ratio=0.2)
    # seq-mean-token-mean: row 0 mean(-1.1958261, -1.1958261), row 1 mean(-1.2, -1.2); / 2 seqs
    s = math.sqrt(1.43)
    assert loss.item() == pytest.approx((-s - 1.2) / 2, abs=1e-6)
    assert float(m["actor/pg_clipfrac"]) == pytest.approx(0.5)  # both tokens of row 1
    assert float(m["actor/pg_clipfrac_lower"]) == 0.0
    # gradient per the paper: -A * s * (1/|y|) per token, / 2 seqs: -1.1958261 / 2 / 2; clipped row 1 -> 0
    loss.backward()
    g = -s / 4
    assert torch.allclose(logp.grad, torch.tensor([[g, g, 0.0], [0.0, 0.0, 0.0]]), atol=1e-6)


def test_gspo_with_the_papers_tiny_clip_range():
    # s = sqrt(1.43) = 1.1958 is far above 1 + 4e-4: clipped to 1.0004, A = +1 -> loss -1.0004
    logp = torch.log(torch.tensor([[1.1, 1.3]]))
    loss, _ = compute_policy_loss_gspo(torch.zeros(1, 2), logp, torch.ones(1, 2), torch.ones(1, 2),
                                       clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    assert loss.item() == pytest.approx(-1.0004, abs=1e-6)


def test_policy_loss_names():
    # the other entries are tested in test_algorithms_verl_extra.py
    assert POLICY_LOSSES["vanilla"] is compute_policy_loss and POLICY_LOSSES["gspo"] is compute_policy_loss_gspo


# ---------------------------------------------------------------- value loss


def test_value_loss_by_hand():
    vpreds = torch.tensor([[1.0, 2.0, 0.0, 1.0, 100.0]], requires_grad=True)
    old = torch.tensor([[0.5, 1.9, 0.0, 0.0, 0.0]])
    returns = torch.tensor([[0.0, 3.0, 0.2, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, m = compute_value_loss(vpreds, old, returns, mask, cliprange_value=0.2)
    # t0: (1 - 0)^2 = 1;     clip 0.5 + 0.2 = 0.7 -> 0.49;     max 1    -> 0.5
    # t1: (2 - 3)^2 = 1;     clip 1.9 + 0.1 = 2.0 -> 1;        max 1    -> 0.5
    # t2: (0 - 0.2)^2 = 0.04; clip 0 -> 0.04;                   max 0.04 -> 0.02
    # t3: (1 - 1)^2 = 0;     clip 0 + 0.2 = 0.2 -> 0.64;       max 0.64 -> 0.32 (clipped branch)
    # token-mean: (0.5 + 0.5 + 0.02 + 0.32) / 4 = 1.34 / 4
    assert loss.item() == pytest.approx(0.335)
    assert float(m["critic/vf_clipfrac"]) == pytest.approx(0.25)
    # d/dv 0.5 (v - R)^2 = v - R, / 4 tokens: t0 1/4, t1 -1/4, t2 -0.2/4; t3 clipped -> 0; padding 0
    loss.backward()
    assert torch.allclose(vpreds.grad, torch.tensor([[0.25, -0.25, -0.05, 0.0, 0.0]]), atol=1e-6)


# ---------------------------------------------------------------- entropy and KL loss


def test_entropy_from_logits_by_hand():
    logits = torch.stack([torch.zeros(4), torch.log(torch.tensor([1.0, 3.0, 1e-30, 1e-30]))]).view(1, 2, 4)
    h = entropy_from_logits(logits)
    assert h.shape == (1, 2)
    # uniform over 4: ln 4 = 1.3862944
    # p = (0.25, 0.75, ~0, ~0): -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.3465736 + 0.2157616 = 0.5623352
    assert torch.allclose(h, torch.tensor([[1.3862944, 0.5623352]]), atol=1e-5)


def test_entropy_loss_by_hand():
    entropy = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    loss, m = compute_entropy_loss(entropy, torch.tensor([[1, 1], [1, 0]]), "token-mean")
    assert loss.item() == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    assert float(m["actor/entropy"]) == pytest.approx(2.0)
    loss, _ = compute_entropy_loss(entropy, torch.tensor([[1, 1], [1, 0]]), "seq-mean-token-mean")
    assert loss.item() == pytest.approx(2.25)  # (1.5 + 3) / 2


def test_kl_loss_by_hand():
    logp, ref = torch.tensor([[-1.0, -2.0, 0.0]]), torch.tensor([[-1.5, -1.0, 9.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, m = compute_kl_loss(logp, ref, mask, "k1", "token-mean")
    assert loss.item() == pytest.approx(-0.25)  # (0.5 - 1.0) / 2
    assert float(m["actor/kl_loss"]) == pytest.approx(-0.25)
    loss, _ = compute_kl_loss(logp, ref, mask, "low_var_kl", "token-mean")
    # (e^-0.5 - 1 + 0.5 = 0.10653066) and (e - 2 = 0.71828183), mean 0.41240625
    assert loss.item() == pytest.approx(0.41240625, abs=1e-6)
