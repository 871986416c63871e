"""More newcomer mistakes that were silent, or failed deep inside a library: each is now one line naming the fix."""

import pytest

from verl.config import ConfigError, TrainerConfig


@pytest.mark.parametrize("arg", ["data.val_files=None", "actor_rollout_ref.model.path=None",
                                 "custom_reward_function.path=None", "trainer.total_training_steps=None",
                                 "actor_rollout_ref.model.custom_chat_template=None"])
def test_python_none_on_the_command_line_is_refused_naming_null(arg):
    """Before: the text 'None' was kept, so a path key named a file called 'None' (read as a hub id for the
    model, a missing file for data) and the chat template became the four letters 'None'."""
    key = arg.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{key}=None is the text 'None' here, not an empty value; write "
                                          rf"{key}=null"):
        TrainerConfig.from_cli([arg])
    assert TrainerConfig.from_cli([f"{key}=null"]).get(key) is None
    assert TrainerConfig.from_cli(["trainer.experiment_name=None"]).trainer.experiment_name == "None"  # text: as given


def test_python_none_in_a_yaml_file_is_refused_too(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("data:\n  val_files: None\n")
    with pytest.raises(ConfigError, match=r"^data.val_files=None is the text 'None' here"):
        TrainerConfig.from_cli(["--config-file", str(path)])


@pytest.mark.parametrize("build", [TrainerConfig.from_cli, TrainerConfig.from_overrides])
def test_overrides_given_as_one_string_are_refused_with_their_split(build):
    """Before: the string was read letter by letter, "override 'a' has no '='"."""
    with pytest.raises(ConfigError, match=r"^the overrides are a list of 'key=value' strings, one per item, got one "
                                          r"string \"actor_rollout_ref.rollout.n=4 trainer.logger='\[console,wandb\]'\"; "
                                          r"write \['actor_rollout_ref.rollout.n=4', 'trainer.logger=\[console,wandb\]'\]"):
        build("actor_rollout_ref.rollout.n=4 trainer.logger='[console,wandb]'")


def test_the_entry_point_called_with_one_string_ends_with_that_line(capsys):
    from verl.trainer.main_ppo import main

    assert main("trainer.seed=2 data.train_batch_size=4") == 2
    assert "got one string 'trainer.seed=2 data.train_batch_size=4'; write ['trainer.seed=2', 'data.train_batch_" \
           "size=4']" in capsys.readouterr().err


def test_paths_and_numpy_numbers_are_taken_where_text_and_numbers_are(tmp_path):
    """Before: "actor_rollout_ref.model.path expects str | None, got PosixPath(...)", and numpy's int64 (a size
    computed from a data frame) was refused for an int key."""
    import numpy as np

    cfg = TrainerConfig(actor_rollout_ref=dict(model=dict(path=tmp_path / "model"),
                                               rollout=dict(n=np.int64(4), temperature=np.float32(0.5)),
                                               actor=dict(use_kl_loss=np.bool_(True))),
                        data=dict(train_files=[tmp_path / "a.parquet"], val_files=tmp_path / "b.parquet",
                                  train_batch_size=np.int32(8)),
                        trainer=dict(default_local_dir=tmp_path / "out"))
    assert cfg.actor_rollout_ref.model.path == str(tmp_path / "model")
    assert cfg.data.train_files == [str(tmp_path / "a.parquet")] and cfg.data.val_files == str(tmp_path / "b.parquet")
    assert cfg.trainer.default_local_dir == str(tmp_path / "out")
    values = (cfg.actor_rollout_ref.rollout.n, cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.temperature,
              cfg.actor_rollout_ref.actor.use_kl_loss)
    assert values == (4, 8, 0.5, True) and [type(v) for v in values] == [int, int, float, bool]
    cfg.trainer.default_local_dir = tmp_path / "other"  # assignment too
    assert cfg.trainer.default_local_dir == str(tmp_path / "other")
    TrainerConfig.from_dict(cfg.to_dict())  # stays plain values
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.rollout.n expects int, got np.float64\(2.5\)"):
        TrainerConfig(actor_rollout_ref=dict(rollout=dict(n=np.float64(2.5))))  # a fraction is still no count


@pytest.mark.parametrize("args, named", [
    (["trainer.default_local_dir='$HOME/runs/x'"], "trainer.default_local_dir=$HOME/runs/x holds $HOME"),
    (["data.train_files=[a.parquet,'${DATA}/b.parquet']"], None),  # OmegaConf's: an unknown key, said as such
    (["data.train_files=[a.parquet,'$DATA/b.parquet']"], "data.train_files=[a.parquet, $DATA/b.parquet] holds $DATA"),
    (["custom_reward_function.path='$WORK/reward.py'"], "custom_reward_function.path=$WORK/reward.py holds $WORK"),
])
def test_an_environment_variable_in_a_path_is_refused_naming_oc_env(args, named):
    """Before: nothing expanded it, so '$HOME/runs/x' wrote the run into a folder named '$HOME' under the current one."""
    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_cli(args).validate()
    if named:
        assert str(info.value).startswith(named + ", which nothing expands here")
        name = named.rsplit("$", 1)[1]
        assert f"write ${{oc.env:{name}}} in its place" in str(info.value)


def test_a_path_through_oc_env_is_taken(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNS", str(tmp_path))
    cfg = TrainerConfig.from_cli(["trainer.default_local_dir=${oc.env:RUNS}/x"])
    cfg.validate()
    assert cfg.trainer.default_local_dir == f"{tmp_path}/x"
