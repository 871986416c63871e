"""`a.b.c=value` overrides, YAML files and the round-trip guarantees."""

import re

import pytest

from verl.config import ConfigError, TrainerConfig, parse_overrides


def _cfg(*args):
    return TrainerConfig.from_overrides(list(args))


def test_parse_overrides_reads_values_with_hydras_grammar():
    pairs = parse_overrides(["a.b=1e-4", "c=true", "d=null", "e=[console,wandb]", "f='quoted string'",
                             "+g.h={x: 1}", "i=0.5", "j=", "k='a=b'", "l=['console', \"wandb\"]", "m=1_000"])
    assert pairs == [("a.b", 1e-4), ("c", True), ("d", None), ("e", ["console", "wandb"]),
                     ("f", "quoted string"), ("g.h", {"x": 1}), ("i", 0.5), ("j", ""), ("k", "a=b"),
                     ("l", ["console", "wandb"]), ("m", 1000)]


def test_hydra_forms_add_force_add_and_delete():
    cfg = _cfg("++actor_rollout_ref.model.override_config.rope_theta=5e5",
               "++actor_rollout_ref.model.override_config.rope_theta=1e6",
               "+actor_rollout_ref.model.override_config.x.y=1",
               "~actor_rollout_ref.model.override_config.x.y",
               "trainer.total_epochs=5", "~trainer.total_epochs")
    assert cfg.actor_rollout_ref.model.override_config == {"rope_theta": 1e6, "x": {}}
    assert cfg.trainer.total_epochs == TrainerConfig().trainer.total_epochs  # back to the default
    with pytest.raises(ConfigError, match="has no key nope to delete"):
        _cfg("~actor_rollout_ref.model.override_config.nope")


def test_hydra_refusals_name_the_fix():
    with pytest.raises(ConfigError, match=r"is a sweep .*trainer.logger=\[a,b\]"):
        _cfg("trainer.logger=console,wandb")
    with pytest.raises(ConfigError, match=r"could not be parsed .*quote a value"):
        _cfg("custom_reward_function.name=a=b")
    assert _cfg("custom_reward_function.name='a=b'").custom_reward_function.name == "a=b"


def test_config_group_choices_fsdp_accepted_megatron_refused():
    assert _cfg("actor@actor_rollout_ref.actor=dp_actor", "critic@critic=dp_critic") == TrainerConfig()
    with pytest.raises(ConfigError, match="megatron_actor: the Megatron-LM backend is not supported here; .*FSDP"):
        _cfg("actor@actor_rollout_ref.actor=megatron_actor")


def test_config_path_and_name_as_verl_passes_them(tmp_path):
    (tmp_path / "my_run.yaml").write_text("trainer:\n  total_epochs: 7\n")
    cfg = TrainerConfig.from_cli(["--config-path", str(tmp_path), "--config-name=my_run", "data.train_batch_size=8"])
    assert cfg.trainer.total_epochs == 7 and cfg.data.train_batch_size == 8
    # verl's own default config name is this project's default; Megatron's is refused.
    assert TrainerConfig.from_cli(["--config-name=ppo_trainer"]).trainer.total_epochs == TrainerConfig().trainer.total_epochs
    with pytest.raises(ConfigError, match="Megatron backend is not supported"):
        TrainerConfig.from_cli(["--config-path=config", "--config-name=ppo_megatron_trainer.yaml"])
    with pytest.raises(ConfigError, match="no file .*missing.yaml"):
        TrainerConfig.from_cli(["--config-path", str(tmp_path), "--config-name", "missing"])


def test_override_floats_including_scientific_notation():
    cfg = _cfg("actor_rollout_ref.actor.optim.lr=1e-4", "actor_rollout_ref.rollout.temperature=0.7",
               "critic.optim.lr=2", "algorithm.kl_ctrl.kl_coef=1.5E-3")
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-4
    assert cfg.actor_rollout_ref.rollout.temperature == 0.7
    assert cfg.critic.optim.lr == 2.0 and isinstance(cfg.critic.optim.lr, float)
    assert cfg.algorithm.kl_ctrl.kl_coef == 1.5e-3


