"""GDPO (Liu et al. 2026): reward components normalised apart within each group, summed, then
whitened over the batch's tokens; its inputs are read from the reward function's dict, and its
settings are checked before anything loads."""

import math

import pytest
import torch

from verl.algorithms import ADV_ESTIMATORS, compute_advantage, compute_gdpo_outcome_advantage
from verl.config import ConfigError, TrainerConfig
from verl.errors import VerlError
from verl.protocol import Batch
from verl.trainer.ppo.build import check_algorithm_names
from verl.trainer.ppo.core import apply_kl_and_advantage, gdpo_reward_components

UIDS = ["a", "a", "a", "b", "b", "b"]
ACCURACY = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
FORMAT = [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
# Every response has 2 valid tokens of 3.
MASK = torch.tensor([[1, 1, 0]] * 6)


def _components(*columns):
    return torch.tensor(list(zip(*columns)), dtype=torch.float32)


def test_two_groups_of_three_with_two_components_by_hand():
    # Per component, within each group, (r - mean) / unbiased std (epsilon 1e-6 is below the tolerance):
    #   accuracy a = [1, 0, 0]: mean 1/3, std sqrt((4/9 + 1/9 + 1/9) / 2) = 1/sqrt3 -> [2, -1, -1] / sqrt3
    #   format   a = [1, 1, 0]: likewise                                        -> [1, 1, -2] / sqrt3
    #   accuracy b = [1, 1, 1]: std 0, so (r - mean) / (0 + eps) = 0            -> [0, 0, 0]
    #   format   b = [0, 1, 0]:                                                 -> [-1, 2, -1] / sqrt3
    # Sums: a = [sqrt3, 0, -sqrt3], b = [-1, 2, -1] / sqrt3.
    # Whitened over the 12 valid tokens (2 per sample): mean 0; sum of squares 2 * (3 + 3 + 6/9) = 16,
    # unbiased variance 16 / 11, so A = sum * sqrt11 / 4:
    #   a = [sqrt33/4, 0, -sqrt33/4] = [1.43614, 0, -1.43614]
    #   b = [-sqrt33/12, sqrt33/6, -sqrt33/12] = [-0.47871, 0.95743, -0.47871]
    r33 = math.sqrt(33)
    expected = torch.tensor([r33 / 4, 0.0, -r33 / 4, -r33 / 12, r33 / 6, -r33 / 12])
    adv, returns = compute_gdpo_outcome_advantage(_components(ACCURACY, FORMAT), MASK, UIDS)
    assert torch.allclose(adv[:, 0], expected, atol=1e-4) and torch.allclose(adv[:, 1], expected, atol=1e-4)
    assert torch.all(adv[:, 2] == 0)  # padding
    assert torch.equal(adv, returns)


def test_it_is_not_grpo_of_the_summed_score():
    # GRPO normalises the sums: a = [2, 1, 0] -> [1, 0, -1]; b = [1, 2, 1] -> [-1, 2, -1] / sqrt3.
    # Its first sample of a over the middle one of b: 1 / (2 / sqrt3) = sqrt3 / 2 = 0.866.
    # GDPO (above): sqrt3 / (2 / sqrt3) = 1.5 - accuracy, which only a varies in, weighs more.
    gdpo, _ = compute_gdpo_outcome_advantage(_components(ACCURACY, FORMAT), MASK, UIDS)
    summed = torch.tensor([a + f for a, f in zip(ACCURACY, FORMAT)])[:, None] * torch.tensor([[1.0, 0, 0]])
    grpo, _ = compute_advantage("grpo", token_level_rewards=summed, response_mask=MASK, group_index=UIDS)
    assert gdpo[0, 0] / gdpo[4, 0] == pytest.approx(1.5, abs=1e-4)
    assert grpo[0, 0] / grpo[4, 0] == pytest.approx(math.sqrt(3) / 2, abs=1e-4)


def test_weights_scale_each_normalised_component():
    # Weights [1, 0]: only accuracy counts: a = [2, -1, -1] / sqrt3, b = 0. Mean 0, sum of squares
    # 2 * (4 + 1 + 1) / 3 = 4 over 12 tokens, variance 4 / 11: A_a = [2, -1, -1] / sqrt3 * sqrt11 / 2
    # = [sqrt(11/3), -sqrt(11/3) / 2, -sqrt(11/3) / 2] = [1.91485, -0.95743, -0.95743].
    adv, _ = compute_gdpo_outcome_advantage(_components(ACCURACY, FORMAT), MASK, UIDS, reward_weights=[1.0, 0.0])
    s = math.sqrt(11 / 3)
    assert torch.allclose(adv[:, 0], torch.tensor([s, -s / 2, -s / 2, 0.0, 0.0, 0.0]), atol=1e-4)


def test_a_group_of_one_keeps_its_raw_component_scores_as_verl_does():
    # Groups a = samples 0, 1 and b = sample 2 alone; 1 valid token each.
    #   accuracy a = [1, 0]: mean 0.5, std sqrt(0.5) -> [0.70711, -0.70711];   format a = [0, 0] -> 0
    #   b alone: mean 0, std 1 -> accuracy 1, format 0.5 (each / (1 + 1e-6))
    # Sums [0.70711, -0.70711, 1.5]; mean 0.5, unbiased variance (0.04289 + 1.45711 + 1) / 2 = 1.25:
    # A = (sum - 0.5) / 1.11803 = [0.18524, -1.07966, 0.89443].
    adv, _ = compute_gdpo_outcome_advantage(_components([1.0, 0.0, 1.0], [0.0, 0.0, 0.5]), torch.ones(3, 1),
                                            ["a", "a", "b"])
    assert torch.allclose(adv[:, 0], torch.tensor([0.18524, -1.07966, 0.89443]), atol=1e-4)


def test_without_the_std_division_components_are_only_centred():
    # norm_adv_by_std_in_grpo=false, groups a = [0, 1] (1 token each) and b = [2, 3]; one component
    # [1, 3] in a, [0, 0] in b -> centred [-1, 1, 0, 0]; a second [0, 0] in a, [4, 0] in b -> [0, 0, 2, -2].
    # Sums [-1, 1, 2, -2], mean 0, variance 10 / 3: A = sum * sqrt(3/10).
    adv, _ = compute_gdpo_outcome_advantage(_components([1.0, 3.0, 0.0, 0.0], [0.0, 0.0, 4.0, 0.0]),
                                            torch.ones(4, 1), [0, 0, 1, 1], norm_adv_by_std_in_grpo=False)
    assert torch.allclose(adv[:, 0], torch.tensor([-1.0, 1.0, 2.0, -2.0]) * math.sqrt(0.3), atol=1e-5)


def test_gdpo_is_a_named_estimator_that_needs_its_components():
    assert "gdpo" in ADV_ESTIMATORS
    with pytest.raises(ValueError, match="gdpo needs reward_components"):
        compute_advantage("gdpo", token_level_rewards=torch.zeros(6, 3), response_mask=MASK, group_index=UIDS)
    with pytest.raises(ValueError, match="1 reward_weights for 2 reward components"):
        compute_gdpo_outcome_advantage(_components(ACCURACY, FORMAT), MASK, UIDS, reward_weights=[1.0])


# --------------------------------------------------------------------------- config checks (before loading)

def _check(*overrides):
    check_algorithm_names(TrainerConfig.from_cli(list(overrides)))


def test_verl_example_keys_are_accepted():
    _check("algorithm.adv_estimator=gdpo", '+algorithm.gdpo_reward_keys=["accuracy_reward", "format_reward"]')
    _check("algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[acc,fmt]",
           "algorithm.gdpo_reward_weights=[1.0,0.5]")


@pytest.mark.parametrize("overrides,message", [
    ([], r"set algorithm.gdpo_reward_keys to keys your reward function returns"),
    (["algorithm.gdpo_reward_keys=[]"], r"set algorithm.gdpo_reward_keys to keys your reward function returns"),
    (["algorithm.gdpo_reward_keys=[acc,fmt]", "algorithm.gdpo_reward_weights=[1.0]"],
     r"gdpo_reward_weights has 1 weights for 2 algorithm.gdpo_reward_keys \(acc, fmt\); give one weight per key"),
    (["algorithm.gdpo_reward_keys=[acc]", "algorithm.use_kl_in_reward=true"],
     r"use_kl_in_reward=true has no effect with algorithm.adv_estimator=gdpo.*use_kl_loss=true"),
])
def test_bad_gdpo_settings_fail_before_anything_loads(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _check("algorithm.adv_estimator=gdpo", *overrides)


# --------------------------------------------------------------------------- components from the reward output

def _scored_batch(**extras):
    batch = Batch({"response_mask": MASK, "token_level_scores": torch.zeros(6, 3)}, {"uid": list(UIDS)})
    for key, values in extras.items():
        batch[f"reward_extra/{key}"] = values
    return batch


class _Algo:
    adv_estimator = "gdpo"
    use_kl_in_reward = False
    gamma = lam = 1.0
    norm_adv_by_std_in_grpo = True
    gdpo_reward_keys = ["accuracy_reward", "format_reward"]
    gdpo_reward_weights = None


def test_the_step_reads_the_components_from_the_reward_functions_dict():
    # The reward function returned {"score": ..., "accuracy_reward": ..., "format_reward": ...}; the
    # summed score (all 0 here) is not what GDPO reads.
    batch = _scored_batch(accuracy_reward=[True, False, False, True, True, True], format_reward=FORMAT, other=[0] * 6)
    out, metrics = apply_kl_and_advantage(batch, _Algo())
    expected, _ = compute_gdpo_outcome_advantage(_components(ACCURACY, FORMAT), MASK, UIDS)
    assert torch.allclose(out["advantages"], expected)
    assert metrics["gdpo/accuracy_reward/mean"] == pytest.approx(4 / 6)
    assert metrics["gdpo/format_reward/max"] == 1.0 and metrics["gdpo/format_reward/min"] == 0.0


def test_a_key_the_reward_function_did_not_return_names_the_keys_it_did():
    with pytest.raises(VerlError, match=r"names 'format_reward', which the reward function did not return.*"
                                        r"name keys it returns: accuracy_reward, fmt"):
        gdpo_reward_components(_scored_batch(accuracy_reward=ACCURACY, fmt=FORMAT), _Algo.gdpo_reward_keys)
    with pytest.raises(VerlError, match=r"none \(it returns plain numbers\)"):
        gdpo_reward_components(_scored_batch(), ["accuracy_reward"])


def test_a_key_returned_for_some_samples_only_or_not_a_number_is_refused():
    partial = [1.0, None, 0.0, None, 1.0, 1.0]
    with pytest.raises(VerlError, match=r"for some samples only \(2 of 6 lack it, the first is sample 1\)"):
        gdpo_reward_components(_scored_batch(accuracy_reward=partial), ["accuracy_reward"])
    with pytest.raises(VerlError, match=r"'accuracy_reward', whose values .* are not all numbers"):
        gdpo_reward_components(_scored_batch(accuracy_reward=["yes"] * 6), ["accuracy_reward"])


def test_gdpo_is_a_choice_with_a_did_you_mean():
    with pytest.raises(ConfigError, match=r"did you mean algorithm.adv_estimator=gdpo\?"):
        _check("algorithm.adv_estimator=gdpoo", "algorithm.gdpo_reward_keys=[acc]")
