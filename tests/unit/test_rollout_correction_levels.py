"""verl's rollout correction beyond token-level TIS: sequence-level weights, batch normalisation,
rejection sampling, and their config keys. Expected numbers are worked out by hand in comments."""

import math

import pytest
import torch

from verl.algorithms.rollout_correction import (RolloutCorrection, parse_rs, rollout_correction_of,
                                                rollout_is_weights, rollout_rejection_mask)
from verl.config import ConfigError
from verl.config.schema import TrainerConfig
from verl.protocol import Batch

LN = math.log


def _close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=1e-6, rtol=1e-6)


# Two responses of 3 tokens, the second 2 long. old - rollout per token:
#   row 0: ln 1.2, ln 1.5, ln 0.4  -> sum = ln(1.2 * 1.5 * 0.4) = ln 0.72
#   row 1: ln 2.0, ln 1.5, (pad)   -> sum = ln 3.0
OLD = torch.tensor([[LN(1.2), LN(1.5), LN(0.4)], [LN(2.0), LN(1.5), 7.0]])
ROLLOUT = torch.zeros(2, 3)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_sequence_weight_is_the_capped_product_of_the_ratios_on_every_token():
    weights, metrics = rollout_is_weights(OLD, ROLLOUT, MASK, "sequence", threshold=2.0)
    # row 0: 0.72 (under the cap); row 1: min(3.0, 2.0) = 2.0; padding 0
    _close(weights, [[0.72, 0.72, 0.72], [2.0, 2.0, 0.0]])
    # mean over the 5 valid tokens: (3 * 0.72 + 2 * 2.0) / 5 = 6.16 / 5 = 1.232
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.232)
    # one of the two sequences has a product above the cap
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(0.5)
    assert not weights.requires_grad


def test_sequence_weights_are_detached_and_the_sum_is_clamped_before_exp():
    old = torch.tensor([[15.0, 15.0]], requires_grad=True)
    weights, _ = rollout_is_weights(old, torch.zeros(1, 2), torch.ones(1, 2), "sequence", threshold=1e12)
    # sum 30 is clamped to 20: weight exp(20), not exp(30), under a cap that lets it through
    _close(weights, [[math.exp(20.0), math.exp(20.0)]])
    assert not weights.requires_grad


def test_token_weights_match_the_existing_token_level_rule():
    weights, metrics = rollout_is_weights(OLD, ROLLOUT, MASK, "token", threshold=1.4)
    # min(ratio, 1.4): 1.2, 1.4, 0.4 / 1.4, 1.4, pad
    _close(weights, [[1.2, 1.4, 0.4], [1.4, 1.4, 0.0]])
    # tokens above the cap: 1.5, 2.0, 1.5 -> 3 of 5
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(0.6)


def test_batch_normalize_token_level_divides_by_the_mean_over_valid_tokens():
    weights, metrics = rollout_is_weights(OLD, ROLLOUT, MASK, "token", threshold=1.4, batch_normalize=True)
    # capped weights 1.2, 1.4, 0.4, 1.4, 1.4: mean = 5.8 / 5 = 1.16
    assert metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.16)
    _close(weights, [[1.2 / 1.16, 1.4 / 1.16, 0.4 / 1.16], [1.4 / 1.16, 1.4 / 1.16, 0.0]])


def test_batch_normalize_sequence_level_divides_by_the_mean_over_sequences():
    weights, metrics = rollout_is_weights(OLD, ROLLOUT, MASK, "sequence", threshold=2.0, batch_normalize=True)
    # per-sequence weights 0.72 and 2.0: mean over sequences = 1.36 (not the token mean 1.232)
    assert metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.36)
    _close(weights, [[0.72 / 1.36] * 3, [2.0 / 1.36, 2.0 / 1.36, 0.0]])


