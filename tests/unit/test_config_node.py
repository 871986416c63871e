"""ConfigNode mechanism: construction, validated assignment, hints, aliases, copies."""

import copy
import pickle
import re

import pytest

from verl.config import ConfigError, ConfigNode, OptimConfig, RolloutConfig, TrainerConfig
from verl.config.node import field_specs


def test_nested_dict_construction_keeps_defaults_for_unspecified_fields():
    cfg = TrainerConfig(actor_rollout_ref=dict(model=dict(path="x"), rollout=dict(name="dummy")),
                        data=dict(train_batch_size=2))
    assert cfg.actor_rollout_ref.model.path == "x"
    assert cfg.actor_rollout_ref.rollout.name == "dummy"
    assert cfg.actor_rollout_ref.rollout.temperature == 1.0
    assert cfg.data.train_batch_size == 2
    assert cfg.data.max_prompt_length == 512
    assert cfg.critic.optim.lr == 1e-5 and cfg.actor_rollout_ref.actor.optim.lr == 1e-6


def test_mutable_defaults_are_not_shared_between_instances():
    a, b = TrainerConfig(), TrainerConfig()
    a.trainer.logger.append("wandb")
    a.data.chat_template_kwargs["x"] = 1
    assert b.trainer.logger == ["console"] and b.data.chat_template_kwargs == {}


def test_assigning_a_dict_to_a_section_builds_a_fresh_node_of_defaults_plus_keys():
    cfg = TrainerConfig()
    cfg.actor_rollout_ref.rollout.temperature = 0.5
    cfg.actor_rollout_ref.rollout = dict(name="vllm", tensor_model_parallel_size=1)
    rollout = cfg.actor_rollout_ref.rollout
    assert isinstance(rollout, RolloutConfig)
    assert rollout.name == "vllm" and rollout.temperature == 1.0
    with pytest.raises(ConfigError, match="actor_rollout_ref.rollout.temperature expects float"):
        rollout.temperature = "hot"


def test_a_value_given_for_a_section_is_refused_with_the_sections_first_keys_as_the_example():
    # e.g. mixed_precision="bf16" (accelerate's spelling): the example shows what the section takes.
    key = "actor_rollout_ref.actor.fsdp_config.mixed_precision"
    expected = (f"{key} expects MixedPrecisionConfig, got 'bf16' (str); e.g. {key}={{param_dtype: auto, "
                f"reduce_dtype: fp32, buffer_dtype: fp32}}")
    cfg = TrainerConfig()
    with pytest.raises(ConfigError, match=f"^{re.escape(expected)}$"):
        cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision = "bf16"
    with pytest.raises(ConfigError, match=f"^{re.escape(expected)}$"):
        TrainerConfig.from_overrides([f"{key}=bf16"])
    with pytest.raises(ConfigError, match=r"^data expects DataConfig, got 3 \(int\); e.g. data=\{builtin_task: addition, "
                                          r"prompt_key: prompt, reward_fn_key: data_source, \.\.\.\}$"):
        TrainerConfig(data=3)


def test_deep_attribute_assignment_is_validated_with_the_full_dotted_key():
    cfg = TrainerConfig()
    cfg.actor_rollout_ref.actor.fsdp_config.fsdp_size = 8
    assert cfg.actor_rollout_ref.actor.fsdp_config.fsdp_size == 8
    with pytest.raises(ConfigError) as err:
        cfg.actor_rollout_ref.actor.fsdp_config.fsdp_size = "eight"
    msg = str(err.value)
    assert "actor_rollout_ref.actor.fsdp_config.fsdp_size" in msg and "int" in msg and "'eight'" in msg
    assert isinstance(err.value, ValueError)


def test_int_is_accepted_for_float_but_float_is_rejected_for_int():
    cfg = TrainerConfig()
    cfg.actor_rollout_ref.actor.optim.lr = 1
    assert cfg.actor_rollout_ref.actor.optim.lr == 1.0 and isinstance(cfg.actor_rollout_ref.actor.optim.lr, float)
    with pytest.raises(ConfigError, match="trainer.total_epochs expects int, got 2.5"):
        cfg.trainer.total_epochs = 2.5
    with pytest.raises(ConfigError, match="expects bool"):
        cfg.data.shuffle = "yes"  # Python values are not parsed; only text (CLI, YAML) is


