"""Resume edge cases without a model: damaged checkpoints, metrics.jsonl after a resume, leftovers of
interrupted exports, loggers closed on error, and Ctrl-C/SIGTERM stopping the run loop at a step
boundary (see tests/integration/test_kill_resume.py for the same with real processes)."""

import json
import logging
import os
import signal
from types import SimpleNamespace

import pytest
import torch

from verl.checkpoint import CheckpointManager, write_hf_folder
from verl.checkpoint.manager import POINTER
from verl.config import TrainerConfig
from verl.errors import VerlError
from verl.tracking import Tracker
from verl.trainer.run_loop import run_loop
from verl.trainer.stop import RunInterrupted, StopSignals


def saved(tmp_path, steps=(1, 2, 3)) -> CheckpointManager:
    manager = CheckpointManager(tmp_path)
    for step in steps:
        manager.save(step, {"global_step": step, "w": torch.full((2,), float(step))})
    return manager


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


@pytest.mark.parametrize("damage", ["truncated", "missing_file", "missing_folder", "garbage"])
def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning_naming_it(tmp_path, caplog, damage):
    manager = saved(tmp_path)
    newest = manager.step_dir(3)
    if damage == "truncated":
        truncate(newest / "state.pt")
    elif damage == "missing_file":
        (newest / "state.pt").unlink()
    elif damage == "missing_folder":
        newest.rename(tmp_path / "elsewhere")
    else:
        (newest / "state.pt").write_bytes(b"not a checkpoint at all")

    with caplog.at_level(logging.WARNING, logger="verl.checkpoint.manager"):
        path, state = manager.load_latest()

    assert path == manager.step_dir(2) and state["global_step"] == 2
    assert "global_step_3" in caplog.text and "resuming from global_step_2" in caplog.text


def test_two_damaged_checkpoints_in_a_row_are_both_skipped(tmp_path, caplog):
    manager = saved(tmp_path)
    truncate(manager.step_dir(3) / "state.pt")
    (manager.step_dir(2) / "state.pt").unlink()
    with caplog.at_level(logging.WARNING):
        path, state = manager.load_latest()
    assert state["global_step"] == 1
    assert "global_step_3" in caplog.text and "global_step_2" in caplog.text


def test_an_unreadable_or_missing_pointer_falls_back_to_the_highest_step(tmp_path, caplog):
    manager = saved(tmp_path)
    (tmp_path / POINTER).write_text("three")
    with caplog.at_level(logging.WARNING):
        assert manager.load_latest()[1]["global_step"] == 3
    assert POINTER in caplog.text
    (tmp_path / POINTER).unlink()
    assert manager.load_latest()[1]["global_step"] == 3


def test_steps_above_the_pointer_are_an_earlier_runs_and_never_resumed_from(tmp_path):
    manager = saved(tmp_path, steps=(5, 1, 2))  # 5 from an earlier run; this run's pointer says 2
    assert manager.load_latest()[1]["global_step"] == 2


def test_when_no_checkpoint_loads_the_run_stops_naming_the_folder_and_the_fix(tmp_path):
    manager = saved(tmp_path, steps=(1, 2))
    for step in (1, 2):
        truncate(manager.step_dir(step) / "state.pt")
    trainer_cfg = TrainerConfig().trainer
    with pytest.raises(VerlError) as error:
        manager.resume_state(trainer_cfg)
    message = str(error.value)
    assert str(tmp_path) in message and "global_step_2" in message and "global_step_1" in message
    assert "trainer.resume_mode=disable" in message
    trainer_cfg.resume_mode = "disable"  # the way out the message names
    assert manager.resume_state(trainer_cfg) is None