def test_token_k1_keeps_tokens_whose_ratio_lies_in_the_bounds():
    # k1 = log(pi_rollout / pi_old) = -(old - rollout): ratios pi_rollout/pi_old are
    # row 0: 1/1.2 = 0.833, 1/1.5 = 0.667, 1/0.4 = 2.5; row 1: 0.5, 0.667
    mask, metrics = rollout_rejection_mask(OLD, ROLLOUT, MASK, "token_k1", "0.6_1.6")
    # in [0.6, 1.6]: 0.833 yes, 0.667 yes, 2.5 no / 0.5 no, 0.667 yes
    assert mask.tolist() == [[1, 1, 0], [0, 1, 0]]
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(1.0)


def test_token_k1_with_one_bound_is_symmetric():
    # U = 1.9 means [1/1.9, 1.9] = [0.526, 1.9]: drops 2.5 and 0.5, as above
    mask, _ = rollout_rejection_mask(OLD, ROLLOUT, MASK, "token_k1", 1.9)
    assert mask.tolist() == [[1, 1, 0], [0, 1, 0]]


def test_seq_max_k2_drops_the_whole_response_of_its_worst_token():
    # k2 = (old - rollout)^2 / 2: row 0 max at ln 0.4: 0.9163^2 / 2 = 0.4198; row 1 max at ln 2: 0.2402
    mask, metrics = rollout_rejection_mask(OLD, ROLLOUT, MASK, "seq_max_k2", "0.3")
    assert mask.tolist() == [[0, 0, 0], [1, 1, 0]]
    # 3 of 5 valid tokens, 1 of 2 sequences
    assert metrics["rollout_corr/rollout_rs_seq_max_k2_masked_fraction"] == pytest.approx(0.6)
    assert metrics["rollout_corr/rollout_rs_seq_max_k2_seq_masked_fraction"] == pytest.approx(0.5)


def test_combined_options_must_all_pass():
    # token_k1 in [0.45, 1.6] drops only the ratio 2.5 (row 0, token 2); seq_max_k2 <= 0.2 drops
    # row 1 as well (0.2402 > 0.2) and row 0 (0.4198): everything rejected but padding
    mask, _ = rollout_rejection_mask(OLD, ROLLOUT, MASK, "token_k1,seq_max_k2", "0.45_1.6,0.2")
    assert mask.tolist() == [[0, 0, 0], [0, 0, 0]]
    # seq_max_k2 <= 0.25 keeps row 1; token_k1 still drops row 0's third token; seq_max drops row 0
    mask, metrics = rollout_rejection_mask(OLD, ROLLOUT, MASK, "token_k1,seq_max_k2", "0.45_1.6,0.25")
    assert mask.tolist() == [[0, 0, 0], [1, 1, 0]]
    assert metrics["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(1 / 5)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(3 / 5)


def test_sequence_sum_and_mean_k1():
    # k1 sums: row 0: -(ln 0.72) -> ratio 1/0.72 = 1.389; row 1: -ln 3 -> ratio 0.333
    mask, _ = rollout_rejection_mask(OLD, ROLLOUT, MASK, "seq_sum_k1", "0.5_2")
    assert mask.tolist() == [[1, 1, 1], [0, 0, 0]]
    # means: row 0: ratio 0.72^(-1/3) = 1.116; row 1: 3^(-1/2) = 0.577, kept in [0.55, 2]
    mask, _ = rollout_rejection_mask(OLD, ROLLOUT, MASK, "seq_mean_k1", "0.55_2")
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]]


def test_k3_estimator():
    # k3 = r - 1 - ln r with r = pi_old / pi_rollout: r = 0.4 -> 0.4 - 1 + 0.9163 = 0.3163;
    # r = 2 -> 2 - 1 - 0.6931 = 0.3069; r = 1.2 -> 0.0177; r = 1.5 -> 0.0945
    mask, _ = rollout_rejection_mask(OLD, ROLLOUT, MASK, "token_k3", 0.2)
    assert mask.tolist() == [[1, 1, 0], [0, 1, 0]]