def test_optional_list_and_union_fields():
    cfg = TrainerConfig()
    cfg.data.train_files = "a.parquet"
    assert cfg.data.train_files == "a.parquet"  # a str stays a str; callers normalise
    cfg.data.train_files = ("a.parquet", "b.parquet")
    assert cfg.data.train_files == ["a.parquet", "b.parquet"]
    cfg.data.train_files = None
    cfg.actor_rollout_ref.actor.optim.betas = [0.9, 1]
    assert cfg.actor_rollout_ref.actor.optim.betas == [0.9, 1.0]
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.actor.optim.betas\[1\] expects float"):
        cfg.actor_rollout_ref.actor.optim.betas = [0.9, "x"]
    with pytest.raises(ConfigError, match="trainer.logger expects str | list"):
        cfg.trainer.logger = 3


def test_free_form_dict_fields_take_any_keys():
    cfg = TrainerConfig(actor_rollout_ref=dict(model=dict(override_config=dict(a=1, b=dict(c=[2])))))
    assert cfg.actor_rollout_ref.model.override_config == {"a": 1, "b": {"c": [2]}}
    cfg.set("actor_rollout_ref.model.override_config.b.d", 3)
    assert cfg.get("actor_rollout_ref.model.override_config.b") == {"c": [2], "d": 3}


def test_literal_choices_are_listed_on_a_wrong_choice():
    cfg = TrainerConfig()
    cfg.data.truncation = "left"
    with pytest.raises(ConfigError) as err:
        cfg.data.truncation = "center"
    assert "data.truncation='center'" in str(err.value)
    assert "'error', 'left', 'right', 'middle'" in str(err.value)
    with pytest.raises(ConfigError, match="'float32', 'fp32', 'bfloat16'"):
        TrainerConfig(actor_rollout_ref=dict(model=dict(dtype="float64")))


def test_unknown_attribute_suggests_a_sibling():
    cfg = TrainerConfig()
    with pytest.raises(ConfigError, match=r"'trainer.totl_epochs'; did you mean trainer.total_epochs\?"):
        cfg.trainer.totl_epochs = 3


def test_unknown_attribute_without_close_sibling_names_namesakes_in_other_sections():
    cfg = TrainerConfig()
    # Not "did you mean": a key of another section is another setting. Listed as such, after the valid keys.
    with pytest.raises(ConfigError, match=r"valid keys under trainer: .*Keys named 'lr' in other sections: "
                                          r"actor_rollout_ref.actor.optim.lr"):
        cfg.trainer.lr = 1e-5
    with pytest.raises(ConfigError, match=r"did you mean actor_rollout_ref.actor.optim.lr\?"):
        cfg.set("actor.optim.lr", 1e-5)  # a missing prefix is found by suffix


def test_unknown_key_in_nested_constructor_dict_names_the_full_key():
    with pytest.raises(ConfigError, match=r"'actor_rollout_ref.rollout.temprature'; did you mean "
                                          r"actor_rollout_ref.rollout.temperature\?"):
        TrainerConfig(actor_rollout_ref=dict(rollout=dict(temprature=0.7)))


def test_unknown_key_with_no_close_match_lists_the_valid_keys():
    with pytest.raises(ConfigError, match="valid keys under custom_reward_function: path, name"):
        TrainerConfig(custom_reward_function=dict(zzzzzzzz=1))


def test_reading_an_unknown_attribute_is_an_attribute_error_with_a_hint():
    cfg = TrainerConfig()
    with pytest.raises(AttributeError, match="did you mean data.max_prompt_length"):
        _ = cfg.data.max_prompt_lenght
    assert getattr(cfg.data, "nope", "fallback") == "fallback"


def test_positional_arguments_are_rejected():
    with pytest.raises(ConfigError, match="keyword arguments only"):
        OptimConfig(1e-5)


def test_aliases_read_and_write_the_canonical_field():
    cfg = TrainerConfig(data=dict(batch_size=4), trainer=dict(max_steps=7))
    assert cfg.data.train_batch_size == 4 and cfg.data.batch_size == 4
    assert cfg.trainer.total_training_steps == 7
    cfg.data.batch_size = 8
    assert cfg.data.train_batch_size == 8
    cfg.set("trainer.max_steps", 9)
    assert cfg.get("trainer.total_training_steps") == 9 and cfg.get("trainer.max_steps") == 9
    assert "batch_size" not in cfg.to_dict()["data"] and cfg.to_dict()["data"]["train_batch_size"] == 8
    assert "max_steps" not in cfg.to_dict()["trainer"]


