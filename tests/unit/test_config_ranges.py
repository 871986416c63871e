"""Every numeric key has its range and every enumerated key its choices, declared once in the schema
(``option(bounds=..., choices=...)``) and checked when the key is set: from the command line, YAML or
Python, before anything runs. verl's own "off" values (-1, 0, null) stay accepted."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest

from verl.config import ConfigError, TrainerConfig
from verl.config.after_training import EvalConfig, GenerationConfig
from verl.config.node import field_specs
from verl.config.offline import DPOTrainerConfig, KTOTrainerConfig, SFTTrainerConfig
from verl.trainer.ppo.ppo_trainer import PPOStepConfig

ROOTS = (TrainerConfig, SFTTrainerConfig, DPOTrainerConfig, KTOTrainerConfig, PPOStepConfig, GenerationConfig,
         EvalConfig)


@pytest.mark.parametrize("override, message", [
    # batch sizes, token budgets, lengths
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0", r"actor\.ppo_micro_batch_size_per_gpu=0 must be >= 1"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size=0", r"actor\.ppo_micro_batch_size=0 must be >= 1"),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=0", r"rollout\.log_prob_micro_batch_size_per_gpu=0 "
                                                                     r"must be >= 1"),
    ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=0", r"ref\.log_prob_max_token_len_per_gpu=0 must be >= 1"),
    ("critic.forward_micro_batch_size=0", r"critic\.forward_micro_batch_size=0 must be >= 1"),
    ("reward_model.micro_batch_size_per_gpu=0", r"reward_model\.micro_batch_size_per_gpu=0 must be >= 1"),
    ("actor_rollout_ref.rollout.max_model_len=0", r"rollout\.max_model_len=0 must be >= 1"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=0", r"tensor_model_parallel_size=0 must be >= 1"),
    ("data.val_batch_size=0", r"data\.val_batch_size=0 must be >= 1"),
    ("reward.max_concurrency=0", r"reward\.max_concurrency=0 must be >= 1"),
    # losses
    ("actor_rollout_ref.actor.clip_ratio_low=-0.2", r"actor\.clip_ratio_low=-0\.2 must be > 0"),
    ("actor_rollout_ref.actor.clip_ratio_c=0.5", r"actor\.clip_ratio_c=0\.5 must be > 1"),
    ("actor_rollout_ref.actor.tau_neg=0", r"actor\.tau_neg=0\.0 must be > 0"),
    ("actor_rollout_ref.actor.policy_loss.kl_cov_ratio=2", r"kl_cov_ratio=2\.0 must be in \(0, 1\]"),
    ("actor_rollout_ref.actor.rollout_is_threshold=-1", r"actor\.rollout_is_threshold=-1\.0 must be > 0"),
    ("algorithm.rollout_correction.rollout_is_threshold=0", r"rollout_correction\.rollout_is_threshold=0\.0 must be > 0"),
    ("critic.cliprange_value=0", r"critic\.cliprange_value=0\.0 must be > 0"),
    ("reward_model.overlong_buffer.penalty_factor=-1", r"overlong_buffer\.penalty_factor=-1\.0 must be >= 0"),
    ("distillation.distillation_loss.loss_max_clamp=0", r"loss_max_clamp=0\.0 must be > 0"),
    # optimiser, sharding, LoRA
    ("actor_rollout_ref.actor.optim.clip_grad=0", r"optim\.clip_grad=0\.0 must be > 0"),
    ("critic.optim.total_training_steps=-2", r"critic\.optim\.total_training_steps=-2 must be >= 0"),
    ("actor_rollout_ref.actor.fsdp_config.fsdp_size=-2", r"fsdp_config\.fsdp_size=-2 must be >= -1"),
    ("actor_rollout_ref.model.lora_rank=-8", r"model\.lora_rank=-8 must be >= 0"),
    ("actor_rollout_ref.model.lora_alpha=0", r"model\.lora_alpha=0 must be > 0"),
    # run control
    ("trainer.seed=-1", r"trainer\.seed=-1 must be in \[0, 4294967295\]"),
    ("data.seed=-1", r"data\.seed=-1 must be in \[0, 4294967295\]"),
    ("trainer.max_actor_ckpt_to_keep=-1", r"trainer\.max_actor_ckpt_to_keep=-1 must be >= 0"),
    ("trainer.critic_warmup=-1", r"trainer\.critic_warmup=-1 must be >= 0"),
    ("trainer.total_training_steps=-5", r"trainer\.total_training_steps=-5 must be >= 0"),
    ("sft_warmstart.eval_every=0", r"sft_warmstart\.eval_every=0 must be >= 1"),
    ("sft_warmstart.target_accuracy=38", r"sft_warmstart\.target_accuracy=38\.0 must be in \[0, 1\]"),
])
def test_rl_values_out_of_range_are_refused_on_the_command_line_naming_key_and_range(override, message):
    with pytest.raises(ConfigError, match=message):
        TrainerConfig.from_cli([override])


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.rollout.dtype=bf16", r"rollout\.dtype='bf16' is not one of auto, bfloat16, float16, half, "
                                             r"float32, float"),
    ("actor_rollout_ref.rollout.dtype=bfloat61", r"did you mean actor_rollout_ref\.rollout\.dtype=bfloat16\?"),
    ("actor_rollout_ref.actor.loss_agg_mode=token_mean", r"loss_agg_mode='token_mean' is not allowed; choose one of "
                                                         r".*; did you mean actor_rollout_ref\.actor\."
                                                         r"loss_agg_mode=token-mean\?"),
    # a Literal that may be null: the choices' error too, not a type mismatch
    ("actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat61", r"model_dtype='bfloat61' is not allowed; choose "
                                                                 r"one of .*; did you mean .*model_dtype=bfloat16\?"),
    ("data.truncation=rigth", r"did you mean data\.truncation=right\?"),
])
def test_enumerated_values_are_refused_with_a_did_you_mean(override, message):
    with pytest.raises(ConfigError, match=message):
        TrainerConfig.from_cli([override])


@pytest.mark.parametrize("root, override, message", [
    (SFTTrainerConfig, "data.micro_batch_size_per_gpu=0", r"data\.micro_batch_size_per_gpu=0 must be >= 1"),
    (SFTTrainerConfig, "data.train_batch_size=0", r"data\.train_batch_size=0 must be >= 1"),
    (SFTTrainerConfig, "data.max_length=1", r"data\.max_length=1 must be >= 2"),
    (SFTTrainerConfig, "optim.lr=0", r"optim\.lr=0\.0 must be > 0"),
    (SFTTrainerConfig, "optim.clip_grad=-1", r"optim\.clip_grad=-1\.0 must be > 0"),
    (SFTTrainerConfig, "trainer.total_epochs=0", r"trainer\.total_epochs=0 must be >= 1"),
    (SFTTrainerConfig, "trainer.dist_timeout_s=0", r"trainer\.dist_timeout_s=0\.0 must be > 0"),
    (SFTTrainerConfig, "trainer.max_ckpt_to_keep=-1", r"trainer\.max_ckpt_to_keep=-1 must be >= 0"),
    (SFTTrainerConfig, "trainer.seed=-3", r"trainer\.seed=-3 must be in \[0, 4294967295\]"),
    (SFTTrainerConfig, "trainer.resume_mode=disabled", r"did you mean trainer\.resume_mode=disable\?"),
    (DPOTrainerConfig, "algorithm.beta=0", r"algorithm\.beta=0\.0 must be > 0"),
    (DPOTrainerConfig, "algorithm.loss_type=sigmiod", r"did you mean algorithm\.loss_type=sigmoid\?"),
    (DPOTrainerConfig, "ref.fsdp_config.fsdp_size=-4", r"ref\.fsdp_config\.fsdp_size=-4 must be >= -1"),
    (KTOTrainerConfig, "algorithm.beta=-0.1", r"algorithm\.beta=-0\.1 must be > 0"),
    (KTOTrainerConfig, "algorithm.undesirable_weight=0", r"algorithm\.undesirable_weight=0\.0 must be > 0"),
])
def test_offline_values_out_of_range_are_refused_on_the_command_line(root, override, message):
    with pytest.raises(ConfigError, match=message):
        root.from_cli([override])


def test_verls_off_values_and_legitimate_signs_stay_accepted():
    cfg = TrainerConfig.from_cli([
        "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.max_actor_ckpt_to_keep=null",
        "trainer.max_critic_ckpt_to_keep=0", "trainer.total_training_steps=null",
        "actor_rollout_ref.actor.optim.total_training_steps=-1",  # verl's "filled in at run time"
        "actor_rollout_ref.actor.optim.lr_warmup_steps=-1", "actor_rollout_ref.actor.fsdp_config.fsdp_size=-1",
        "actor_rollout_ref.rollout.top_k=-1", "actor_rollout_ref.actor.entropy_coeff=-0.001",
        "reward_model.weight=-0.5", "algorithm.filter_groups.max_num_gen_batches=0",  # verl's default
        "actor_rollout_ref.actor.clip_ratio_low=10", "actor_rollout_ref.rollout.dtype=bfloat16",
        "actor_rollout_ref.actor.policy_loss.clip_cov_lb=-1.0",
    ])
    assert cfg.actor_rollout_ref.actor.optim.total_training_steps is None
    cfg.validate()
    SFTTrainerConfig.from_cli(["trainer.save_freq=0", "trainer.test_freq=-1", "trainer.max_ckpt_to_keep=null",
                               "optim.lr_warmup_steps=-1"]).validate()


def test_combinations_that_cannot_work_are_refused_by_validate():
    cfg = TrainerConfig.from_cli(["actor_rollout_ref.ref.fsdp_config.fsdp_size=0"])
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.ref\.fsdp_config\.fsdp_size=0 is not a number of "
                                          r"ranks: use -1"):
        cfg.validate()
    cfg = TrainerConfig.from_cli(["actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov",
                                  "actor_rollout_ref.actor.policy_loss.clip_cov_lb=5",
                                  "actor_rollout_ref.actor.policy_loss.clip_cov_ub=1"])
    with pytest.raises(ConfigError, match=r"policy_loss\.clip_cov_lb=5\.0 must be below clip_cov_ub=1\.0"):
        cfg.validate()
    with pytest.raises(ConfigError, match=r"model\.fsdp_config\.fsdp_size=0 is not a number of ranks"):
        DPOTrainerConfig.from_cli(["model.fsdp_config.fsdp_size=0"]).validate()
    with pytest.raises(ConfigError, match=r"algorithm\.filter_groups\.max_num_gen_batches=0 must be >= 1"):
        TrainerConfig.from_cli(["algorithm.filter_groups.enable=true",
                                "algorithm.filter_groups.max_num_gen_batches=0"]).validate()


def test_ranges_are_checked_from_yaml_and_python_too(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("actor_rollout_ref:\n  actor:\n    ppo_micro_batch_size_per_gpu: 0\n")
    with pytest.raises(ConfigError, match=r"ppo_micro_batch_size_per_gpu=0 must be >= 1"):
        TrainerConfig.from_cli(["--config-file", str(path)])
    cfg = SFTTrainerConfig()
    with pytest.raises(ConfigError, match=r"trainer\.total_epochs=0 must be >= 1"):
        cfg.trainer.total_epochs = 0
    assert "Range: > 0." in KTOTrainerConfig.describe("algorithm.desirable_weight")
    assert "One of: auto, bfloat16" in TrainerConfig.describe("actor_rollout_ref.rollout.dtype")


# Numeric keys that take every value of their type, each with why. A new int/float key must declare
# its range (option(bounds=...)) or be added here with its reason.
NO_RANGE = {
    TrainerConfig: {
        # negative = use lr_warmup_steps_ratio instead (verl's default -1; any negative value works)
        "actor_rollout_ref.actor.optim.lr_warmup_steps", "critic.optim.lr_warmup_steps",
        # negative = entropy minimisation, a published use (loss - coeff x entropy)
        "actor_rollout_ref.actor.entropy_coeff",
        # covariance bounds: any real; validate() checks lb < ub for loss_mode=clip_cov
        "actor_rollout_ref.actor.policy_loss.clip_cov_lb", "actor_rollout_ref.actor.policy_loss.clip_cov_ub",
        # a negative weight makes the reward model's score a penalty
        "reward_model.weight",
        # every value works: <= 0 (verl: -1) = off; rollout.test_freq becomes trainer.test_freq
        "trainer.save_freq", "trainer.test_freq", "rollout.test_freq",
    },
    **{root: {"optim.lr_warmup_steps", "trainer.save_freq", "trainer.test_freq"}  # as above
       for root in (SFTTrainerConfig, DPOTrainerConfig, KTOTrainerConfig)},
    PPOStepConfig: set(),
    GenerationConfig: set(),
    EvalConfig: {"pass_score"},  # any real: scorers score 1 / -1 (DAPO), 0..1, or on scales of their own
}


def _is_numeric(tp) -> bool:
    members = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    return any(m in (int, float) for m in members)


def _governed_by_a_verl_rule(cls, name: str) -> bool:
    """verl keys that have no effect here (any value is ignored) or whose other values are refused
    (verl.config.compat): the rule is the key's domain."""
    rule = next(f for f in dataclasses.fields(cls) if f.name == name).metadata.get("verl_rule")
    return rule is not None and (rule.inert or rule.refuse_if is not None)


