"""The extra verl policy losses (cispo, geo_mean, gpg, sapo, clip_cov, kl_cov, dppo_tv) and the gpg
advantage estimator against numbers worked out by hand, their gradients, and a run through the actor."""

import copy
import math

import pytest
import torch

from verl.algorithms import (
    ADV_ESTIMATORS,
    NOT_IMPLEMENTED_ESTIMATORS,
    NOT_IMPLEMENTED_LOSSES,
    POLICY_LOSSES,
    compute_advantage,
    compute_gpg_outcome_advantage,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
)

torch.set_num_threads(1)

EXTRA = {"cispo": compute_policy_loss_cispo, "geo_mean": compute_policy_loss_geo_mean,
         "gpg": compute_policy_loss_gpg, "sapo": compute_policy_loss_sapo, "clip_cov": compute_policy_loss_clip_cov,
         "kl_cov": compute_policy_loss_kl_cov, "dppo_tv": compute_policy_loss_dppo_tv}


def leaf(values):
    return torch.tensor(values, dtype=torch.float32).requires_grad_(True)


def close(t, expected, atol=1e-5):
    return torch.allclose(t.detach().float(), torch.as_tensor(expected, dtype=torch.float32), atol=atol)


def test_registry_holds_the_extra_losses_and_they_are_no_longer_not_implemented():
    for name, fn in EXTRA.items():
        assert POLICY_LOSSES[name] is fn and name not in NOT_IMPLEMENTED_LOSSES
    assert ADV_ESTIMATORS["gpg"] is compute_gpg_outcome_advantage and "gpg" not in NOT_IMPLEMENTED_ESTIMATORS


# ---------------------------------------------------------------- CISPO


def test_cispo_by_hand():
    # old log-prob 0: ratios 1.5, 0.5, 1.0; A = 1, -1, 2; clip 0.2 -> weights sg[1.2], sg[0.8], sg[1.0]
    # L = -w A log pi: -1.2*1*ln1.5 = -0.486558, -0.8*(-1)*ln0.5 = -0.554518, -1*2*0 = 0
    # token-mean: -1.041076 / 3 = -0.347025
    logp = leaf([[math.log(1.5), math.log(0.5), 0.0]])
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, m = compute_policy_loss_cispo(torch.zeros(1, 3), logp, adv, torch.ones(1, 3), clip_ratio=0.2)
    assert loss.item() == pytest.approx((-1.2 * math.log(1.5) - 0.8 * math.log(2.0)) / 3, abs=1e-6)
    assert loss.item() == pytest.approx(-0.347025, abs=1e-6)
    assert float(m["actor/pg_clipfrac"]) == pytest.approx(2 / 3)
    loss.backward()
    # d/dlogp = -w A / 3: the clipped tokens keep a gradient (unlike PPO, where token 0 would get 0)
    assert close(logp.grad, [[-1.2 / 3, 0.8 / 3, -2.0 / 3]])


# ---------------------------------------------------------------- GMPO (geo_mean)