def test_giving_an_alias_and_its_canonical_name_together_is_an_error():
    with pytest.raises(ConfigError, match="data.batch_size and data.train_batch_size name the same key"):
        TrainerConfig(data=dict(batch_size=4, train_batch_size=8))
    # Merging into a config is held to the same rule (it used to apply both, the last one winning).
    cfg = TrainerConfig()
    with pytest.raises(ConfigError, match="data.batch_size and data.train_batch_size name the same key"):
        cfg.update({"data": {"batch_size": 4, "train_batch_size": 8}})
    with pytest.raises(ConfigError, match="critic.fsdp and critic.fsdp_config name the same key"):
        TrainerConfig.from_dict({"critic": {"fsdp": {}, "fsdp_config": {}}}, base=cfg)


def test_assigned_free_node_is_adopted_and_node_from_another_tree_is_copied():
    cfg = TrainerConfig()
    optim = OptimConfig(lr=3e-6)
    cfg.actor_rollout_ref.actor.optim = optim
    assert cfg.actor_rollout_ref.actor.optim is optim
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.optim.lr expects float"):
        optim.lr = "fast"  # errors name the key in its new tree
    cfg.critic.optim = cfg.actor_rollout_ref.actor.optim
    assert cfg.critic.optim == optim and cfg.critic.optim is not optim
    cfg.critic.optim.lr = 1.0
    assert optim.lr == 3e-6


def test_a_section_given_as_a_dict_keeps_its_fields_defaults_for_the_keys_left_out():
    # The critic's optimiser defaults to lr=1e-5 (OptimConfig's own is 1e-6): naming another of its keys
    # in Python keeps it, as the command line always did. It used to fall back to OptimConfig's 1e-6.
    given = dict(optim=dict(weight_decay=0.1))
    assert TrainerConfig(critic=given).critic.optim.lr == 1e-5
    assert TrainerConfig.from_overrides(["critic.optim.weight_decay=0.1"]).critic.optim.lr == 1e-5
    cfg = TrainerConfig()
    cfg.critic = given
    assert (cfg.critic.optim.lr, cfg.critic.optim.weight_decay) == (1e-5, 0.1)
    cfg.critic.optim = dict(weight_decay=0.2)
    assert (cfg.critic.optim.lr, cfg.critic.optim.weight_decay) == (1e-5, 0.2)


def test_copy_equality_and_pickle():
    cfg = TrainerConfig(data=dict(train_batch_size=2))
    twin = cfg.copy()
    assert twin == cfg and twin is not cfg
    twin.data.train_batch_size = 4
    assert twin != cfg
    assert copy.deepcopy(cfg) == cfg and copy.copy(cfg) == cfg
    restored = pickle.loads(pickle.dumps(cfg))
    assert restored == cfg
    with pytest.raises(ConfigError, match="data.train_batch_size expects int"):
        restored.data.train_batch_size = "x"


def test_get_and_set_by_dotted_key():
    cfg = TrainerConfig()
    cfg.set("actor_rollout_ref.rollout.n", 8)
    assert cfg.actor_rollout_ref.rollout.n == 8 and cfg.get("actor_rollout_ref.rollout.n") == 8
    with pytest.raises(ConfigError, match="trainer.total_epochs is a value, not a section"):
        cfg.set("trainer.total_epochs.x", 1)
    with pytest.raises(ConfigError, match="did you mean actor_rollout_ref.rollout"):
        cfg.get("actor_rollout_ref.rolout.n")


def test_from_dict_with_base_merges_and_update_merges_deeply():
    base = TrainerConfig(data=dict(train_batch_size=2, max_prompt_length=64))
    cfg = TrainerConfig.from_dict({"data": {"max_response_length": 16}}, base=base)
    assert (cfg.data.train_batch_size, cfg.data.max_prompt_length, cfg.data.max_response_length) == (2, 64, 16)
    assert base.data.max_response_length == 512
    cfg.update({"actor_rollout_ref": {"rollout": {"n": 4}}})
    assert cfg.actor_rollout_ref.rollout.n == 4 and cfg.actor_rollout_ref.rollout.name == "auto"