def test_override_ints_bools_and_null():
    cfg = _cfg("data.train_batch_size=64", "data.shuffle=false", "actor_rollout_ref.actor.use_kl_loss=True",
               "data.val_batch_size=8", "data.val_batch_size=null", "critic.enable=true")
    assert cfg.data.train_batch_size == 64 and cfg.data.shuffle is False
    assert cfg.actor_rollout_ref.actor.use_kl_loss is True
    assert cfg.data.val_batch_size is None and cfg.critic.enable is True


def test_override_lists_and_str_or_list_unions():
    cfg = _cfg("trainer.logger=[console,wandb]", "actor_rollout_ref.actor.optim.betas=[0.9,0.95]",
               "data.train_files=train.parquet", "data.val_files=[a.parquet, b.parquet]")
    assert cfg.trainer.logger == ["console", "wandb"]
    assert cfg.actor_rollout_ref.actor.optim.betas == [0.9, 0.95]
    assert cfg.data.train_files == "train.parquet"
    assert cfg.data.val_files == ["a.parquet", "b.parquet"]
    assert _cfg("trainer.logger=console").trainer.logger == "console"


def test_str_fields_take_the_text_verbatim():
    cfg = _cfg("actor_rollout_ref.model.path=123", "trainer.experiment_name='my run'",
               "custom_reward_function.name=true", "trainer.project_name=007", "trainer.resume_mode=disable",
               "trainer.default_local_dir=/tmp/a b")
    assert cfg.actor_rollout_ref.model.path == "123"
    assert cfg.trainer.experiment_name == "my run"
    assert cfg.custom_reward_function.name == "true"
    assert cfg.trainer.project_name == "007"
    assert cfg.trainer.resume_mode == "disable"
    assert cfg.trainer.default_local_dir == "/tmp/a b"


def test_plus_adds_keys_below_free_form_dicts():
    cfg = _cfg("+actor_rollout_ref.model.override_config.attention_dropout=0.1",
               "+data.chat_template_kwargs.enable_thinking=false",
               "+data.chat_template_kwargs.nested.depth=1e-3")
    assert cfg.actor_rollout_ref.model.override_config == {"attention_dropout": 0.1}
    assert cfg.data.chat_template_kwargs == {"enable_thinking": False, "nested": {"depth": 1e-3}}
    # Without '+', a new dict key is refused with the fix spelled out; an existing one is fine.
    with pytest.raises(ConfigError, match=r"\+data.chat_template_kwargs.foo=<value>"):
        _cfg("data.chat_template_kwargs.foo=1")
    assert _cfg("+data.chat_template_kwargs.foo=1", "data.chat_template_kwargs.foo=2").data.chat_template_kwargs == {"foo": 2}


def test_override_of_a_whole_dict_or_section():
    cfg = _cfg("actor_rollout_ref.model.override_config={a: 1, b: [x]}",
               "actor_rollout_ref.rollout={name: vllm, n: 4}")
    assert cfg.actor_rollout_ref.model.override_config == {"a": 1, "b": ["x"]}
    assert cfg.actor_rollout_ref.rollout.name == "vllm" and cfg.actor_rollout_ref.rollout.n == 4


def test_aliases_work_in_overrides():
    cfg = _cfg("data.batch_size=8", "trainer.max_steps=100")
    assert cfg.data.train_batch_size == 8 and cfg.trainer.total_training_steps == 100