def test_geo_mean_by_hand():
    # clip 0.4 in log space. Row 0, A = +1: log-ratios 0.6, -0.6 -> only the upper side clips: 0.4, -0.6;
    # mean -0.1, R = e^-0.1 = 0.904837, L = -0.904837. Row 1, A = -1: -0.6, 0.6 -> only the lower side
    # clips: -0.4, 0.6; mean 0.1, R = e^0.1 = 1.105171, L = +1.105171. The 3rd position is padding (NaN).
    # loss = mean over sequences = (1.105171 - 0.904837) / 2 = 0.100167
    logp = leaf([[0.6, -0.6, float("nan")], [-0.6, 0.6, float("nan")]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    loss, m = compute_policy_loss_geo_mean(torch.zeros(2, 3), logp, adv, mask, clip_ratio=0.4)
    assert loss.item() == pytest.approx((math.exp(0.1) - math.exp(-0.1)) / 2, abs=1e-6)
    # every |log-ratio| is past 0.4: counted per advantage sign, as verl does
    assert float(m["actor/pg_clipfrac"]) == 0.5 and float(m["actor/pg_clipfrac_lower"]) == 0.5
    loss.backward()
    # d/dlogp_t of -A exp(mean d) / 2 seqs = -A R / 2 tokens / 2 seqs on unclipped tokens, 0 on clipped ones
    assert close(logp.grad, [[0.0, -math.exp(-0.1) / 4, 0.0], [0.0, math.exp(0.1) / 4, 0.0]])


def test_geo_mean_divides_by_the_global_sequence_count():
    logp = torch.tensor([[0.1, 0.1]])
    one, _ = compute_policy_loss_geo_mean(torch.zeros(1, 2), logp, torch.ones(1, 2), torch.ones(1, 2))
    four, _ = compute_policy_loss_geo_mean(torch.zeros(1, 2), logp, torch.ones(1, 2), torch.ones(1, 2),
                                           global_seqs=4)
    assert one.item() == pytest.approx(-math.exp(0.1)) and four.item() == pytest.approx(-math.exp(0.1) / 4)


# ---------------------------------------------------------------- GPG


def test_gpg_loss_by_hand_ignores_the_old_policy():
    # L = -A log pi: -2 ln0.5 = 1.386294, -1 ln0.25 = 1.386294; token-mean 1.386294; grad -A / 2
    logp = leaf([[math.log(0.5), math.log(0.25)]])
    adv = torch.tensor([[2.0, 1.0]])
    for old in (torch.zeros(1, 2), logp.detach() + 5.0):  # no ratio: old log-probs change nothing
        loss, _ = compute_policy_loss_gpg(old, logp, adv, torch.ones(1, 2))
        assert loss.item() == pytest.approx(2 * math.log(4) / 2, abs=1e-6)
    loss.backward()
    assert close(logp.grad, [[-1.0, -0.5]])


def test_gpg_estimator_by_hand():
    # scores 1, 0, 0 (group a) and 1 (group b, alone); 2 non-zero of 4 -> alpha = 4 / 2 = 2
    # group a mean 1/3: 2 * (1 - 1/3) = 4/3, 2 * (0 - 1/3) = -2/3; group b of one: mean 0 -> 2 * 1 = 2
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 0]])
    adv, ret = compute_gpg_outcome_advantage(rewards, mask, ["a", "a", "a", "b"])
    assert close(adv, [[4 / 3, 4 / 3], [-2 / 3, -2 / 3], [-2 / 3, 0.0], [2.0, 0.0]])
    assert torch.equal(adv, ret)
    halved, _ = compute_gpg_outcome_advantage(rewards, mask, ["a", "a", "a", "b"], f_norm=2.0)
    assert close(halved, adv / 2)
    via, _ = compute_advantage("gpg", token_level_rewards=rewards, response_mask=mask, group_index=["a", "a", "a", "b"])
    assert torch.equal(via, adv)
    # all scores 0: alpha = 4 / max(0, 1), advantages 0
    zero, _ = compute_gpg_outcome_advantage(torch.zeros(4, 2), mask, ["a", "a", "a", "b"])
    assert torch.equal(zero, torch.zeros(4, 2))


# ---------------------------------------------------------------- SAPO


