"""The ``verl`` console command."""

import subprocess
import sys
from pathlib import Path

import pytest

from verl.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_version_and_usage(capsys):
    from verl import __version__

    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == __version__
    assert main([]) == 2 and "usage: verl" in capsys.readouterr().out
    assert main(["trian"]) == 2 and "unknown command 'trian'; did you mean verl train?" in capsys.readouterr().err
    for flag in ("--version", "-V"):
        assert main([flag]) == 0 and capsys.readouterr().out.strip() == __version__


@pytest.mark.parametrize("typed, hint", [
    ("ppo", "; did you mean verl train?\n"), ("main_sft", "; did you mean verl sft?\n"),
    ("doctr", "; did you mean verl doctor?\n"),
    ("grpo", "; did you mean verl train? (grpo runs as verl train with its algorithm keys, e.g. "
             "algorithm.adv_estimator=grpo)"),
    ("zzz", "unknown command 'zzz'\n"),  # nothing close: no guess
])
def test_an_unknown_command_names_the_one_probably_meant(typed, hint, capsys):
    assert main([typed]) == 2
    err = capsys.readouterr().err
    assert hint in err and "usage: verl" in err


def test_config_prints_the_shipped_defaults(capsys):
    assert main(["config"]) == 0
    assert capsys.readouterr().out == (REPO / "verl" / "config" / "ppo_trainer.yaml").read_text()


def test_train_takes_the_same_keys_as_main_ppo(capsys):
    assert main(["train", "trainer.totl_epochs=3"]) == 2
    assert "did you mean trainer.total_epochs" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "sft", "dpo", "kto", "generate", "eval"])
def test_every_trainer_lists_its_keys(command, capsys):
    assert main([command, "--help"]) == 0
    assert "=" in capsys.readouterr().out


def test_the_after_training_commands_are_verls_modules(capsys, tmp_path):
    assert main(["generate", "data.n_sample=3"]) == 2
    assert "did you mean data.n_samples?" in capsys.readouterr().err
    assert main(["eval"]) == 2 and "data.path is required" in capsys.readouterr().err
    assert main(["merge", "--local_dir", str(tmp_path / "nope"), "--target_dir", str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["merge", "--help"])
    assert "--target_dir" in capsys.readouterr().out
    assert main(["model_merger"]) == 2 and "did you mean verl merge?" in capsys.readouterr().err


def test_the_installed_console_script_runs():
    script = Path(sys.executable).parent / "verl"
    if not script.exists():
        pytest.skip("verl is not installed as a console script in this environment")
    done = subprocess.run([str(script), "version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip()