def test_override_errors_are_short_and_name_the_fix():
    with pytest.raises(ConfigError, match=r"has no '='; write key=value, e.g. trainer.total_epochs=3"):
        _cfg("trainer.total_epochs")
    with pytest.raises(ConfigError, match=r"did you mean trainer.total_epochs\?"):
        _cfg("trainer.totl_epochs=3")
    with pytest.raises(ConfigError, match=r"Keys named 'lr' in other sections: actor_rollout_ref.actor.optim.lr"):
        _cfg("trainer.lr=3")
    with pytest.raises(ConfigError, match="data.train_batch_size expects int, got 'many'"):
        _cfg("data.train_batch_size=many")
    with pytest.raises(ConfigError, match="data.truncation='center' is not allowed; choose one of"):
        _cfg("data.truncation=center")
    with pytest.raises(ConfigError, match="without dashes"):
        _cfg("--trainer.total_epochs=3")
    with pytest.raises(ConfigError, match="malformed key"):
        _cfg("trainer..total_epochs=3")


def test_from_overrides_starts_from_a_copy_of_base():
    base = TrainerConfig(data=dict(train_batch_size=4))
    cfg = TrainerConfig.from_overrides(["trainer.total_epochs=3"], base=base)
    assert cfg.data.train_batch_size == 4 and cfg.trainer.total_epochs == 3
    assert base.trainer.total_epochs == 1


def _changed_config():
    cfg = TrainerConfig()
    cfg.data.train_files = ["a.parquet", "b,c.parquet"]
    cfg.data.batch_size = 8
    cfg.data.chat_template_kwargs = {"enable_thinking": False, "x": {"y": 1e-7}}
    cfg.actor_rollout_ref.model.path = "123"
    cfg.actor_rollout_ref.model.dtype = "bf16"
    cfg.actor_rollout_ref.actor.optim.lr = 3e-7
    cfg.actor_rollout_ref.actor.optim.betas = [0.9, 0.95]
    cfg.actor_rollout_ref.actor.clip_ratio_high = 0.28
    cfg.actor_rollout_ref.rollout = dict(name="vllm", n=4, temperature=0.6)
    cfg.critic.enable = False
    cfg.trainer.experiment_name = "null"
    cfg.trainer.project_name = "1e-4"
    cfg.trainer.logger = "console"
    cfg.trainer.default_local_dir = "out dir: yes"
    cfg.trainer.max_steps = 10
    return cfg


def test_yaml_round_trip():
    cfg = _changed_config()
    assert TrainerConfig.from_yaml(cfg.to_yaml()) == cfg
    assert TrainerConfig.from_yaml(TrainerConfig().to_yaml()) == TrainerConfig()


def test_overrides_round_trip_lists_only_changed_values():
    cfg = _changed_config()
    overrides = cfg.to_overrides()
    assert TrainerConfig.from_overrides(overrides) == cfg
    assert "actor_rollout_ref.rollout.n=4" in overrides
    assert not any(o.startswith("actor_rollout_ref.rollout.top_p=") for o in overrides)
    assert TrainerConfig().to_overrides() == []


