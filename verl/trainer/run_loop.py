"""The run around the steps, shared by the RL trainer and the offline trainers (SFT, DPO, KTO).

``run_loop(trainer, trainer_cfg)`` reads as the run: resume, validate before training, then one
step after another with logging and a progress line, periodic validation and crash-safe
checkpoints, a last validation, the Hugging Face export, and the loggers closed (also when the run
fails). Each part runs inside a named watchdog stage, so a rank lost in a multi-rank job is
reported with the stage. Ctrl-C or SIGTERM stops the run at the next step boundary with a
checkpoint (see :mod:`verl.trainer.stop`); a resumed run's logs drop what an interrupted attempt
logged after the step it resumes from.

What a trainer provides (plain attributes and methods, no base class):

* ``global_step``, ``total_steps``, ``val_history`` (``[(step, metrics)]``), ``tracker``,
  ``watchdog`` and ``label`` (shown on the progress line);
* ``has_validation()``: whether there is a validation set;
* ``goal_reached()``: asked after each periodic validation; True ends the run there, as if that
  step were the last (the warm start stops at its held-out accuracy; the others never do);
* ``resume()``: load the checkpoint ``trainer.resume_mode`` points at, if any (most trainers:
  :func:`resume_from_checkpoint` over their ``state_dict``/``load_state_dict``);
* ``next_step()``: advance ``global_step`` by one and return that step's metrics;
* ``log_validation()``: validate, append to ``val_history`` and log;
* ``save_checkpoint()`` (most trainers: :func:`save_checkpoint`), ``export()`` (the Hugging Face
  folder), ``postfix(metrics)``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from verl.checkpoint import CheckpointManager
from verl.distributed.process_group import barrier
from verl.errors import NEW_RUN, VerlError
from verl.trainer.progress import Progress
from verl.trainer.stop import RunInterrupted, StopSignals

logger = logging.getLogger(__name__)


def save_checkpoint(checkpoints: CheckpointManager, step: int, state: dict) -> Path:
    """Write ``global_step_<step>`` of ``state`` (crash-safe: written aside, renamed into place).

    Every rank calls it with the state it gathered (gathering sharded weights is a collective); the
    manager's main process writes and every rank waits for it. A checkpoint holds full tensors, so it
    resumes at any world size."""
    if checkpoints.main:
        checkpoints.save(step, state)
    barrier()
    return checkpoints.step_dir(step)


def resume_from_checkpoint(trainer, checkpoints: CheckpointManager, trainer_cfg, *, announce: bool = True):
    """Load the checkpoint ``trainer.resume_mode`` points at, if any, into ``trainer.load_state_dict``;
    its folder, or None. ``announce``: the main process prints where it resumed from."""
    found = checkpoints.resume_state(trainer_cfg)
    if found is None:
        return None
    path, state = found
    trainer.load_state_dict(state)
    if announce and checkpoints.main:
        print(f"Resumed from {path} at step {trainer.global_step}", flush=True)
    return path


# Settings a resumed run may change without changing what is trained: how long it runs, where and
# how often it writes, what it reports. Every other changed key is named when the run resumes.
RUN_ONLY_SETTINGS = ("trainer.total_training_steps", "trainer.total_epochs", "trainer.resume_mode",
                     "trainer.resume_from_path", "trainer.default_local_dir", "trainer.default_hdfs_dir",
                     "trainer.save_freq", "trainer.test_freq", "trainer.val_before_train", "trainer.progress_bar",
                     "trainer.logger", "trainer.project_name", "trainer.experiment_name", "trainer.write_report",
                     "trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep", "trainer.max_ckpt_to_keep",
                     "trainer.dist_timeout_s",
                     "trainer.log_val_generations", "logger.")


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def changed_settings(saved: dict, current: dict) -> list[str]:
    """``key: old -> new`` for each setting of ``current`` that differs from the ``saved`` config of the
    run that wrote a checkpoint (nested dicts, as ``ConfigNode.to_dict``), run-only settings left out."""
    old, new = _flat(saved), _flat(current)
    return [f"{key}: {old.get(key)!r} -> {new.get(key)!r}" for key in sorted(old.keys() | new.keys())
            if old.get(key) != new.get(key) and not key.startswith(RUN_ONLY_SETTINGS)]


# What shapes the weights a checkpoint holds: LoRA adapters of this rank, scale and place, or all weights.
LORA_SETTINGS = ("lora_rank", "lora_alpha", "target_modules", "exclude_modules")


def refuse_changed_lora(saved: dict | None, current: dict, sections: tuple[str, ...], path) -> None:
    """Refuse, before any weight loads, to resume a checkpoint under other LoRA settings of a model section in
    ``sections`` (``"actor_rollout_ref.model"``): the checkpoint holds the weights of the model as it trained
    (adapters, or all weights), which another rank does not fit, and another alpha would silently rescale."""
    if saved is None:
        return
    old, new = _flat(saved), _flat(current)
    for section in sections:
        for name in LORA_SETTINGS:
            key = f"{section}.{name}"
            if old.get(key) != new.get(key):
                raise VerlError(f"cannot resume from {path} with {key}={new.get(key)!r}: it was saved with "
                                f"{key}={old.get(key)!r}, and holds the weights of that model (LoRA adapters with "
                                f"their rank and scale, or all weights with rank 0). Resume with {key}="
                                f"{old.get(key)!r}, or {NEW_RUN}")


def warn_changed_settings(saved: dict | None, current: dict, path) -> None:
    """Said once when a run resumes under settings other than those that saved ``path``: its weights,
    optimizer state and learning-rate schedule come from the checkpoint whatever the config now says."""
    changes = changed_settings(saved, current) if saved is not None else []
    if changes:
        shown = "; ".join(changes[:8]) + (f"; and {len(changes) - 8} more" if len(changes) > 8 else "")
        logger.warning("resuming from %s under %d setting(s) other than those of the run that saved it: %s. The "
                       "weights, the optimizer state and its learning-rate schedule come from the checkpoint (a "
                       "changed optim.lr does not apply); to train under the new settings from the start, set "
                       "trainer.resume_mode=disable or another trainer.default_local_dir", path, len(changes), shown)


def run_loop(trainer, cfg) -> None:
    """Train ``trainer`` to ``trainer.total_steps`` under the ``trainer`` config section ``cfg``
    (``val_before_train``, ``test_freq``, ``save_freq``, ``progress_bar``). Raises
    :class:`~verl.trainer.stop.RunInterrupted` after a stop on a signal."""
    watchdog = trainer.watchdog
    failed = True
    try:
        with watchdog.stage("resume"):
            trainer.resume()
        if trainer.global_step > trainer.total_steps and trainer.is_main:
            logger.warning("resumed at step %d, past this run's last step (%d): no step is trained, and the validation "
                           "and the export that follow are of step %d's weights. To stop at step %d, resume from its "
                           "checkpoint (trainer.resume_mode=resume_path trainer.resume_from_path=.../global_step_N) or "
                           "start over (trainer.resume_mode=disable)", trainer.global_step, trainer.total_steps,
                           trainer.global_step, trainer.total_steps)
        trainer.tracker.rewind(trainer.global_step)
        validating = trainer.has_validation() and (cfg.val_before_train or cfg.test_freq > 0)
        if validating and cfg.val_before_train and not trainer.val_history:
            with watchdog.stage("validate"):
                trainer.log_validation()
        stopped_by = _train(trainer, cfg, validating)
        if stopped_by is not None:
            failed = False
            watchdog.stop()
            raise RunInterrupted(stopped_by, f"stopped after step {trainer.global_step}, its checkpoint saved; run the "
                                             f"same command again to resume", clean=True)
        if validating and (not trainer.val_history or trainer.val_history[-1][0] != trainer.global_step):
            with watchdog.stage("validate"):
                trainer.log_validation()
        with watchdog.stage("export_hf"):
            trainer.export()
        failed = False
    finally:
        trainer.tracker.close(failed=failed)
    watchdog.stop()


def _train(trainer, cfg, validating: bool) -> int | None:
    """The steps, up to ``total_steps`` or a stop on a signal: the signal's number, else None."""
    watchdog = trainer.watchdog
    bar = Progress(trainer.total_steps, initial=trainer.global_step, enabled=cfg.progress_bar and trainer.is_main,
                   desc=trainer.label)
    try:
        with StopSignals(watchdog) as stop:
            while trainer.global_step < trainer.total_steps:
                with watchdog.stage("train_step", step=trainer.global_step + 1):
                    metrics = trainer.next_step()
                trainer.tracker.log(metrics, trainer.global_step)
                bar.update(trainer.postfix(metrics))
                last = trainer.global_step == trainer.total_steps
                if validating and cfg.test_freq > 0 and (trainer.global_step % cfg.test_freq == 0 or last):
                    with watchdog.stage("validate"):
                        trainer.log_validation()
                    last = last or trainer.goal_reached()
                saving = cfg.save_freq > 0 and (trainer.global_step % cfg.save_freq == 0 or last)
                signum = stop.requested()  # a collective: every rank stops after the same step
                if saving or signum is not None:
                    with watchdog.stage("save_checkpoint"):
                        trainer.save_checkpoint()
                    if signum is None:  # a signal during the save: this step's checkpoint is the one to stop on
                        signum = stop.requested()
                if signum is not None:
                    return signum
                if last:
                    break
    finally:
        bar.close()
    return None
