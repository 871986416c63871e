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