def test_from_yaml_reads_files_and_text_with_aliases_and_hints(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("data:\n  batch_size: 8\n  train_files: [x.parquet]\n"
                    "actor_rollout_ref:\n  actor:\n    optim:\n      lr: 1e-5\n")
    for source in (path, str(path)):
        cfg = TrainerConfig.from_yaml(source)
        assert cfg.data.train_batch_size == 8 and cfg.actor_rollout_ref.actor.optim.lr == 1e-5
    assert TrainerConfig.from_yaml("trainer: {total_epochs: 2}").trainer.total_epochs == 2
    assert TrainerConfig.from_yaml("# only a comment\n") == TrainerConfig()
    with pytest.raises(ConfigError, match=r"did you mean data.max_prompt_length\?"):
        TrainerConfig.from_yaml("data:\n  max_promt_length: 3\n")
    with pytest.raises(ConfigError, match="not found"):
        TrainerConfig.from_yaml(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="must be a mapping"):
        TrainerConfig.from_yaml("- a\n- b\n")


def test_a_whole_key_left_at_the_top_is_placed_in_its_section_not_matched_to_a_name_that_looks_alike():
    """The tutorial's `hybrid_engine: true` sits at the top of the config. Before: 'did you mean
    model_engine?', another setting whose name merely looks alike."""
    with pytest.raises(ConfigError, match=r"^unknown config key 'hybrid_engine'; did you mean "
                                          r"actor_rollout_ref\.hybrid_engine\?$"):
        TrainerConfig.from_cli(["hybrid_engine=true"])
    config = TrainerConfig()
    with pytest.raises(ConfigError, match=r"did you mean actor_rollout_ref\.hybrid_engine\?$"):
        config.hybrid_engine = True
    with pytest.raises(ConfigError, match=r"did you mean trainer\.total_epochs\?"):  # a typo of a section still
        TrainerConfig.from_cli(["trainr.total_epochs=2"])


def test_from_yaml_with_base_merges_over_it():
    base = TrainerConfig(data=dict(train_batch_size=2), trainer=dict(total_epochs=5))
    cfg = TrainerConfig.from_yaml("trainer:\n  total_epochs: 3\n", base=base)
    assert cfg.data.train_batch_size == 2 and cfg.trainer.total_epochs == 3


def test_from_cli_loads_a_config_file_then_applies_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  total_epochs: 3\n  experiment_name: from_file\n")
    cfg = TrainerConfig.from_cli(["--config-file", str(path), "trainer.total_epochs=4"])
    assert cfg.trainer.total_epochs == 4 and cfg.trainer.experiment_name == "from_file"
    cfg = TrainerConfig.from_cli([f"--config-file={path}"])
    assert cfg.trainer.total_epochs == 3
    with pytest.raises(ConfigError, match="needs a path"):
        TrainerConfig.from_cli(["--config-file"])


def test_plus_on_a_typed_section_is_an_unknown_key_with_a_note():
    with pytest.raises(ConfigError, match=r"'trainer.new_key'.*'\+' adds keys only below free-form dict fields"):
        _cfg("+trainer.new_key=1")


def test_words_are_typed_as_hydra_and_omegaconf_type_them():
    # Hydra's grammar: on / no are text; a bool field takes OmegaConf's yes/no/on/off words.
    cfg = _cfg("+data.chat_template_kwargs.a=on", "+data.chat_template_kwargs.b=no",
               "+data.chat_template_kwargs.c=False", "+data.chat_template_kwargs.d=1e5")
    assert cfg.data.chat_template_kwargs == {"a": "on", "b": "no", "c": False, "d": 1e5}
    assert TrainerConfig.from_yaml(cfg.to_yaml()) == cfg  # written quoted where YAML would read a bool
    assert _cfg("data.shuffle=no").data.shuffle is False and _cfg("data.shuffle=on").data.shuffle is True
    assert TrainerConfig.from_yaml("data:\n  shuffle: off\n").data.shuffle is False
    with pytest.raises(ConfigError, match="data.shuffle expects bool, got 'maybe'"):
        _cfg("data.shuffle=maybe")
    # A str field keeps the text as typed, also from YAML.
    assert _cfg("trainer.experiment_name=yes").trainer.experiment_name == "yes"
    assert TrainerConfig.from_yaml("trainer:\n  experiment_name: true\n").trainer.experiment_name == "true"


def test_interpolations_resolve_against_the_final_values(tmp_path, monkeypatch):
    run = tmp_path / "run.yaml"
    run.write_text("data:\n  max_prompt_length: 64\n  val_batch_size: ${data.train_batch_size}\n"
                   "trainer:\n  experiment_name: exp-${data.max_prompt_length}\n"
                   "  default_local_dir: ${oc.env:VERL_TEST_OUT}/run\n")
    monkeypatch.setenv("VERL_TEST_OUT", str(tmp_path))
    cfg = TrainerConfig.from_cli(["--config-file", str(run), "data.train_batch_size=16", "data.max_prompt_length=128",
                                  "actor_rollout_ref.actor.ppo_mini_batch_size=${data.train_batch_size}"])
    assert cfg.data.val_batch_size == 16  # a later command-line value of the referenced key counts
    assert cfg.trainer.experiment_name == "exp-128"
    assert cfg.trainer.default_local_dir == f"{tmp_path}/run"
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 16
    # A plain value given after an interpolation of the same key wins.
    assert _cfg("data.val_batch_size=${data.train_batch_size}", "data.val_batch_size=3").data.val_batch_size == 3
    with pytest.raises(ConfigError, match=r"data.val_batch_size=\$\{data.nope\}: cannot resolve"):
        _cfg("data.val_batch_size=${data.nope}")
    with pytest.raises(ConfigError, match=r"data.val_batch_size=\$\{trainer.project_name\}: cannot resolve .*"
                                          r"'verl' of type 'str' could not be converted to Integer"):
        _cfg("data.val_batch_size=${trainer.project_name}")
    assert _cfg("trainer.experiment_name=${data.max_prompt_length}").trainer.experiment_name == "512"


# ---------------------------------------------------------------- text typed for the field (coerce.from_text)
INT, FLOAT, BOOL, STR = ("actor_rollout_ref.actor.data_loader_seed", "actor_rollout_ref.actor.entropy_coeff",
                         "data.shuffle", "data.prompt_key")
REFUSED = object()
TEXT_TABLE = [
    (INT, 1, 1), (INT, "3", 3), (INT, "0", 0), (INT, "1_000", 1000),
    (INT, 2.0, REFUSED), (INT, 2.5, REFUSED), (INT, True, REFUSED), (INT, "1e-4", REFUSED), (INT, "true", REFUSED),
    (INT, "abc", REFUSED), (INT, [1], REFUSED),
    (FLOAT, 1, 1.0), (FLOAT, 2.5, 2.5), (FLOAT, "3", 3.0), (FLOAT, "1e-4", 1e-4), (FLOAT, "inf", float("inf")),
    (FLOAT, "1_000", 1000.0), (FLOAT, True, REFUSED), (FLOAT, "true", REFUSED), (FLOAT, "abc", REFUSED),
    (FLOAT, [1], REFUSED),
    (BOOL, True, True), (BOOL, "true", True), (BOOL, "yes", True), (BOOL, "on", True), (BOOL, "1", True),
    (BOOL, "YES", True), (BOOL, "off", False), (BOOL, "0", False), (BOOL, "false", False), (BOOL, "No", False),
    (BOOL, 1, True), (BOOL, 0, False),
    # Refused here, taken as True by OmegaConf: ints other than 0 / 1, and text other than the words.
    (BOOL, 3, REFUSED), (BOOL, "3", REFUSED), (BOOL, "1_000", REFUSED), (BOOL, "sure", REFUSED),
    (STR, 2.5, "2.5"), (STR, 3, "3"), (STR, "x", "x"), (STR, [1], REFUSED),
]


def _override(key, value):
    """`key=value` as typed on a command line: text quoted, so that it stays text."""
    from verl.config.yaml_text import format_flow

    return f"{key}='{value}'" if isinstance(value, str) else f"{key}={format_flow(value)}"


def _yaml(key, value):
    from verl.config.yaml_text import format_flow

    *sections, leaf = key.split(".")
    return "".join(f"{'  ' * i}{name}:\n" for i, name in enumerate(sections)) + \
        f"{'  ' * len(sections)}{leaf}: {format_flow(value)}\n"


@pytest.mark.parametrize("key, given, expected", TEXT_TABLE, ids=[f"{k.rsplit('.', 1)[1]}={g!r}" for k, g, _ in TEXT_TABLE])
def test_text_is_typed_for_the_field_from_overrides_and_yaml(key, given, expected):
    for build in (lambda: _cfg(_override(key, given)), lambda: TrainerConfig.from_yaml(_yaml(key, given))):
        if expected is REFUSED:
            with pytest.raises(ConfigError, match=rf"^{re.escape(key)} expects \w+, got {re.escape(repr(given))} "):
                build()
        else:
            value = build().get(key)
            assert value == expected and type(value) is type(expected)


def test_a_list_of_floats_given_text_and_its_error_names_the_whole_value():
    key = "actor_rollout_ref.actor.optim.betas"
    assert _cfg(f"{key}=['0.9','1e-3']").get(key) == [0.9, 1e-3]
    assert TrainerConfig.from_yaml(_yaml(key, ["0.9", 1])).get(key) == [0.9, 1.0]
    message = re.escape(f"{key} expects list[float], got ['a'] (list); e.g. {key}=[0.9, 0.999]")
    with pytest.raises(ConfigError, match=f"^{message}$"):
        _cfg(f"{key}=[a]")
    with pytest.raises(ConfigError, match=f"^{message}$"):
        TrainerConfig.from_yaml(_yaml(key, ["a"]))


def test_a_bad_bool_word_is_refused_where_it_is_set():
    with pytest.raises(ConfigError, match=r"^data.shuffle expects bool, got 'sure' \(str\); e.g. data.shuffle=true$"):
        _cfg("data.shuffle=sure", "data.shuffle=true")  # at the key that set it, not after the last override
    with pytest.raises(ConfigError, match=r"^data.shuffle expects bool, got 3 \(int\)"):
        TrainerConfig.from_yaml("data:\n  shuffle: 3\n")
    # Choices are checked once everything is applied, so a later override can still fix a bad one.
    assert _cfg("data.truncation=center", "data.truncation=left").data.truncation == "left"


def test_values_from_interpolations_are_typed_once_resolved(monkeypatch):
    monkeypatch.setenv("VERL_TEST_LR", "1e-4")
    monkeypatch.setenv("VERL_TEST_WORD", "off")
    cfg = _cfg("actor_rollout_ref.actor.optim.lr=${oc.env:VERL_TEST_LR}", "data.shuffle=${oc.env:VERL_TEST_WORD}",
               "actor_rollout_ref.actor.optim.betas=[${oc.env:VERL_TEST_LR},1]",
               "trainer.experiment_name=${oc.env:VERL_TEST_LR}")
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-4 and isinstance(cfg.actor_rollout_ref.actor.optim.lr, float)
    assert cfg.data.shuffle is False
    assert cfg.actor_rollout_ref.actor.optim.betas == [1e-4, 1.0]
    assert cfg.trainer.experiment_name == "1e-4"
    assert TrainerConfig.from_yaml("actor_rollout_ref:\n  actor:\n    optim:\n      lr: ${oc.env:VERL_TEST_LR}\n"
                                   ).actor_rollout_ref.actor.optim.lr == 1e-4
    with pytest.raises(ConfigError, match=re.escape(
            "data.train_batch_size=${oc.env:VERL_TEST_LR}: cannot resolve the interpolation (While dereferencing "
            "interpolation '${oc.env:VERL_TEST_LR}': Value '1e-4' of type 'str' could not be converted to Integer)")):
        _cfg("data.train_batch_size=${oc.env:VERL_TEST_LR}")


def test_python_values_stay_strict():
    with pytest.raises(ConfigError, match=re.escape("actor_rollout_ref.actor.optim.lr expects float, got '1e-4' (str)")):
        TrainerConfig(actor_rollout_ref={"actor": {"optim": {"lr": "1e-4"}}})
    cfg = TrainerConfig()
    with pytest.raises(ConfigError, match=re.escape("actor_rollout_ref.actor.optim.lr expects float, got '1e-4' (str)")):
        cfg.actor_rollout_ref.actor.optim.lr = "1e-4"
    with pytest.raises(ConfigError, match=re.escape("data.shuffle expects bool, got 'yes' (str)")):
        cfg.data.shuffle = "yes"
    with pytest.raises(ConfigError, match=re.escape("data.train_batch_size expects int, got '2' (str)")):
        cfg.data.train_batch_size = "2"
    cfg.actor_rollout_ref.actor.optim.lr = 2  # an int is fine for a float, and becomes one
    assert cfg.actor_rollout_ref.actor.optim.lr == 2.0 and isinstance(cfg.actor_rollout_ref.actor.optim.lr, float)


def test_dicts_of_scalars_are_typed_per_value_and_other_annotations_take_text_as_given():
    from dataclasses import dataclass

    from verl.config import ConfigNode
    from verl.config.fields import option

    @dataclass
    class Section(ConfigNode):
        sizes: dict[str, int] = option({"a": 1}, help="Typed values.")
        either: int | str = option(1, help="A union: text stays as given.")

    cfg = Section.from_overrides(["sizes={a: '2', b: 3}", "+sizes.c='4'", "either='5'"])
    assert cfg.sizes == {"a": 2, "b": 3, "c": 4} and cfg.either == "5"
    with pytest.raises(ConfigError, match=re.escape("sizes expects dict[str, int], got {'a': 'x'} (dict)")):
        Section.from_overrides(["sizes={a: x}"])
    with pytest.raises(ConfigError, match=re.escape("sizes.c expects int, got 'x' (str)")):
        Section.from_overrides(["+sizes.c=x"])


def test_a_mapping_merges_into_a_free_form_mapping_and_a_list_replaces_as_in_omegaconf():
    # What OmegaConf's merge does with the values of a free-form mapping, whichever form sets them.
    kw = lambda *args: _cfg(*args).reward_model.reward_kwargs  # noqa: E731
    assert kw("reward_model.reward_kwargs={a: {x: 1}}", "reward_model.reward_kwargs={a: {y: 2}, b: 3}") == \
        {"a": {"x": 1, "y": 2}, "b": 3}
    assert kw("reward_model.reward_kwargs={a: [1, 2]}", "reward_model.reward_kwargs={a: [3]}") == {"a": [3]}
    assert kw("reward_model.reward_kwargs={a: 1}", "reward_model.reward_kwargs={a: {z: 1}}") == {"a": {"z": 1}}
    assert kw("reward_model.reward_kwargs={a: {z: 1}}", "reward_model.reward_kwargs={a: null}") == {"a": None}
    yaml = TrainerConfig.from_yaml("reward_model:\n  reward_kwargs:\n    a: {x: 1}\n",
                                   base=_cfg("reward_model.reward_kwargs={a: {y: 2}}"))
    assert yaml.reward_model.reward_kwargs == {"a": {"x": 1, "y": 2}}
    # A list meeting a mapping, at any depth, is the whole value's error at the key that was set.
    for earlier, later in (("{a: {z: 1}}", "{a: [1]}"), ("{a: [1]}", "{a: {z: 1}}"), ("{a: {z: [1]}}", "{a: {z: {q: 1}}}")):
        with pytest.raises(ConfigError, match=re.escape("reward_model.reward_kwargs expects dict, got ")):
            _cfg(f"reward_model.reward_kwargs={earlier}", f"reward_model.reward_kwargs={later}")
    with pytest.raises(ConfigError, match=re.escape("reward_model.reward_kwargs.a expects any value, got [1] (list)")):
        _cfg("+reward_model.reward_kwargs.a={z: 1}", "reward_model.reward_kwargs.a=[1]")


def test_an_unparsable_interpolation_in_a_yaml_file_is_an_error_at_its_key():
    with pytest.raises(ConfigError, match=r"cannot parse YAML config text: no viable alternative at input '\$\{foo'"
                                          r"[\s\S]*full_key: trainer.experiment_name"):
        TrainerConfig.from_yaml("trainer:\n  experiment_name: ${foo\n")


def test_a_tab_in_a_yaml_file_is_named_with_its_line_and_the_fix(tmp_path):
    # Editors insert tabs; YAML refuses them where it expects spaces, with a scanner message that does not say so.
    for text, line in (("data:\n\ttrain_batch_size: 8\n", 2), ("data:\n  train_batch_size: 8\n\tshuffle: true\n", 3)):
        path = tmp_path / f"tab{line}.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=rf"^cannot parse YAML config file {re.escape(str(path))}: line {line} has "
                                              r"a tab where YAML takes spaces only; indent with spaces \(2 per level"):
            TrainerConfig.from_yaml(path)
    assert TrainerConfig.from_yaml("trainer:\n  experiment_name: 'a\tb'\n").trainer.experiment_name == "a\tb"


