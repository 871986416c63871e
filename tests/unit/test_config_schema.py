"""TrainerConfig: batch-size arithmetic, validation messages, and the committed default YAML."""

from pathlib import Path

import pytest

import verl.config
from verl.config import ConfigError, TrainerConfig, render_default_yaml

DEFAULT_YAML = Path(verl.config.__file__).parent / "ppo_trainer.yaml"


def _valid(**sections):
    """A config that passes validate(): GRPO with 4 samples per prompt, plus `sections`."""
    cfg = TrainerConfig(actor_rollout_ref=dict(rollout=dict(n=4)))
    cfg.update(sections)
    return cfg


def test_committed_default_yaml_equals_the_generated_one():
    # Regenerate with: python -m verl.config > verl/config/ppo_trainer.yaml
    assert DEFAULT_YAML.read_text(encoding="utf-8") == render_default_yaml()


def test_committed_key_reference_equals_the_generated_one_and_the_help_text():
    from pathlib import Path

    from verl.config.schema import render_reference

    # Regenerate with: python -m verl.config reference > docs/config_reference.md
    reference = Path(__file__).resolve().parents[2] / "docs" / "config_reference.md"
    assert reference.read_text(encoding="utf-8") == render_reference()
    assert TrainerConfig.format_help() in render_reference()


def test_default_yaml_loads_back_to_the_defaults_and_carries_help_comments():
    assert TrainerConfig.from_yaml(DEFAULT_YAML) == TrainerConfig()
    assert "      # Peak learning rate. Range: > 0.\n      lr: 1.0e-06\n" in render_default_yaml()


def test_valid_config_passes_and_derived_sizes_carry_units():
    cfg = _valid(data=dict(train_batch_size=32), actor_rollout_ref=dict(actor=dict(
        ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=4)))
    cfg.validate()
    sizes = cfg.derived_sizes()
    assert sizes["samples_per_step"] == 128
    assert sizes["samples_per_mini_batch"] == 32
    assert sizes["mini_batches_per_step"] == 4
    assert sizes["micro_batches_per_mini_batch"] == 8
    assert cfg.derived_sizes(dp_size=2)["micro_batches_per_mini_batch"] == 4


def test_null_micro_batch_means_the_whole_mini_batch():
    sizes = _valid().derived_sizes()
    assert sizes["samples_per_micro_batch"] == sizes["samples_per_mini_batch"] == 64
    assert sizes["micro_batches_per_mini_batch"] == 1


def test_mini_batch_must_divide_the_step_and_the_message_shows_the_arithmetic():
    cfg = _valid(actor_rollout_ref=dict(actor=dict(ppo_mini_batch_size=12)))
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    assert str(err.value) == (
        "data.train_batch_size=32 is not divisible by actor_rollout_ref.actor.ppo_mini_batch_size=12 "
        "(32 / 12 = 2.67); choose a mini-batch size that divides it, e.g. 8 or 16")


def test_seq_len_is_a_ceiling_on_prompt_plus_response():
    # The tutorial's TrainerConfig sets data.seq_len=64 and builds a worker: that needs no RL checks.
    cfg = TrainerConfig(data=dict(batch_size=2, seq_len=64))
    assert cfg.data.seq_len == 64
    with pytest.raises(ConfigError) as err:
        _valid(data=dict(seq_len=64, max_prompt_length=48, max_response_length=32)).validate()
    assert str(err.value) == (
        "data.seq_len=64 is the most tokens a sample may hold, but data.max_prompt_length=48 + "
        "data.max_response_length=32 = 80: lower those two so that they sum to at most 64, or raise "
        "data.seq_len (null = no ceiling)")
    _valid(data=dict(seq_len=80, max_prompt_length=48, max_response_length=32)).validate()  # fits exactly
    _valid(data=dict(seq_len=None, max_prompt_length=4096, max_response_length=4096)).validate()  # no ceiling
    from verl.trainer.main_ppo import load_config  # the command line: refused before anything loads

    with pytest.raises(ConfigError, match=r"data.seq_len=10 is the most tokens"):
        load_config(["data.seq_len=10", "data.max_prompt_length=8", "data.max_response_length=8"]).validate()


def test_micro_batch_must_divide_the_mini_batch_in_samples():
    cfg = _valid(actor_rollout_ref=dict(actor=dict(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=3)))
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    msg = str(err.value)
    assert "ppo_mini_batch_size=4 prompts x actor_rollout_ref.rollout.n=4 = 16 samples" in msg
    assert "not divisible by actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3 (16 / 3 = 5.33)" in msg
    assert msg.endswith("e.g. 2 or 4")


def test_mini_batch_is_split_over_data_parallel_ranks_before_micro_batching():
    cfg = _valid(actor_rollout_ref=dict(actor=dict(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=16)))
    cfg.validate(dp_size=1)
    with pytest.raises(ConfigError, match=r"\(8 per rank over 2 ranks\) is not divisible by .*=16"):
        cfg.validate(dp_size=2)
    with pytest.raises(ConfigError, match="cannot be split evenly over 3 data-parallel ranks"):
        cfg.validate(dp_size=3)
    cfg.trainer.n_gpus_per_node = 2
    with pytest.raises(ConfigError, match="8 per rank over 2 ranks"):
        cfg.validate()