def test_threshold_parsing():
    assert parse_rs("token_k1,seq_max_k2", "0.6_1.6,2.5") == [("token_k1", 0.6, 1.6), ("seq_max_k2", None, 2.5)]
    assert parse_rs("token_k1, token_k1", 2.0) == [("token_k1", 0.5, 2.0)]
    with pytest.raises(ValueError, match="one per option"):
        parse_rs("token_k1,seq_max_k2,token_k3", "1.5,2.5")
    with pytest.raises(ValueError, match="takes one upper bound"):
        parse_rs("seq_max_k2", "0.1_2")
    with pytest.raises(ValueError, match="unknown option"):
        parse_rs("seq_max_k1", 2.0)
    with pytest.raises(ValueError, match="needs rollout_rs_threshold"):
        parse_rs("token_k2", None)


def test_weights_use_the_full_mask_and_rejection_only_changes_the_mask():
    correction = RolloutCorrection("sequence", 2.0, rollout_rs="token_k1", rollout_rs_threshold="0.6_1.6")
    weights, mask, metrics = correction.apply(OLD, ROLLOUT, MASK)
    _close(weights, [[0.72, 0.72, 0.72], [2.0, 2.0, 0.0]])
    assert mask.tolist() == [[1, 1, 0], [0, 1, 0]]
    assert all(isinstance(v, float) for v in metrics.values())


# ---------------------------------------------------------------- config keys
def _validated(*overrides):
    cfg = TrainerConfig.from_overrides(list(overrides))
    cfg.validate()
    return cfg


def test_verl_keys_reach_the_actor():
    cfg = _validated("algorithm.rollout_correction.rollout_is=sequence",
                     "algorithm.rollout_correction.rollout_is_threshold=3.0",
                     "algorithm.rollout_correction.rollout_is_batch_normalize=true",
                     "algorithm.rollout_correction.rollout_rs='token_k1,seq_max_k2'",
                     "algorithm.rollout_correction.rollout_rs_threshold='0.6_1.6,2.5'")
    correction = rollout_correction_of(cfg.actor_rollout_ref.actor, cfg.algorithm.rollout_correction)
    assert correction == RolloutCorrection("sequence", 3.0, True, "token_k1,seq_max_k2", "0.6_1.6,2.5")
    assert correction.batch_level
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs  # the engine must report its log-probs
    assert not cfg.actor_rollout_ref.actor.rollout_is_correction


def test_token_level_with_rejection_sampling():
    cfg = _validated("algorithm.rollout_correction.rollout_is=token",
                     "algorithm.rollout_correction.rollout_rs=seq_max_k2",
                     "algorithm.rollout_correction.rollout_rs_threshold=2.5")
    assert cfg.actor_rollout_ref.actor.rollout_is_correction
    assert rollout_correction_of(cfg.actor_rollout_ref.actor, cfg.algorithm.rollout_correction) == RolloutCorrection(
        "token", 2.0, False, "seq_max_k2", 2.5)


def test_plain_token_level_stays_in_the_loss():
    cfg = _validated("algorithm.rollout_correction.rollout_is=token")
    assert not rollout_correction_of(cfg.actor_rollout_ref.actor, cfg.algorithm.rollout_correction).batch_level


@pytest.mark.parametrize("overrides, match", [
    (["algorithm.rollout_correction.rollout_rs=token_k9", "algorithm.rollout_correction.rollout_rs_threshold=2"],
     "unknown option"),
    (["algorithm.rollout_correction.rollout_rs=token_k1"], "needs rollout_rs_threshold"),
    (["algorithm.rollout_correction.rollout_is=sequence", "algorithm.rollout_correction.rollout_is_threshold='0.5_2'"],
     "IcePop"),
])
def test_bad_settings_are_config_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        _validated(*overrides)