@pytest.mark.parametrize("given", ["+trainer.total_epochs=3", "+data.train_batch_size=8",
                                   "+actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",  # from a verl example
                                   "+actor_rollout_ref.rollout"])
def test_plus_on_a_key_verl_already_has_is_refused_as_hydra_refuses_it(given):
    key = given.split("=")[0][1:]
    with pytest.raises(ConfigError) as err:
        TrainerConfig.from_cli([given if "=" in given else given + "={}"])
    text = str(err.value)
    assert f"{key} is already in the config" in text and "Could not append to config" in text
    assert f"++{key}=" in text  # the fix: ++ sets it either way (or drop the +)


def test_plus_adds_what_is_not_there_and_plus_plus_sets_either_way():
    # verl's recipes add data.gen_batch_size with '+' (not in verl's own config): accepted, as in verl
    assert TrainerConfig.from_cli(["+data.gen_batch_size=8"]).data.gen_batch_size == 8
    cfg = TrainerConfig.from_cli(["+trainer.resource_pools.critic_pool=[1]", "++trainer.total_epochs=3",
                                  "+actor_rollout_ref.model.override_config.attention_dropout=0.1"])
    assert cfg.trainer.resource_pools == {"critic_pool": [1]} and cfg.trainer.total_epochs == 3
    # a second '+' of an entry already added below a free-form mapping is refused too
    with pytest.raises(ConfigError, match=r"trainer.resource_pools.critic_pool is already in the config"):
        TrainerConfig.from_cli(["+trainer.resource_pools.critic_pool=[1]", "+trainer.resource_pools.critic_pool=[2]"])
    assert TrainerConfig.from_cli(["+trainer.resource_pools.p=[1]", "++trainer.resource_pools.p=[2]"]
                                  ).trainer.resource_pools == {"p": [2]}