def test_sapo_by_hand():
    # f(r) = sigmoid(tau (r - 1)) * 4 / tau. Row 0: r = 1, A = +1 (tau_pos = 1): f = 0.5 * 4 = 2, L = -2;
    # r = 2, A = -1 (tau_neg = 1.05): f = sigmoid(1.05) * 4 / 1.05 = 0.740775 * 3.809524 = 2.822000, L = +2.822.
    # Row 1: r = 1, A = +1 on its only valid token: L = -2.
    # seq-mean-token-mean (whatever loss_agg_mode says): ((-2 + 2.822) / 2 + (-2)) / 2 = -0.794500
    s = 1 / (1 + math.exp(-1.05))
    f2 = s * 4 / 1.05
    assert f2 == pytest.approx(2.822000, abs=1e-6)
    logp = leaf([[0.0, math.log(2.0)], [0.0, 0.0]])
    adv = torch.tensor([[1.0, -1.0], [1.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    expected = ((-2 + f2) / 2 - 2) / 2
    for mode in ("seq-mean-token-mean", "token-mean"):
        loss, _ = compute_policy_loss_sapo(torch.zeros(2, 2), logp, adv, mask, loss_agg_mode=mode)
        assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    # dL/dlogp = -A f'(r) r / tokens / seqs, f'(r) = 4 s (1 - s): at r = 1 f' = 1 (PPO's gradient -A);
    # token (0, 1): -(-1) * 4 s (1 - s) * 2 / 2 / 2 = 2 s (1 - s) = 0.384056
    assert close(logp.grad, [[-0.25, 2 * s * (1 - s)], [-0.5, 0.0]])
    # the gate fades far off-policy: at r = 20 (A > 0) the gradient is ~0, where PPO's clip would make it 0 too
    # but SAPO's would be 4 s(1-s) r with s = sigmoid(19): 20 * 4 * 5.6e-9
    far = leaf([[math.log(20.0)]])
    loss, _ = compute_policy_loss_sapo(torch.zeros(1, 1), far, torch.ones(1, 1), torch.ones(1, 1))
    loss.backward()
    assert abs(far.grad.item()) < 1e-6


def test_sapo_temperatures_are_keywords():
    # tau_pos = 2, r = 1.5, A = +1: f = sigmoid(1) * 2 = 0.731059 * 2 = 1.462117, L = -1.462117
    loss, _ = compute_policy_loss_sapo(torch.zeros(1, 1), torch.tensor([[math.log(1.5)]]), torch.ones(1, 1),
                                       torch.ones(1, 1), tau_pos=2.0)
    assert loss.item() == pytest.approx(-2 / (1 + math.exp(-1)), abs=1e-6)


# ---------------------------------------------------------------- Clip-Cov / KL-Cov

# A = 2, 2, -2, -2 (mean 0); log pi = -0.1, -2.1, -1.1, -1.1 (mean -1.1)
# covariance (A - 0)(log pi + 1.1) = 2, -2, 0, 0: only token 0 lies in (lb, ub) = (1, 5) / is the largest.
COV_LOGP = [[-0.1, -2.1, -1.1, -1.1]]
COV_ADV = torch.tensor([[2.0, 2.0, -2.0, -2.0]])


def test_clip_cov_cuts_the_high_covariance_token():
    logp = leaf(COV_LOGP)
    # old = current: r = 1, nothing clipped by PPO; L = -A = -2, -2, 2, 2 and token 0 is cut -> 0
    loss, m = compute_policy_loss_clip_cov(logp.detach(), logp, COV_ADV, torch.ones(1, 4))
    assert loss.item() == pytest.approx((0 - 2 + 2 + 2) / 4)
    assert float(m["actor/pg_clipfrac"]) == 0.25
    loss.backward()
    assert close(logp.grad, [[0.0, -0.5, 0.5, 0.5]])  # -A r / 4, and 0 for the cut token


def test_clip_cov_leaves_tokens_the_ppo_clip_already_clipped():
    # token 0 has r = 1.5 > 1.2 with A > 0: PPO-clipped (L = -2 * 1.2), so not a candidate: nothing is cut
    logp = torch.tensor(COV_LOGP)
    old = logp - torch.tensor([[math.log(1.5), 0.0, 0.0, 0.0]])
    loss, m = compute_policy_loss_clip_cov(old, logp, COV_ADV, torch.ones(1, 4))
    assert loss.item() == pytest.approx((-2.4 - 2 + 2 + 2) / 4, abs=1e-6)
    assert float(m["actor/pg_clipfrac"]) == 0.0
    # a covariance bound that excludes 2 leaves every token in too
    loss, m = compute_policy_loss_clip_cov(logp, logp, COV_ADV, torch.ones(1, 4), clip_cov_ub=1.5)
    assert loss.item() == pytest.approx(0.0) and float(m["actor/pg_clipfrac"]) == 0.0


def test_clip_cov_cuts_at_most_ratio_times_tokens():
    # two rows of the same 4 tokens: 2 candidates (cov 2 each), max(1, int(0.0002 * 8)) = 1 is cut, at random
    logp = torch.tensor(COV_LOGP * 2)
    adv = COV_ADV.repeat(2, 1)
    _, m = compute_policy_loss_clip_cov(logp, logp, adv, torch.ones(2, 4))
    assert float(m["actor/pg_clipfrac"]) == pytest.approx(1 / 8)
    _, m = compute_policy_loss_clip_cov(logp, logp, adv, torch.ones(2, 4), clip_cov_ratio=0.25)  # int(2) = 2
    assert float(m["actor/pg_clipfrac"]) == pytest.approx(2 / 8)


def test_kl_cov_by_hand():
    # log-ratios 0.5, 0.5, 0, 0 -> r = e^0.5 = 1.648721, 1.648721, 1, 1; no clipping at all.
    # token 0 (largest covariance) gets + 0.1 * |0.5|: L = -3.247443, -3.297443, 2, 2; mean -0.636221
    logp = leaf(COV_LOGP)
    old = logp.detach() - torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    loss, m = compute_policy_loss_kl_cov(old, logp, COV_ADV, torch.ones(1, 4))
    r = math.exp(0.5)
    assert loss.item() == pytest.approx((-2 * r + 0.05 - 2 * r + 4) / 4, abs=1e-6)
    assert float(m["actor/ppo_kl"]) == pytest.approx(0.25)  # mean |log r|
    loss.backward()
    # d/dlogp: -A r (+ coef * sign(log r) on token 0), / 4
    assert close(logp.grad, [[(-2 * r + 0.1) / 4, -2 * r / 4, 0.5, 0.5]])
    loss, _ = compute_policy_loss_kl_cov(old, logp.detach(), COV_ADV, torch.ones(1, 4), ppo_kl_coef=1.0)
    assert loss.item() == pytest.approx((-2 * r + 0.5 - 2 * r + 4) / 4, abs=1e-6)


# ---------------------------------------------------------------- DPPO-Binary-TV


def test_dppo_tv_by_hand():
    # p_old = 0.5 everywhere; p = 0.6, 0.9, 0.4, 0.1; A = 1, 1, -1, -1; bounds 0.2 on p - p_old:
    # moved 0.1 (ok, A > 0), 0.4 (> 0.2: out), -0.1 (ok, A < 0), -0.4 (< -0.2: out)
    # L = -A sg[r] log p on the kept ones: -1.2 ln0.6 = 0.612991, +0.8 ln0.4 = -0.733033; token-mean / 4
    logp = leaf([[math.log(0.6), math.log(0.9), math.log(0.4), math.log(0.1)]])
    old = torch.full((1, 4), math.log(0.5))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, m = compute_policy_loss_dppo_tv(old, logp, adv, torch.ones(1, 4), clip_ratio=0.2)
    assert loss.item() == pytest.approx((-1.2 * math.log(0.6) + 0.8 * math.log(0.4)) / 4, abs=1e-6)
    assert float(m["actor/pg_clipfrac"]) == 0.5 and float(m["actor/pg_clipfrac_lower"]) == 0.0
    loss.backward()
    assert close(logp.grad, [[-1.2 / 4, 0.0, 0.8 / 4, 0.0]])
    # clip_ratio_c truncates the weight: c = 1.1 -> token 0 weighs 1.1 (and counts in pg_clipfrac_lower)
    loss, m = compute_policy_loss_dppo_tv(old, logp.detach(), adv, torch.ones(1, 4), clip_ratio=0.2, clip_ratio_c=1.1)
    assert loss.item() == pytest.approx((-1.1 * math.log(0.6) + 0.8 * math.log(0.4)) / 4, abs=1e-6)
    assert float(m["actor/pg_clipfrac_lower"]) == 0.25


# ---------------------------------------------------------------- common properties


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_padding_junk_never_reaches_the_loss_or_gradient(name):
    fn = EXTRA[name]
    logp = leaf([[math.log(0.6), math.log(0.3)], [float("nan"), float("inf")]])
    old = torch.tensor([[math.log(0.5), math.log(0.4)], [float("nan"), -float("inf")]])
    adv = torch.tensor([[1.0, -1.0], [float("nan"), 3.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    loss, metrics = fn(old, logp, adv, mask, global_seqs=1)
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(logp.grad).all()
    assert torch.equal(logp.grad[1], torch.zeros(2))
    assert all(math.isfinite(float(v)) for v in metrics.values())
    # the same as the valid row alone
    alone, _ = fn(old[:1], logp.detach()[:1], adv[:1], mask[:1])
    assert loss.item() == pytest.approx(alone.item(), abs=1e-6)


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_gradient_raises_the_probability_of_a_positive_advantage_token_on_policy(name):
    # on-policy (r = 1), one token, A = +1: a descent step must increase log pi, i.e. dL/dlogp < 0
    # (kl_cov's |log r| penalty has no slope at r = 1 from the side of a positive step either way)
    for sign in (1.0, -1.0):
        logp = leaf([[math.log(0.5)]])
        loss, _ = EXTRA[name](logp.detach(), logp, torch.tensor([[sign]]), torch.ones(1, 1))
        loss.backward()
        assert logp.grad.item() * sign < 0, (name, sign, logp.grad)


def test_rollout_is_weights_scale_the_token_losses():
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]])
    w = torch.tensor([[0.5, 2.0]])
    # GPG: -A log pi * w = (0.5 * ln2 * 0.5 + ln4 * 2) / 2 with A = 1
    loss, _ = compute_policy_loss_gpg(logp, logp, torch.ones(1, 2), torch.ones(1, 2), rollout_is_weights=w)
    assert loss.item() == pytest.approx((0.5 * math.log(2) + 2 * math.log(4)) / 2, abs=1e-6)
    # GMPO: the per-sequence geometric mean of the weights, sqrt(0.5 * 2) = 1; on-policy L = -1
    loss, _ = compute_policy_loss_geo_mean(logp, logp, torch.ones(1, 2), torch.ones(1, 2), rollout_is_weights=w)
    assert loss.item() == pytest.approx(-1.0, abs=1e-6)


# ---------------------------------------------------------------- through the actor

ACTOR_PATH_LOSSES = ["cispo", "geo_mean", "gpg", "sapo", "dppo_tv"]


@pytest.mark.parametrize("name", ACTOR_PATH_LOSSES + ["clip_cov", "kl_cov"])
def test_actor_update_runs_each_loss_and_micro_batches_sum_to_the_mini_batch(tiny_model_dir, name):
    from tests.unit.test_workers import micro_batch_case, snapshot
    from verl.config import TrainerConfig
    from verl.distributed.fsdp import parallelize
    from verl.workers.actor import Actor

    model, batch = micro_batch_case(tiny_model_dir)
    cfg = TrainerConfig(actor_rollout_ref=dict(actor=dict(
        policy_loss=dict(loss_mode=name), ppo_epochs=1, shuffle=False, grad_clip=1e9,
        optim=dict(lr=1.0, eps=1.0, weight_decay=0.0)))).actor_rollout_ref.actor
    updated = {}
    for micro in (None, 2):
        torch.manual_seed(0)
        actor = Actor(parallelize(copy.deepcopy(model), cfg.fsdp_config, device="cpu"), cfg, torch.device("cpu"),
                      samples_per_mini_batch=4, total_steps=1)
        assert actor.policy_loss_fn is POLICY_LOSSES[name]
        metrics = actor.update(batch, micro_batch_size=micro)
        assert all(math.isfinite(float(v)) for v in metrics.values() if isinstance(v, (int, float))), metrics
        updated[micro] = snapshot(actor.model)
    initial = snapshot(model)
    assert max((updated[None][k] - initial[k]).abs().max().item() for k in initial) > 1e-4
    if name in ACTOR_PATH_LOSSES:  # clip_cov / kl_cov pick tokens among each micro-batch's own covariances
        for key in initial:
            torch.testing.assert_close(updated[2][key], updated[None][key], atol=1e-6, rtol=0, msg=key)


def test_loss_settings_come_from_the_config(tiny_model_dir):
    """SAPO's temperatures and the covariance losses' settings are read from verl's keys and change the update."""
    from tests.unit.test_workers import micro_batch_case, snapshot
    from verl.config import TrainerConfig
    from verl.distributed.fsdp import parallelize
    from verl.workers.actor import Actor

    model, batch = micro_batch_case(tiny_model_dir)

    def actor(**actor_cfg):
        cfg = TrainerConfig(actor_rollout_ref=dict(actor=dict(ppo_epochs=1, shuffle=False, grad_clip=1e9,
                                                             optim=dict(lr=1.0, eps=1.0, weight_decay=0.0),
                                                             **actor_cfg))).actor_rollout_ref.actor
        return Actor(parallelize(copy.deepcopy(model), cfg.fsdp_config, device="cpu"), cfg, torch.device("cpu"),
                     samples_per_mini_batch=4, total_steps=1)

    sapo = actor(policy_loss=dict(loss_mode="sapo"), tau_pos=2.0)
    assert sapo.loss_settings == {"tau_pos": 2.0, "tau_neg": 1.05}
    cov = actor(policy_loss=dict(loss_mode="kl_cov", kl_cov_ratio=0.5, ppo_kl_coef=0.3))
    assert cov.loss_settings == {"kl_cov_ratio": 0.5, "ppo_kl_coef": 0.3}
    assert actor(policy_loss=dict(loss_mode="clip_cov", clip_cov_ub=7.0)).loss_settings["clip_cov_ub"] == 7.0
    assert actor().loss_settings == {}  # vanilla reads only the clip ratios
    default = actor(policy_loss=dict(loss_mode="sapo"))
    sapo.update(batch)
    default.update(batch)
    a, b = snapshot(sapo.model), snapshot(default.model)
    assert max((a[k] - b[k]).abs().max().item() for k in a) > 1e-6, "tau_pos must change the update"