def test_an_empty_folder_starts_fresh_and_a_damaged_resume_from_path_is_refused(tmp_path):
    trainer_cfg = TrainerConfig().trainer
    assert CheckpointManager(tmp_path / "new").resume_state(trainer_cfg) is None
    manager = saved(tmp_path, steps=(1,))
    truncate(manager.step_dir(1) / "state.pt")
    trainer_cfg.resume_mode, trainer_cfg.resume_from_path = "resume_path", str(manager.step_dir(1))
    with pytest.raises(VerlError, match="does not load"):
        manager.resume_state(trainer_cfg)


def test_only_the_main_rank_warns_and_removes_leftovers(tmp_path, caplog):
    saved(tmp_path)
    truncate(tmp_path / "global_step_3" / "state.pt")
    (tmp_path / ".tmp-hf-abc").mkdir()
    other_rank = CheckpointManager(tmp_path, main=False)
    with caplog.at_level(logging.WARNING):
        assert other_rank.load_latest()[1]["global_step"] == 2
    assert caplog.text == "" and (tmp_path / ".tmp-hf-abc").exists()
    CheckpointManager(tmp_path).load_latest()
    assert not (tmp_path / ".tmp-hf-abc").exists()


def test_an_interrupted_exports_temporary_folder_is_removed_by_the_next_export(tiny_model_dir, tmp_path):
    from verl.models.loading import load_causal_lm, load_tokenizer

    left = tmp_path / ".tmp-hf-killed"
    left.mkdir()
    (left / "model.safetensors").write_bytes(b"half")
    extra = []
    write_hf_folder(load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir)), tmp_path / "huggingface",
                    extra=lambda folder: extra.append(folder.name))
    assert not left.exists() and list(tmp_path.glob(".tmp-*")) == []
    assert extra and extra[0].startswith(".tmp-hf-")  # written before the rename, inside the temporary folder
    assert (tmp_path / "huggingface" / "config.json").exists()


# ---------------------------------------------------------------------------- metrics.jsonl
def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_resumed_run_drops_the_rows_after_its_step_and_a_restart_from_0_drops_all(tmp_path):
    tracker = Tracker("jsonl", tmp_path, progress_bar=False)
    for step in (1, 2, 3):
        tracker.log({"x": step}, step)
    tracker.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "x"')  # a row cut short by SIGKILL

    tracker = Tracker("jsonl", tmp_path, progress_bar=False)
    tracker.rewind(2)
    tracker.log({"x": 30}, 3)
    tracker.close()
    assert [(r["step"], r["x"]) for r in rows(tmp_path / "metrics.jsonl")] == [(1, 1), (2, 2), (3, 30)]

    tracker = Tracker("jsonl", tmp_path, progress_bar=False)
    tracker.rewind(0)
    tracker.log({"x": 10}, 1)
    tracker.close()
    assert rows(tmp_path / "metrics.jsonl") == [{"step": 1, "x": 10}]


def test_tensorboard_hides_the_steps_after_the_resumed_one(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracker(["tensorboard"], tmp_path, progress_bar=False)
    for step in (1, 2, 3):
        tracker.log({"x": float(step)}, step)
    tracker.rewind(1)
    tracker.log({"x": 20.0}, 2)
    tracker.close()
    tracker.close()  # a second close does nothing
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("x")] == [(1, 1.0), (2, 20.0)]