def test_critic_sizes_resolve_to_the_actors_and_are_checked_only_when_a_critic_is_used():
    cfg = _valid(critic=dict(ppo_mini_batch_size=12))
    cfg.validate()  # GRPO: no critic
    assert not cfg.critic_enabled()
    cfg.algorithm.adv_estimator = "gae"
    assert cfg.critic_enabled()
    with pytest.raises(ConfigError, match=r"by critic.ppo_mini_batch_size=12 \(32 / 12 = 2.67\)"):
        cfg.validate()
    cfg.critic.ppo_mini_batch_size = None
    cfg.critic.ppo_micro_batch_size_per_gpu = 48
    with pytest.raises(ConfigError, match="the critic mini-batch of actor_rollout_ref.actor.ppo_mini_batch_size=16"):
        cfg.validate()
    cfg.critic.ppo_micro_batch_size_per_gpu = 8
    cfg.validate()
    assert cfg.derived_sizes(role="critic")["micro_batches_per_mini_batch"] == 8
    cfg.algorithm.adv_estimator = "reinforce_plus_plus"  # gae without its critic is refused
    cfg.critic.enable = False
    cfg.critic.ppo_micro_batch_size_per_gpu = 48
    cfg.validate()


def test_group_baseline_estimators_need_several_samples_per_prompt():
    cfg = TrainerConfig()
    cfg.validate()  # the defaults (grpo, rollout.n=8) are consistent
    cfg.actor_rollout_ref.rollout.n = 1
    with pytest.raises(ConfigError, match="GRPO compares several responses per prompt; set "
                                          "actor_rollout_ref.rollout.n to 4 or more"):
        cfg.validate()
    cfg.algorithm.adv_estimator = "rloo"
    with pytest.raises(ConfigError, match="rloo compares several responses"):
        cfg.validate()
    cfg.algorithm.adv_estimator = "reinforce_plus_plus"
    cfg.validate()


@pytest.mark.parametrize("key, value, message", [
    ("data.train_batch_size", 0, "data.train_batch_size=0 must be >= 1"),
    ("actor_rollout_ref.rollout.n", 0, "actor_rollout_ref.rollout.n=0 must be >= 1"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 0, "ppo_micro_batch_size_per_gpu=0 must be >= 1"),
    ("actor_rollout_ref.actor.ppo_epochs", 0, "actor_rollout_ref.actor.ppo_epochs=0 must be >= 1"),
    ("actor_rollout_ref.actor.clip_ratio", 0.0, "clip_ratio=0.0 must be > 0"),
    ("actor_rollout_ref.actor.clip_ratio_high", -0.1, "clip_ratio_high=-0.1 must be > 0"),
    ("actor_rollout_ref.actor.clip_ratio_c", 1.0, "clip_ratio_c=1.0 must be > 1"),
])
def test_out_of_range_values_are_rejected(key, value, message):
    cfg = _valid()
    with pytest.raises(ConfigError, match=message):  # when set (a range of the schema) or by validate()
        cfg.set(key, value)
        cfg.validate()


def test_committed_verl_key_tables_equal_the_generated_ones():
    from verl.config.verl_keys_doc import render_verl_keys

    # Regenerate with: python -m verl.config verl-keys > docs/config_verl_keys.md
    tables = Path(__file__).resolve().parents[2] / "docs" / "config_verl_keys.md"
    text = render_verl_keys()
    assert tables.read_text() == text
    # Both kinds are there, each key with its reason.
    assert "| `model_engine` | for anything but dp |" in text
    assert "| `trainer.ray_wait_register_center_timeout` |  | under trainer.backend=ray, trainer.dist_timeout_s" in text


@pytest.mark.parametrize("override, message", [
    ("trainer.resume_mode=disabled", r"trainer.resume_mode='disabled' is not one of auto, disable, resume_path; "
                                     r"did you mean trainer.resume_mode=disable\?"),
    ("algorithm.kl_penalty=k4", r"algorithm.kl_penalty='k4' is not one of kl, k1, abs, mse, k2, low_var_kl, k3"),
    ("actor_rollout_ref.actor.optim.lr=0", r"actor_rollout_ref.actor.optim.lr=0.0 must be > 0"),
    ("actor_rollout_ref.actor.optim.lr=nan", r"optim.lr=nan must be > 0"),
    ("algorithm.kl_ctrl.kl_coef=-0.1", r"kl_coef=-0.1 must be >= 0"),
    ("data.max_response_length=0", r"data.max_response_length=0 must be >= 1"),
    ("actor_rollout_ref.rollout.top_p=0", r"top_p=0.0 must be in \(0, 1\]"),
    ("algorithm.gamma=1.5", r"algorithm.gamma=1.5 must be in \[0, 1\]"),
])
def test_choices_and_ranges_declared_in_the_schema_are_checked_when_set(override, message):
    with pytest.raises(ConfigError, match=message):
        TrainerConfig.from_cli([override])
    key, value = override.split("=")
    if value in ("disabled", "k4"):
        with pytest.raises(ConfigError, match="is not one of"):  # the Python API checks the same
            TrainerConfig().set(key, value)
    assert "Range:" in TrainerConfig.describe("actor_rollout_ref.actor.optim.lr")
    assert "One of: auto, disable, resume_path." in TrainerConfig.describe("trainer.resume_mode")


def test_the_schemas_kl_names_are_the_implemented_estimators():
    from verl.algorithms import KL_KINDS
    from verl.config.schema_actor import KL_ESTIMATOR_NAMES

    assert set(KL_ESTIMATOR_NAMES) == set(KL_KINDS)
