"""Logger backends for real: tensorboard event files, a wandb offline run, the tutorial's short
`logger=dict(type=..., project=...)` merged with trainer.logger, and the not-installed errors."""

import json
import re
import sys

import pytest

from verl.config import TrainerConfig
from verl.errors import ConfigError, VerlError
from verl.tracking import Tracker


def test_tensorboard_writes_events_that_tensorboard_reads_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracker(["tensorboard"], tmp_path)
    tracker.log({"actor/pg_loss": 0.5, "critic/score/mean": 1.0}, step=1)
    tracker.log({"actor/pg_loss": 0.25}, step=2)
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["actor/pg_loss", "critic/score/mean"]
    assert [(e.step, e.value) for e in events.Scalars("actor/pg_loss")] == [(1, 0.5), (2, 0.25)]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_wandb_offline_writes_a_local_run_with_the_logged_keys(tmp_path, monkeypatch):
    import wandb

    for var, sub in (("WANDB_DIR", "wandb-dir"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = TrainerConfig(logger=dict(type="wandb", project="my-rl", name="first-run"))
    tracker = Tracker.from_config(config, tmp_path / "out")
    run = tracker.backends[0].run
    assert (run.project, run.name) == ("my-rl", "first-run")
    assert run.config["data"]["train_batch_size"] == config.data.train_batch_size
    tracker.log({"actor/pg_loss": 0.5, "reward/mean": 1.0}, step=1)
    tracker.log({"actor/pg_loss": 0.25}, step=2)
    assert run.summary["actor/pg_loss"] == 0.5  # step 1 is committed once step 2 begins
    tracker.close()
    wandb.teardown()

    run_files = list((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 1
    records = run_files[0].read_bytes()
    # History items are stored as (key, JSON value) pairs: each key with the value logged for it.
    assert re.search(rb"actor/pg_loss.{1,8}0\.5", records, re.S)
    assert re.search(rb"actor/pg_loss.{1,8}0\.25", records, re.S)
    assert re.search(rb"reward/mean.{1,8}1", records, re.S)
    assert (tmp_path / "out" / "metrics.jsonl").exists()


def _no_wandb_login(tmp_path, monkeypatch):
    """An environment where wandb has no API key (no variable, no ~/.netrc) and is not offline."""
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for var, sub in (("WANDB_DIR", "wandb-dir"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_wandb_without_a_login_fails_in_one_line_naming_the_ways_out(tmp_path, monkeypatch):
    import wandb

    _no_wandb_login(tmp_path, monkeypatch)
    with pytest.raises(VerlError, match=r"^trainer.logger includes 'wandb' but wandb could not start a run \(.*API key"
                                        r".*\); log in with `wandb login` or set WANDB_API_KEY, or set WANDB_MODE=offline"):
        Tracker(["console", "wandb"], tmp_path / "out")
    wandb.teardown()
    assert not (tmp_path / "out" / "metrics.jsonl").exists()  # nothing left open


def test_a_run_logging_to_wandb_without_a_login_stops_before_any_model_loads(tmp_path, monkeypatch):
    import wandb

    from verl.trainer import main_ppo
    from verl.trainer.ppo import placement

    _no_wandb_login(tmp_path, monkeypatch)
    placed = []
    monkeypatch.setattr(placement, "place_roles", lambda *args, **kwargs: placed.append(1))
    with pytest.raises(VerlError, match="log in with `wandb login`"):
        main_ppo.run(TrainerConfig.from_overrides(["trainer.logger=[console,wandb]", "trainer.total_training_steps=1",
                                                   "sft_warmstart.enable=false",
                                                   f"trainer.default_local_dir={tmp_path / 'run'}"]))
    wandb.teardown()
    assert placed == []  # the roles (and their models) were never placed


def test_the_short_logger_section_wins_over_the_trainer_keys_where_given():
    config = TrainerConfig.from_overrides(["trainer.logger=[console,wandb]", "trainer.project_name=p",
                                           "trainer.experiment_name=e"])
    assert config.resolved_logging() == (["console", "wandb"], "p", "e")
    config.logger.project = "my-rl"
    assert config.resolved_logging() == (["console", "wandb"], "my-rl", "e")
    config.logger.type = "tensorboard"
    config.logger.name = "n"
    assert config.resolved_logging() == (["tensorboard"], "my-rl", "n")
    config.logger.type = ["console", "tensorboard", "console"]
    assert config.resolved_logging()[0] == ["console", "tensorboard"]


def test_tracker_from_config_uses_the_short_form(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracker.from_config(TrainerConfig(logger=dict(type="tensorboard")), tmp_path)
    tracker.log({"reward/mean": 0.75}, step=3)
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(3, 0.75)]
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 3, "reward/mean": 0.75}


def test_an_unknown_name_in_the_short_form_is_rejected_naming_both_keys(tmp_path):
    with pytest.raises(VerlError, match=r"'mlflow'.*trainer\.logger \(or logger\.type\)"):
        Tracker.from_config(TrainerConfig(logger=dict(type="mlflow")), tmp_path)


def test_the_tutorials_logger_dict_under_trainer_logger_points_to_the_top_level_key():
    # A newcomer's mix of the two spellings: the short form's dict where the list of names goes. The error
    # names the top-level key in both forms, and the forms it names work.
    for build in (lambda: TrainerConfig(trainer=dict(logger=dict(type="wandb", project="my-rl"))),
                  lambda: TrainerConfig.from_overrides(["trainer.logger={type: wandb, project: my-rl}"])):
        with pytest.raises(ConfigError) as err:
            build()
        assert str(err.value).startswith("trainer.logger expects str | list[str], got {")
        assert ("e.g. trainer.logger=[console,wandb]; a dict(type=..., project=...) is the tutorial's top-level key "
                "logger: TrainerConfig(logger=dict(type='wandb', project='my-rl')), or logger.type=wandb "
                "logger.project=my-rl on the command line") in str(err.value)
    for config in (TrainerConfig(logger=dict(type="wandb", project="my-rl")),
                   TrainerConfig.from_overrides(["logger.type=wandb", "logger.project=my-rl"])):
        assert config.resolved_logging()[:2] == (["wandb"], "my-rl")


@pytest.mark.parametrize("name, modules", [
    ("wandb", ["wandb"]),
    ("tensorboard", ["tensorboard", "torch.utils.tensorboard"]),
])
def test_a_logger_whose_package_is_missing_raises_with_the_install_command(tmp_path, monkeypatch, name, modules):
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(VerlError) as err:
        Tracker(["console", name], tmp_path)
    assert f"pip install 'verl[{name}]'" in str(err.value)
    assert not (tmp_path / "metrics.jsonl").exists()


ROWS = [{"prompt": "Q: 1+2=\nA: ", "response": "3", "score": 1.0}, {"prompt": "Q: 9|9=", "response": "x", "score": 0.0}]


def test_validation_generations_reach_every_backend(tmp_path, monkeypatch, capsys):
    """trainer.log_val_generations: printed, appended to val_generations.jsonl (rewound with the
    metrics on resume), a text table in TensorBoard and a wandb table."""
    import json

    import wandb
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for var, sub in (("WANDB_DIR", "wandb-dir"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = Tracker(["console", "tensorboard", "wandb"], tmp_path / "out")
    tracker.log_generations(ROWS, step=2)
    tracker.log_generations(ROWS[:1], step=4)
    tracker.close()
    wandb.teardown()
    out = capsys.readouterr().out
    assert "validation generations at step 2:" in out and "score 1.000 | prompt Q: 1+2=\\nA:  | response 3" in out
    rows = [json.loads(line) for line in (tmp_path / "out" / "val_generations.jsonl").read_text().splitlines()]
    assert rows == [{"step": 2, **ROWS[0]}, {"step": 2, **ROWS[1]}, {"step": 4, **ROWS[0]}]
    events = EventAccumulator(str(tmp_path / "out" / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    texts = [e.tensor_proto.string_val[0].decode() for e in events.Tensors("val/generations/text_summary")]
    assert len(texts) == 2 and "| Q: 1+2=\\nA:  | 3 | 1 |" in texts[0] and "9\\|9" in texts[0]
    records = next((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()
    assert b"val/generations" in records and b"table-file" in records

    resumed = Tracker([], tmp_path / "out")
    resumed.rewind(3)  # a run resumed at step 3 forgets what an earlier attempt logged after it
    resumed.close()
    assert [json.loads(line)["step"] for line in (tmp_path / "out" / "val_generations.jsonl").read_text().splitlines()] == [2, 2]


def test_the_same_prompts_are_chosen_at_every_validation():
    from verl.trainer.ppo.validation import select_generations

    rows = [{"prompt": f"p{i}", "response": "r", "score": float(i)} for i in range(20)]
    first = select_generations(rows, 3)
    assert len(first) == 3 and select_generations(list(reversed(rows)), 3) == first
    assert select_generations(rows, 50) == select_generations(rows, 20) and len(select_generations(rows, 50)) == 20