@pytest.mark.parametrize("override", ["algorithm.rollout_correction.loss_type=vanilla",
                                      "algorithm.rollout_correction.rollout_is=geometric"])
def test_what_is_not_implemented_stays_refused(override):
    with pytest.raises(ConfigError):
        _validated(override)


# ---------------------------------------------------------------- through the actor
def _actor_update(model, batch, micro=None, **correction):
    import copy

    from verl.distributed.fsdp import parallelize
    from verl.workers.actor import Actor

    cfg = TrainerConfig(algorithm=dict(rollout_correction=correction), actor_rollout_ref=dict(actor=dict(
        ppo_epochs=1, shuffle=False, grad_clip=1e9, optim=dict(lr=1.0, eps=1.0, weight_decay=0.0))))
    torch.manual_seed(0)
    actor = Actor(parallelize(copy.deepcopy(model), cfg.actor_rollout_ref.actor.fsdp_config, device="cpu"),
                  cfg.actor_rollout_ref.actor, torch.device("cpu"), samples_per_mini_batch=4, total_steps=1,
                  rollout_correction=rollout_correction_of(cfg.actor_rollout_ref.actor, cfg.algorithm.rollout_correction))
    metrics = actor.update(batch, micro_batch_size=micro)
    return actor.model.state_dict(), metrics


def test_rejected_rows_leave_the_actor_update_as_if_masked_out(tiny_model_dir):
    from tests.unit.test_workers import micro_batch_case

    model, batch = micro_batch_case(tiny_model_dir)
    # the engine was far off on sample 1 (log-ratio 1 on every token: k2 = 0.5), close elsewhere
    offset = torch.zeros_like(batch["old_log_probs"])
    offset[1] = 1.0
    batch["rollout_log_probs"] = batch["old_log_probs"] - offset
    mask_before = batch["response_mask"].clone()
    rejected, metrics = _actor_update(model, batch, micro=2, rollout_rs="seq_max_k2", rollout_rs_threshold=0.4)
    assert torch.equal(batch["response_mask"], mask_before)  # the caller's batch is left alone
    # sample 1 holds 4 of the 11 valid tokens, 1 of the 4 samples
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(4 / 11)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(1 / 4)
    masked = Batch(batch.tensors, batch.non_tensors, batch.meta)
    masked["response_mask"] = mask_before * torch.tensor([[1], [0], [1], [1]])
    expected, _ = _actor_update(model, masked, micro=2)
    for key in expected:
        torch.testing.assert_close(rejected[key], expected[key], atol=1e-6, rtol=0, msg=key)


def test_sequence_weights_scale_each_samples_loss(tiny_model_dir):
    """A sequence weight of exactly 1 on every sample (rollout == old) leaves the update as it is;
    batch normalisation of equal weights changes nothing either; a per-sample weight of 2 doubles
    that sample's loss, which equals doubling its advantages (the policy loss is linear in them at
    the first step, where the ratio is 1 and no clipping applies)."""
    from tests.unit.test_workers import micro_batch_case

    model, batch = micro_batch_case(tiny_model_dir)
    batch["old_log_probs"], _ = _log_probs(model, batch)  # exactly on-policy: ratio 1, no clipping
    plain, _ = _actor_update(model, batch)
    batch["rollout_log_probs"] = batch["old_log_probs"].clone()
    same, metrics = _actor_update(model, batch, rollout_is="sequence", rollout_is_batch_normalize=True)
    assert metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.0)
    for key in plain:
        torch.testing.assert_close(same[key], plain[key], atol=1e-6, rtol=0, msg=key)
    # sample 0: sum of log-ratios ln 2 spread over its 4 tokens -> weight 2 (cap 3)
    rollout = batch["old_log_probs"].clone()
    rollout[0, :4] -= math.log(2.0) / 4
    batch["rollout_log_probs"] = rollout
    weighted, _ = _actor_update(model, batch, rollout_is="sequence", rollout_is_threshold=3.0)
    doubled = Batch(batch.tensors, batch.non_tensors, batch.meta)
    doubled["advantages"] = batch["advantages"] * torch.tensor([[2.0], [1.0], [1.0], [1.0]])
    expected, _ = _actor_update(model, doubled)
    for key in expected:
        torch.testing.assert_close(weighted[key], expected[key], atol=1e-5, rtol=0, msg=key)