def _numeric_keys_without_range(cls, prefix=""):
    for spec in field_specs(cls).values():
        key = prefix + spec.name
        if spec.node_type is not None:
            yield from _numeric_keys_without_range(spec.node_type, key + ".")
        elif _is_numeric(spec.type) and spec.bounds is None and not _governed_by_a_verl_rule(cls, spec.name):
            yield key


@pytest.mark.parametrize("root", ROOTS, ids=lambda r: r.__name__)
def test_every_numeric_key_declares_its_range_or_is_listed_with_a_reason(root):
    assert set(_numeric_keys_without_range(root)) == NO_RANGE[root]


@pytest.mark.parametrize("root", ROOTS, ids=lambda root: root.__name__)
def test_defaults_lie_in_their_ranges(root):
    defaults = root().to_dict()
    assert root.from_dict(defaults).to_dict() == defaults  # every value set again, checked against its range


@pytest.mark.parametrize("root, key", [(TrainerConfig, "actor_rollout_ref.model"), (SFTTrainerConfig, "model"),
                                       (DPOTrainerConfig, "model"), (KTOTrainerConfig, "model")])
def test_chat_template_is_another_name_of_custom_chat_template(root, key, tmp_path):
    cfg = root.from_cli([f"{key}.chat_template=templates/chat.jinja"])
    assert cfg.get(f"{key}.custom_chat_template") == "templates/chat.jinja"
    path = tmp_path / "run.yaml"
    text = "{% for m in messages %}{{ m.content }}{% endfor %}"
    nested = key.split(".")
    path.write_text("".join(f"{'  ' * i}{part}:\n" for i, part in enumerate(nested))
                    + f"{'  ' * len(nested)}chat_template: '{text}'\n")
    assert root.from_cli(["--config-file", str(path)]).get(f"{key}.custom_chat_template") == text
    cfg = root()
    cfg.get(key).chat_template = text
    assert cfg.get(f"{key}.custom_chat_template") == text
    assert "Also spelled chat_template" in root.describe(f"{key}.chat_template")


@pytest.mark.parametrize("setting, message", [
    # Before: 0 epochs made no update and 0 rows per mini-batch meant the whole batch, both without a
    # word; -1 rows failed inside torch.split; a negative KL weight rewarded moving away from the reference.
    (dict(ppo_epochs=0), r"^ppo_epochs=0 must be >= 1$"),
    (dict(mini_batch_size=0), r"^mini_batch_size=0 must be >= 1$"),
    (dict(mini_batch_size=-1), r"^mini_batch_size=-1 must be >= 1$"),
    (dict(kl_coef=-0.1), r"^kl_coef=-0.1 must be >= 0$"),
    (dict(kl_penalty="k4"), r"^kl_penalty='k4' is not one of kl, k1, abs, mse, k2, low_var_kl, k3"),
])
def test_ppo_trainer_step_settings_out_of_range_are_refused_when_the_trainer_is_made(setting, message):
    with pytest.raises(ConfigError, match=message):
        PPOStepConfig(**setting)
    assert PPOStepConfig(mini_batch_size=None, kl_coef=0.0, kl_penalty="k3").mini_batch_size is None
