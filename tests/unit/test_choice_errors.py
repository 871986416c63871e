"""Choices by name (estimators, losses, engines) are checked before anything is built, and a name
that exists in verl but not here is named as such, never "corrected" into another algorithm."""

import pytest

from verl.config import ConfigError, TrainerConfig
from verl.trainer.ppo.build import check_algorithm_names


def _check(*overrides):
    check_algorithm_names(TrainerConfig.from_overrides(list(overrides)))


@pytest.mark.parametrize("override,message", [
    ("actor_rollout_ref.actor.policy_loss.loss_mode=dppo_kl", r"dppo_kl is a policy loss of verl that this project "
                                                              r"does not implement yet; choose one of vanilla, gspo"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode=dro", r"dro is a policy loss of verl"),
    ("algorithm.adv_estimator=tir_optimal_token_baseline", r"tir_optimal_token_baseline is an advantage estimator "
                                                           r"of verl"),
    ("actor_rollout_ref.rollout.name=sglang", r"SGLang engine is not supported here; use vllm"),
])
def test_verl_names_not_implemented_here_are_named_not_corrected(override, message):
    with pytest.raises(ConfigError, match=message) as err:
        _check(override)
    assert "did you mean" not in str(err.value)


def test_typos_still_get_a_did_you_mean():
    with pytest.raises(ConfigError, match=r"did you mean algorithm.adv_estimator=grpo\?"):
        _check("algorithm.adv_estimator=grop")
    with pytest.raises(ConfigError, match=r"did you mean actor_rollout_ref.rollout.name=vllm\?"):
        _check("actor_rollout_ref.rollout.name=vlm")


@pytest.mark.parametrize("override, meant", [
    ("algorithm.adv_estimator=GRPO", "algorithm.adv_estimator=grpo"),  # below the spelling cutoff before
    ("actor_rollout_ref.rollout.name=vLLM", "actor_rollout_ref.rollout.name=vllm"),
    ("actor_rollout_ref.actor.kl_loss_type=LOW_VAR_KL", "actor_rollout_ref.actor.kl_loss_type=low_var_kl"),
])
def test_a_name_in_other_letter_case_is_told_its_spelling(override, meant):
    with pytest.raises(ConfigError, match=rf"did you mean {meant}\?"):
        _check(override)


@pytest.mark.parametrize("override, meant", [("data.truncation=LEFT", "data.truncation=left"),
                                             ("algorithm.norm_adv_by_std_in_grpo=TRUE", None)])
def test_a_schema_choice_in_other_letter_case_is_told_its_spelling(override, meant):
    if meant is None:  # a bool, not a choice: YAML's spellings of true are read as it
        assert TrainerConfig.from_overrides([override]).algorithm.norm_adv_by_std_in_grpo is True
        return
    with pytest.raises(ConfigError, match=rf"did you mean {meant}\?"):
        TrainerConfig.from_overrides([override])


def test_megatron_settings_are_refused_as_a_backend_not_a_typo():
    with pytest.raises(ConfigError, match=r"setting of the Megatron-LM backend, which is not supported here: this "
                                          r"project trains with FSDP") as err:
        TrainerConfig.from_overrides(["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"])
    assert "did you mean" not in str(err.value) and "rollout.tensor_model_parallel_size" not in str(err.value)


def test_a_bad_engine_name_fails_before_the_model_loads(tmp_path):
    from verl.trainer.main_ppo import main

    missing = tmp_path / "no-such-model"  # loading it would fail with another message
    assert main([f"actor_rollout_ref.model.path={missing}", "actor_rollout_ref.rollout.name=sglang"]) == 2


@pytest.mark.parametrize("backend_override, named", [
    ("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=16", "Megatron-LM backend"),
    ("actor@actor_rollout_ref.actor=mlite_actor", "Megatron-Lite backend"),
    ("critic.veomni.fsdp_size=8", "VeOmni backend"),
])
def test_another_backends_launch_is_refused_on_its_backend_whatever_key_comes_first(backend_override, named):
    # A Megatron launch also sets keys of its own optimiser (optim.min_lr): the backend is the reason.
    with pytest.raises(ConfigError, match=named) as err:
        TrainerConfig.from_cli(["actor_rollout_ref.actor.optim.min_lr=1e-7", "trainer.nnodes=1", backend_override])
    assert "min_lr" not in str(err.value) and "did you mean" not in str(err.value)


def test_hydras_own_settings_are_ignored_with_a_warning(caplog):
    with caplog.at_level("WARNING", logger="verl.config"):
        cfg = TrainerConfig.from_cli(["hydra.run.dir=/tmp/outputs", "trainer.total_epochs=2"])
    assert cfg.trainer.total_epochs == 2
    assert any("hydra.run.dir: a setting of Hydra itself" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("name", ["ppo", "PPO", "dapo", "dr_grpo", "Dr-GRPO", "gspo"])
def test_an_algorithm_given_as_the_estimator_names_its_settings_and_they_are_valid(name):
    """Before: 'ppo' got "did you mean grpo?" and 'dapo' "did you mean gdpo?", other algorithms."""
    with pytest.raises(ConfigError, match=rf"^algorithm.adv_estimator='{name}': \S+ ") as err:
        _check(f"algorithm.adv_estimator={name}")
    assert "did you mean" not in str(err.value)
    advice = str(err.value).split(": ", 1)[1].split("; choose")[0]
    named = [word for word in advice.split() if "=" in word and "." in word.split("=")[0]]
    assert named and named[0].startswith("algorithm.adv_estimator=")
    _check(*named)  # the settings it names are a valid config
    TrainerConfig.from_overrides(named).validate()