def _log_probs(model, batch):
    from verl.models.logprob import compute_response_logprobs

    with torch.no_grad():
        return compute_response_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                         batch["responses"])


# ---------------------------------------------------------------- bypass mode (verl's bypass_mode=true)
# Two policies only: pi_theta (LP, the update's log-probs) and pi_rollout. Per token r = pi_theta / pi_rollout:
#   row 0: r = 1.5, 3.0, 0.5  (advantage +1)
#   row 1: r = 1.25, 0.5, pad (advantage -2)
# so ROLLOUT_LP = LP - ln r; the padded position holds junk that must reach nothing.
LP = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -3.0, 0.0]])
RATIOS = torch.tensor([[1.5, 3.0, 0.5], [1.25, 0.5, 1.0]])
ROLLOUT_LP = LP - RATIOS.log() + torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 7.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
BYPASS_MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# token_k1 '0.6_2.5' keeps a token when pi_rollout / pi_theta = 1/r lies in [0.6, 2.5]:
#   1/r = 0.667, 0.333 (rejected), 2.0 | 0.8, 2.0  -> only row 0 token 1 leaves the loss.
TOKEN_RS = dict(rollout_rs="token_k1", rollout_rs_threshold="0.6_2.5")


def _bypass(loss_type, **kwargs):
    from verl.algorithms.rollout_correction import bypass_policy_loss

    log_prob = LP.clone().requires_grad_(True)
    # global_tokens=5: the mini-batch's valid tokens before rejection, as the actor passes them
    loss, metrics = bypass_policy_loss(log_prob, ROLLOUT_LP, ADV, BYPASS_MASK, loss_type=loss_type,
                                       global_tokens=5, **kwargs)
    loss.backward()
    return loss, log_prob.grad, metrics


def test_bypass_reinforce_weights_the_policy_gradient_and_drops_rejected_tokens():
    loss, grad, metrics = _bypass("reinforce", rollout_is="token", rollout_is_threshold=2.0, **TOKEN_RS)
    # w = min(r, 2) = 1.5, 2.0, 0.5 | 1.25, 0.5; per kept token -A * w * log pi:
    #   row 0: -(1)(1.5)(-1) = 1.5, (rejected), -(1)(0.5)(-0.5) = 0.25
    #   row 1: -(-2)(1.25)(-1) = -2.5, -(-2)(0.5)(-3) = -3.0
    # sum -3.75 over the 5 tokens of the mini-batch (token-mean) = -0.75
    assert loss.item() == pytest.approx(-0.75)
    # d/d log pi = -A * w / 5 (the weights are detached: no d w / d log pi term); 0 where rejected or padding
    _close(grad, [[-0.3, 0.0, -0.1], [0.5, 0.2, 0.0]])
    # weight statistics over the 5 valid tokens, before rejection: (1.5 + 2 + 0.5 + 1.25 + 0.5) / 5 = 1.15
    assert metrics["rollout_corr/rollout_is_mean"].item() == pytest.approx(1.15)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"].item() == pytest.approx(1 / 5)  # r = 3
    assert metrics["rollout_corr/rollout_rs_masked_fraction"].item() == pytest.approx(1 / 5)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"].item() == pytest.approx(1 / 2)
    # actor/ppo_kl = mean of (log pi_rollout - log pi) = -ln r over the 4 kept tokens
    assert metrics["actor/ppo_kl"].item() == pytest.approx(-LN(1.5 * 0.5 * 1.25 * 0.5) / 4)
    # off-policy diagnostics over all 5 valid tokens: kl = mean(-ln r), chi2_token = mean(r^2) - 1
    assert metrics["rollout_corr/kl"].item() == pytest.approx(-LN(1.5 * 3.0 * 0.5 * 1.25 * 0.5) / 5)
    assert metrics["rollout_corr/chi2_token"].item() == pytest.approx((2.25 + 9 + 0.25 + 1.5625 + 0.25) / 5 - 1)