@pytest.mark.parametrize("flag", [["--cfg", "job"], ["-c", "job"], ["--cfg=job"]])
def test_hydras_print_config_flag_prints_the_config_with_the_overrides_and_trains_nothing(flag, tmp_path, monkeypatch,
                                                                                           capsys):
    """verl's `main_ppo --cfg job` (Hydra's flag). Before: "override '--cfg' starts with '-'; write key=value
    without dashes", a fix that cannot work."""
    import yaml

    from verl.trainer.main_ppo import main

    monkeypatch.chdir(tmp_path)
    assert main(["trainer.total_epochs=3", *flag, "data.train_batch_size=8"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["total_epochs"] == 3 and printed["data"]["train_batch_size"] == 8
    assert TrainerConfig.from_dict(printed).trainer.total_epochs == 3 and not list(tmp_path.iterdir())
    assert main([*flag, "trainer.totl_epochs=3"]) == 2
    assert "did you mean trainer.total_epochs?" in capsys.readouterr().err


@pytest.mark.parametrize("entry", ["main_sft", "main_dpo", "main_kto"])
def test_the_offline_entry_points_take_hydras_print_config_flag_too(entry, tmp_path, monkeypatch, capsys):
    """`python -m verl.trainer.main_sft --cfg job` printed "override '--cfg' starts with '-'" (main_ppo
    alone knew the flag)."""
    import importlib

    import yaml

    main = importlib.import_module(f"verl.trainer.{entry}").main
    monkeypatch.chdir(tmp_path)
    assert main(["--cfg", "job", "optim.lr=0.0003"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["optim"]["lr"] == 0.0003 and not list(tmp_path.iterdir())
    assert main(["--cfg=job", "optim.lrr=1"]) == 2
    assert "did you mean optim.lr?" in capsys.readouterr().err