# ---------------------------------------------------------------------------- the run loop
class FakeTrainer:
    """What run_loop needs of a trainer; ``on_step(step)`` runs inside each step."""

    label, is_main, val_history = "T", True, []

    def __init__(self, tmp_path, total_steps=4, on_step=lambda step: None):
        self.global_step, self.total_steps, self.on_step = 0, total_steps, on_step
        self.tracker = Tracker("jsonl", tmp_path, progress_bar=False)
        self.watchdog = SimpleNamespace(stage=lambda *a, **k: _null(), stop=lambda: None, graceful_sigterm=False)
        self.saved, self.exported, self.closed = [], False, None
        close = self.tracker.close
        self.tracker.close = lambda failed=False: (setattr(self, "closed", failed), close(failed))

    def resume(self):
        pass

    def has_validation(self):
        return False

    def next_step(self):
        self.global_step += 1
        self.on_step(self.global_step)
        return {"x": float(self.global_step)}

    def postfix(self, metrics):
        return ""

    def save_checkpoint(self):
        self.saved.append(self.global_step)

    def export(self):
        self.exported = True


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def loop_cfg(save_freq=-1):
    return SimpleNamespace(val_before_train=False, test_freq=-1, save_freq=save_freq, progress_bar=False)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_saves_at_the_next_step_boundary_and_stops_with_128_plus_its_number(tmp_path, sig, code):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    trainer = FakeTrainer(tmp_path, on_step=lambda step: step == 2 and os.kill(os.getpid(), sig))
    with pytest.raises(RunInterrupted) as stop:
        run_loop(trainer, loop_cfg(save_freq=-1))
    assert stop.value.exit_code == code and stop.value.clean
    assert trainer.global_step == 2 and trainer.saved == [2] and not trainer.exported
    assert trainer.closed is False  # loggers closed, the run not marked failed
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert [r["step"] for r in rows(tmp_path / "metrics.jsonl")] == [1, 2]


def test_a_resume_past_the_last_step_says_that_nothing_is_trained_and_what_is_exported(tmp_path, caplog):
    """A checkpoint at step 3 and trainer.total_training_steps lowered to 2: before, the run exported step
    3's weights with only 'Resumed ... at step 3' said."""
    trainer = FakeTrainer(tmp_path, total_steps=2)
    trainer.resume = lambda: setattr(trainer, "global_step", 3)
    with caplog.at_level(logging.WARNING, logger="verl.trainer.run_loop"):
        run_loop(trainer, loop_cfg())
    assert trainer.global_step == 3 and trainer.exported and trainer.saved == []
    assert "resumed at step 3, past this run's last step (2): no step is trained" in caplog.text
    assert "of step 3's weights" in caplog.text

    caplog.clear()
    trainer = FakeTrainer(tmp_path, total_steps=3)  # resumed at the last step: the export alone, as usual
    trainer.resume = lambda: setattr(trainer, "global_step", 3)
    with caplog.at_level(logging.WARNING, logger="verl.trainer.run_loop"):
        run_loop(trainer, loop_cfg())
    assert caplog.text == ""


def test_no_second_save_when_the_signalled_step_was_saved_anyway(tmp_path):
    trainer = FakeTrainer(tmp_path, on_step=lambda step: step == 2 and os.kill(os.getpid(), signal.SIGINT))
    with pytest.raises(RunInterrupted):
        run_loop(trainer, loop_cfg(save_freq=1))
    assert trainer.saved == [1, 2]


def test_a_second_signal_stops_at_once_without_a_save(tmp_path):
    def twice(step):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    trainer = FakeTrainer(tmp_path, on_step=twice)
    with pytest.raises(RunInterrupted) as stop:
        run_loop(trainer, loop_cfg(save_freq=-1))
    assert stop.value.exit_code == 130 and not stop.value.clean
    assert trainer.saved == [] and trainer.closed is True


def test_an_error_in_a_step_still_closes_the_loggers_marked_failed(tmp_path):
    def boom(step):
        if step == 3:
            raise RuntimeError("boom")

    trainer = FakeTrainer(tmp_path, on_step=boom)
    with pytest.raises(RuntimeError, match="boom"):
        run_loop(trainer, loop_cfg())
    assert trainer.closed is True and trainer.tracker.backends == []


def test_a_finished_run_exports_and_closes_the_loggers(tmp_path):
    trainer = FakeTrainer(tmp_path)
    run_loop(trainer, loop_cfg(save_freq=2))
    assert trainer.saved == [2, 4] and trainer.exported and trainer.closed is False