def test_bypass_reinforce_with_sequence_weights_normalised_over_the_batch():
    loss, grad, metrics = _bypass("reinforce", rollout_is="sequence", rollout_is_threshold=2.0,
                                  rollout_is_batch_normalize=True)
    # products: row 0 1.5 * 3 * 0.5 = 2.25 -> cap 2; row 1 1.25 * 0.5 = 0.625. Mean over the 2 responses
    # 1.3125 = 21/16, so w = 2 * 16/21 = 32/21 and 0.625 * 16/21 = 10/21.
    # loss = (32/21 * (1 + 2 + 0.5) - 2 * 10/21 * (1 + 3)) / 5 = (112/21 - 80/21) / 5 = 32/105
    assert loss.item() == pytest.approx(32 / 105)
    assert metrics["rollout_corr/rollout_is_batch_norm_factor"].item() == pytest.approx(1.3125)
    # -A * w / 5: row 0 -(32/21) / 5 = -32/105; row 1 2 * (10/21) / 5 = 20/105
    _close(grad, [[-32 / 105, -32 / 105, -32 / 105], [20 / 105, 20 / 105, 0.0]])


def test_bypass_ppo_clip_clips_the_ratio_to_the_rollout_and_does_not_apply_the_weights():
    loss, grad, metrics = _bypass("ppo_clip", rollout_is="token", rollout_is_threshold=2.0, clip_ratio=0.2,
                                  **TOKEN_RS)
    # ratio = pi_theta / pi_rollout = r; per kept token max(-A r, -A clip(r, 0.8, 1.2)), no weight:
    #   row 0 (A = 1): r 1.5 -> max(-1.5, -1.2) = -1.2 (clipped); r 0.5 -> max(-0.5, -0.8) = -0.5
    #   row 1 (A = -2): r 1.25 -> max(2.5, 2.4) = 2.5; r 0.5 -> max(1.0, 1.6) = 1.6 (clipped)
    # (dual clip caps at -A * 3 = 6: not reached.) Sum 2.4 over 5 tokens = 0.48; with the weights
    # applied it would be (-1.8 - 0.25 + 3.125 + 0.8) / 5 = 0.375.
    assert loss.item() == pytest.approx(0.48)
    # gradient -A r / 5 on unclipped tokens: row 0 token 2: -0.5/5 = -0.1; row 1 token 0: 2.5/5 = 0.5
    _close(grad, [[0.0, 0.0, -0.1], [0.5, 0.0, 0.0]])
    assert metrics["actor/pg_clipfrac"].item() == pytest.approx(2 / 4)  # of the kept tokens
    assert metrics["rollout_corr/rollout_is_mean"].item() == pytest.approx(1.15)  # logged all the same
    assert metrics["rollout_corr/rollout_rs_masked_fraction"].item() == pytest.approx(1 / 5)


def test_bypass_without_weights_is_plain_reinforce_and_ppo_clip_against_the_rollout():
    from verl.algorithms.losses import compute_policy_loss

    loss, _, _ = _bypass("reinforce")
    # -A log pi summed: row 0: 1 + 2 + 0.5 = 3.5; row 1: -2 * (1 + 3) = -8 -> -4.5 / 5
    assert loss.item() == pytest.approx(-0.9)
    loss, _, _ = _bypass("ppo_clip")
    expected, _ = compute_policy_loss(ROLLOUT_LP, LP, ADV, BYPASS_MASK, global_tokens=5)
    assert loss.item() == pytest.approx(expected.item())
    with pytest.raises(ValueError, match="ppo_clip or reinforce"):
        _bypass("vanilla")