def test_every_key_is_documented_and_describe_returns_its_help():
    for spec in _all_specs(TrainerConfig):
        assert len(spec.help) > 5, spec.name
    assert TrainerConfig.describe("actor_rollout_ref.actor.optim.lr") == "Peak learning rate. Range: > 0."
    assert TrainerConfig.describe("data.batch_size") == TrainerConfig.describe("data.train_batch_size")
    assert TrainerConfig.describe("critic.fsdp") == TrainerConfig.describe("critic.fsdp_config")  # section(aliases=)
    # describe() walks keys as overrides do (omega.locate): the same errors, under canonical names
    for key, message in [("trainer.total_epochs.x", "trainer.total_epochs is a value, not a section, so it has no "
                          "key 'x'; set it with trainer.total_epochs=..."),
                         ("actor_rollout_ref.model.override_config.x", "actor_rollout_ref.model.override_config is a "
                          "value, not a section, so it has no key 'x'"),
                         ("critic.fsdp.nope", "unknown config key 'critic.fsdp_config.nope'")]:
        with pytest.raises(ConfigError) as raised:
            TrainerConfig.describe(key)
        assert message in str(raised.value)
        with pytest.raises(ConfigError) as by_override:
            TrainerConfig.from_overrides([f"{key}=1"])
        assert str(by_override.value) == str(raised.value) or key.startswith("actor_rollout_ref.model")
    with pytest.raises(ConfigError, match="did you mean trainer.total_epochs"):
        TrainerConfig.describe("trainer.total_epoch")


def test_format_help_lists_every_dotted_key_with_type_and_default():
    text = TrainerConfig.format_help()
    assert "actor_rollout_ref.actor.optim.lr: float = 1.0e-06\n    Peak learning rate. Range: > 0." in text
    for key in _canonical_keys(TrainerConfig):
        assert f"\n{key}:" in "\n" + text, key


def test_a_field_without_help_is_a_schema_error():
    from dataclasses import dataclass

    @dataclass
    class Undocumented(ConfigNode):
        x: int = 1

    with pytest.raises(TypeError, match="Undocumented.x needs help text"):
        Undocumented()


def _canonical_keys(cls, prefix=""):
    for spec in field_specs(cls).values():
        yield prefix + spec.name
        if spec.node_type is not None:
            yield from _canonical_keys(spec.node_type, f"{prefix}{spec.name}.")


def _all_specs(cls):
    for spec in field_specs(cls).values():
        yield spec
        if spec.node_type is not None:
            yield from _all_specs(spec.node_type)


def test_linked_rollout_lengths_follow_the_data_section_like_verls_oc_select():
    cfg = TrainerConfig(data=dict(max_prompt_length=100, max_response_length=30))
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.prompt_length, rollout.response_length) == (100, 30)
    cfg.data.max_response_length = 7  # a later change is followed, as an interpolation would be
    assert rollout.response_length == 7
    assert cfg.get("actor_rollout_ref.rollout.response_length") == 7
    # Outside a TrainerConfig (a copy is detached) the fallback, verl's 512, applies.
    assert RolloutConfig().prompt_length == 512
    assert cfg.actor_rollout_ref.copy().rollout.response_length == 512
    # Written out as null, so a file read back still follows data.*; an explicit value is kept.
    assert "response_length: null" in cfg.to_yaml()
    again = TrainerConfig.from_yaml(cfg.to_yaml())
    again.data.max_response_length = 11
    assert again.actor_rollout_ref.rollout.response_length == 11
    cfg.actor_rollout_ref.rollout.response_length = 5
    assert cfg.actor_rollout_ref.rollout.response_length == 5 and cfg.data.max_response_length == 7
    with pytest.raises(ConfigError, match="rollout.response_length=5 differs from data.max_response_length=7"):
        cfg.validate()


def test_get_with_a_default_reads_like_omegaconfs_get():
    cfg = TrainerConfig(data=dict(train_batch_size=8))
    assert cfg.data.get("train_batch_size", 1) == 8
    assert cfg.data.get("image_key_that_is_not_here", "images") == "images"
    assert cfg.get("data.chat_template_kwargs.enable_thinking", False) is False
    with pytest.raises(ConfigError, match="did you mean data.train_batch_size"):
        cfg.get("data.train_batch_sise")