def test_stop_signals_are_inert_outside_the_main_thread():
    import threading

    before = signal.getsignal(signal.SIGINT)
    seen = []
    watchdog = SimpleNamespace(graceful_sigterm=False)

    def body():
        with StopSignals(watchdog) as stop:
            seen.append((stop.requested(), watchdog.graceful_sigterm))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [(None, False)] and signal.getsignal(signal.SIGINT) == before


def test_a_resume_under_other_settings_names_each_changed_key_once(caplog):
    from verl.trainer.run_loop import changed_settings, warn_changed_settings

    saved = TrainerConfig.from_cli(["actor_rollout_ref.actor.optim.lr=1e-6", "trainer.total_training_steps=10",
                                    "actor_rollout_ref.rollout.n=2"]).to_dict()
    now = TrainerConfig.from_cli(["actor_rollout_ref.actor.optim.lr=1e-3", "trainer.total_training_steps=20",
                                  "actor_rollout_ref.rollout.n=8", "trainer.default_local_dir=elsewhere"]).to_dict()
    # The run's length and where it writes may change; what it trains may not, silently.
    assert changed_settings(saved, now) == ["actor_rollout_ref.actor.optim.lr: 1e-06 -> 0.001",
                                            "actor_rollout_ref.rollout.n: 2 -> 8"]
    with caplog.at_level(logging.WARNING, logger="verl.trainer.run_loop"):
        warn_changed_settings(saved, now, "out/run")
        warn_changed_settings(saved, saved, "out/run")  # the same settings: nothing said
        warn_changed_settings(None, now, "out/run")  # a checkpoint from before configs were saved in it
    assert len(caplog.records) == 1
    assert ("resuming from out/run under 2 setting(s) other than those of the run that saved it: "
            "actor_rollout_ref.actor.optim.lr: 1e-06 -> 0.001; actor_rollout_ref.rollout.n: 2 -> 8") in caplog.text
    assert "trainer.resume_mode=disable" in caplog.text


def test_a_resume_from_path_at_the_run_folder_names_its_newest_checkpoint(tmp_path, monkeypatch):
    """Before: 'holds no checkpoint (no state.pt)' for the run's own folder, and for a missing one; a
    '~/...' path was looked up under a folder named '~' in the current folder."""
    manager = saved(tmp_path / "run", steps=(2, 10))
    trainer_cfg = TrainerConfig().trainer
    trainer_cfg.resume_mode, trainer_cfg.resume_from_path = "resume_path", str(tmp_path / "run")
    with pytest.raises(VerlError, match=rf"is a run's output folder, not one of its checkpoints; its newest is "
                                        rf"global_step_10: trainer.resume_from_path={tmp_path}/run/global_step_10"):
        manager.resume_state(trainer_cfg)
    trainer_cfg.resume_from_path = str(tmp_path / "nowhere")
    with pytest.raises(VerlError, match=r"nowhere does not exist; give a global_step_N folder"):
        manager.resume_state(trainer_cfg)
    monkeypatch.setenv("HOME", str(tmp_path))
    trainer_cfg.resume_from_path = "~/run/global_step_2"
    assert manager.resume_state(trainer_cfg)[0] == tmp_path / "run" / "global_step_2"


def test_a_resume_from_path_inside_a_checkpoint_names_that_checkpoint(tmp_path):
    """upstream verl's ``global_step_N/actor`` or the ``state.pt`` file itself: before, 'does not exist' and
    'holds no checkpoint', with the checkpoint meant right above."""
    manager = saved(tmp_path / "run", steps=(2,))
    trainer_cfg = TrainerConfig().trainer
    trainer_cfg.resume_mode = "resume_path"
    for inside in ("global_step_2/actor", "global_step_2/state.pt"):
        trainer_cfg.resume_from_path = str(tmp_path / "run" / inside)
        with pytest.raises(VerlError, match=rf"is inside the checkpoint global_step_2, not a checkpoint itself .*: "
                                            rf"trainer.resume_from_path={tmp_path}/run/global_step_2$"):
            manager.resume_state(trainer_cfg)