def test_bypass_keys_validate_and_reach_the_actor():
    cfg = _validated("algorithm.rollout_correction.bypass_mode=true",
                     "algorithm.rollout_correction.loss_type=ppo_clip",
                     "algorithm.rollout_correction.rollout_is=token",
                     "algorithm.rollout_correction.rollout_rs='token_k1,seq_max_k2'",
                     "algorithm.rollout_correction.rollout_rs_threshold='0.6_1.6,2.5'")
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs  # the engine's log-probs are pi_old
    # token-level weights are pi_theta / pi_rollout here, not the actor's pi_old / pi_rollout TIS
    assert not cfg.actor_rollout_ref.actor.rollout_is_correction
    correction = rollout_correction_of(cfg.actor_rollout_ref.actor, cfg.algorithm.rollout_correction)
    assert correction == RolloutCorrection("token", 2.0, False, "token_k1,seq_max_k2", "0.6_1.6,2.5", True, "ppo_clip")
    assert not correction.batch_level  # nothing before the first step: all of it per micro-batch
    cfg = _validated("algorithm.rollout_correction.bypass_mode=true",
                     "algorithm.rollout_correction.loss_type=reinforce",
                     "algorithm.rollout_correction.rollout_is=sequence",
                     "algorithm.rollout_correction.rollout_is_batch_normalize=true")
    assert rollout_correction_of(cfg.actor_rollout_ref.actor, cfg.algorithm.rollout_correction) == RolloutCorrection(
        "sequence", 2.0, True, None, None, True, "reinforce")


def test_loss_type_without_bypass_mode_warns(caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="verl.config"):
        _validated("algorithm.rollout_correction.loss_type=reinforce")
    assert "no effect without bypass_mode=true" in caplog.text


def test_bypass_update_is_ppo_against_the_rollout_without_an_old_log_prob_pass(tiny_model_dir, monkeypatch):
    """Through the actor: bypass ppo_clip on a batch without old_log_probs equals the decoupled update
    given old_log_probs = rollout_log_probs; the actor runs no log-prob pass of its own (even with the
    per-sequence weights, batch normalisation and rejection that need one outside bypass mode)."""
    from tests.unit.test_workers import micro_batch_case
    from verl.workers.actor import Actor

    model, batch = micro_batch_case(tiny_model_dir)
    batch["rollout_log_probs"] = batch.pop("old_log_probs")
    as_old = Batch(batch.tensors, batch.non_tensors, batch.meta)
    as_old["old_log_probs"] = batch["rollout_log_probs"]
    expected, _ = _actor_update(model, as_old, micro=2)
    passes = []
    original = Actor.compute_log_prob
    monkeypatch.setattr(Actor, "compute_log_prob", lambda self, b, **kw: passes.append(1) or original(self, b, **kw))
    bypassed, metrics = _actor_update(model, batch, micro=2, bypass_mode=True)
    for key in expected:
        torch.testing.assert_close(bypassed[key], expected[key], atol=1e-6, rtol=0, msg=key)
    # the engine's log-probs are the model's plus noise: the diagnostics see the gap
    assert metrics["rollout_corr/k3_kl"] > 0 and metrics["actor/rollout_log_prob_diff"] > 0
    assert "actor/entropy" in metrics  # the skipped pass's metrics come from the update's forward
    _, metrics = _actor_update(model, batch, micro=2, bypass_mode=True, loss_type="reinforce", rollout_is="sequence",
                               rollout_is_batch_normalize=True, rollout_rs="seq_max_k2", rollout_rs_threshold=2.5)
    assert passes == []
    assert metrics["rollout_corr/rollout_is_batch_norm_factor"] > 0
    assert "rollout_corr/rollout_rs_seq_max_k2_masked_fraction" in metrics