def test_a_dotted_key_given_in_python_says_how_to_nest_it_not_did_you_mean_itself():
    """Before: "unknown config key 'actor_rollout_ref.model.path'; did you mean actor_rollout_ref.model.path?"."""
    from verl.config import TrainerConfig

    with pytest.raises(ConfigError, match=r"^'actor_rollout_ref\.model\.path' is a dotted key, the command line's "
                                          r"form: in Python nest it, actor_rollout_ref=dict\(model=dict\(path=\.\.\.\)\) "
                                          r"in TrainerConfig\(\.\.\.\), or set it with config\.set\("):
        TrainerConfig(**{"actor_rollout_ref.model.path": "Qwen/Qwen2-0.5B"})
    config = TrainerConfig()
    with pytest.raises(ConfigError, match=r"^'model\.path' is a dotted key.*model=dict\(path=\.\.\.\) in the "
                                          r"actor_rollout_ref section"):
        config.update({"actor_rollout_ref": {"model.path": "Qwen/Qwen2-0.5B"}})
    config.set("actor_rollout_ref.model.path", "Qwen/Qwen2-0.5B")  # the way it names
    assert config.actor_rollout_ref.model.path == "Qwen/Qwen2-0.5B"


def test_a_pathlib_path_is_taken_for_a_path_setting_as_its_text():
    """Before: "actor_rollout_ref.model.path expects str | None, got PosixPath('models/qwen')", while
    load_hf_model took the same Path."""
    from pathlib import Path

    from verl.config import TrainerConfig

    config = TrainerConfig(actor_rollout_ref=dict(model=dict(path=Path("models/qwen"))),
                           data=dict(train_files=[Path("a.parquet"), Path("b.parquet")]),
                           trainer=dict(default_local_dir=Path("outputs/run")))
    assert config.actor_rollout_ref.model.path == "models/qwen"
    assert config.data.train_files == ["a.parquet", "b.parquet"]
    assert config.trainer.default_local_dir == "outputs/run"
    with pytest.raises(ConfigError, match=r"trainer\.total_epochs expects int, got PosixPath"):
        TrainerConfig(trainer=dict(total_epochs=Path("3")))  # only where text is taken


def test_an_omegaconf_config_with_lists_builds_the_config_its_plain_dict_does():
    """Before: TrainerConfig(**OmegaConf.create(...)) refused every list in it, "trainer.logger expects
    str | list[str], got ['console'] (ListConfig)", and a dict setting kept OmegaConf nodes inside."""
    from omegaconf import OmegaConf

    from verl.config.offline import SFTTrainerConfig

    plain = dict(trainer=dict(logger=["console", "tensorboard"]), data=dict(train_files=["a.parquet", "b.parquet"]),
                 actor_rollout_ref=dict(model=dict(override_config=dict(rope_scaling=dict(factor=[2, 4])))))
    omega = OmegaConf.create(plain)
    assert TrainerConfig(**omega) == TrainerConfig.from_dict(omega) == TrainerConfig(**plain)
    assert type(TrainerConfig(**omega).actor_rollout_ref.model.override_config["rope_scaling"]["factor"]) is list
    config = TrainerConfig()
    config.trainer.logger = OmegaConf.create(["wandb"])
    assert config.trainer.logger == ["wandb"]
    sft = dict(trainer=dict(logger=[]), data=dict(train_files=["a.jsonl"]))
    assert SFTTrainerConfig(**OmegaConf.create(sft)) == SFTTrainerConfig(**sft)


def test_a_torch_dtype_or_device_is_taken_for_a_dtype_or_device_setting_as_its_name():
    """load_hf_model takes torch_dtype=torch.bfloat16; before, the same value in the config was refused
    ("model.dtype=torch.bfloat16 is not allowed"), and rollout.device=torch.device("cpu") too."""
    import torch

    given = TrainerConfig(actor_rollout_ref=dict(
        model=dict(dtype=torch.bfloat16), rollout=dict(dtype=torch.float16, device=torch.device("cpu")),
        actor=dict(fsdp_config=dict(mixed_precision=dict(param_dtype=torch.bfloat16)))),
        trainer=dict(device=torch.device("cpu")))
    text = TrainerConfig(actor_rollout_ref=dict(
        model=dict(dtype="bfloat16"), rollout=dict(dtype="float16", device="cpu"),
        actor=dict(fsdp_config=dict(mixed_precision=dict(param_dtype="bfloat16")))), trainer=dict(device="cpu"))
    assert given == text
    with pytest.raises(ConfigError, match=r"model\.dtype='int8' is not allowed; choose one of 'float32'"):
        TrainerConfig(actor_rollout_ref=dict(model=dict(dtype=torch.int8)))
    with pytest.raises(ConfigError, match=r"trainer\.total_epochs expects int, got torch\.float32 \(dtype\)"):
        TrainerConfig(trainer=dict(total_epochs=torch.float32))
