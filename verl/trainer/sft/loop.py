"""``OfflineTrainer``: the loop SFT, DPO and KTO share; each subclass brings its data and its step.

``fit()`` reads as the run: resume, validate, then one optimiser step per batch with logging,
periodic validation and crash-safe checkpoints, and finally the policy as a Hugging Face folder.
A subclass sets ``kind`` (which built-in rows it trains on) and implements:

* ``make_dataset(rows, source)``: tokenized rows;
* ``collate(items)``: a :class:`~verl.protocol.Batch` of them;
* ``update(batch)``: gradients and one optimiser step, returning metrics (``train/loss``, ...);
* ``validate()``: metrics on the validation set (``val/loss``, ...).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from verl.checkpoint import CheckpointManager, export_hf, restore_rng_state, rng_state
from verl.data.io import read_rows
from verl.data.offline import BatchLoader, Encoder, addition_rows
from verl.errors import VerlError
from verl.models.loading import resolve_device
from verl.protocol import Batch
from verl.tracking import Tracker
from verl.trainer.progress import Progress
from verl.trainer.sft.runtime import (TrainablePolicy, check_single_process, frozen_reference, load_policy,
                                      seed_everything)

BUILTIN_VAL_ROWS = 200  # held-out prompts of the built-in task used for validation


def offline_rows(data_cfg, kind: str) -> tuple[list[dict], list[dict] | None]:
    """(training rows, validation rows or None): from the files, or from the built-in task."""
    if data_cfg.train_files is None:
        if data_cfg.builtin_task != "addition":
            return _solution_rows(data_cfg, kind)
        val = read_rows(data_cfg.val_files, config_key="data.val_files") if data_cfg.val_files else \
            addition_rows(kind, "test", n=BUILTIN_VAL_ROWS, seed=data_cfg.seed)
        return addition_rows(kind, "train", seed=data_cfg.seed), val
    train = read_rows(data_cfg.train_files, config_key="data.train_files")
    val = read_rows(data_cfg.val_files, config_key="data.val_files") if data_cfg.val_files else None
    return train, val


def _solution_rows(data_cfg, kind: str) -> tuple[list[dict], list[dict]]:
    """SFT rows of a built-in task whose rows carry a worked solution (``extra_info.solution``)."""
    from verl.data.tasks import TASKS

    task = TASKS.get(data_cfg.builtin_task)
    if task is None or kind != "sft":
        offered = sorted(TASKS) if kind == "sft" else ["addition"]
        raise VerlError(f"built-in task {data_cfg.builtin_task!r} (data.builtin_task) has no {kind} data; the "
                        f"{kind} trainer's built-in tasks: {offered}. Or set data.train_files")

    def rows(split, n=None):
        return [{"prompt": r["prompt"], "response": r["extra_info"]["solution"]}
                for r in task.make_rows(split, n, data_cfg.seed)]
    val = read_rows(data_cfg.val_files, config_key="data.val_files") if data_cfg.val_files else \
        rows("test", BUILTIN_VAL_ROWS)
    return rows("train"), val


class OfflineTrainer:
    kind = "sft"  # rows of the built-in task: sft, preference or kto
    label = "SFT"  # shown on the progress line

    def __init__(self, config, *, with_reference: bool = False):
        check_single_process()
        config.validate()
        self.config = config
        data_cfg, trainer_cfg = config.data, config.trainer
        seed_everything(trainer_cfg.seed)
        self.device = resolve_device(trainer_cfg.device)
        model, self.tokenizer = load_policy(config.model)
        self.encoder = Encoder(self.tokenizer, max_length=data_cfg.max_length, truncation=data_cfg.truncation,
                               apply_chat_template=data_cfg.apply_chat_template,
                               chat_template_kwargs=dict(data_cfg.chat_template_kwargs))
        train_rows, val_rows = offline_rows(data_cfg, self.kind)
        self.train_set = self.make_dataset(train_rows, "data.train_files")
        self.val_set = self.make_dataset(val_rows, "data.val_files") if val_rows else None
        self.train_loader = BatchLoader(self.train_set, data_cfg.train_batch_size, self.collate,
                                        shuffle=data_cfg.shuffle, seed=data_cfg.seed)
        self.total_steps = trainer_cfg.total_training_steps or trainer_cfg.total_epochs * len(self.train_loader)
        # The reference is copied from the initial weights, before the policy wraps (and trains) them.
        self.ref_model = frozen_reference(model, config.ref, config.model, self.device) if with_reference else None
        self.policy = TrainablePolicy(model, config.model, config.optim, self.device, self.total_steps)
        self.micro_batch_size = data_cfg.micro_batch_size_per_gpu
        self.out_dir = Path(trainer_cfg.default_local_dir)
        self.checkpoints = CheckpointManager(self.out_dir, trainer_cfg.max_ckpt_to_keep)
        self.global_step = 0
        self.val_history: list[tuple[int, dict]] = []
        self.tracker: Tracker | None = None

    # ------------------------------------------------------------------ subclass hooks
    def make_dataset(self, rows: list[dict], source: str):
        raise NotImplementedError

    def collate(self, items: list[dict]) -> Batch:
        raise NotImplementedError

    def update(self, batch: Batch) -> dict[str, float]:
        raise NotImplementedError

    def validate(self) -> dict[str, float]:
        raise NotImplementedError

    def postfix(self, metrics: dict) -> str:
        return f"loss={metrics['train/loss']:.4f} lr={metrics['train/lr']:.2e}"

    # ------------------------------------------------------------------ helpers for steps
    def micro_batches(self, batch: Batch) -> list[Batch]:
        parts = batch.split(self.micro_batch_size) if self.micro_batch_size else [batch]
        return [mb.to(self.device) for mb in parts]

    def val_batches(self):
        """The validation set in batches of the micro-batch size (all at once when that is null)."""
        size = self.micro_batch_size or len(self.val_set)
        for start in range(0, len(self.val_set), size):
            items = [self.val_set[i] for i in range(start, min(start + size, len(self.val_set)))]
            yield self.collate(items).to(self.device)

    # ------------------------------------------------------------------ the run
    def step(self, batch: Batch) -> dict[str, float]:
        """One optimiser step on ``batch`` (a batch of this trainer's ``collate``); it counts
        towards ``total_steps``. Returns the step's metrics."""
        self.global_step += 1
        start = time.perf_counter()
        metrics = self.update(batch)
        metrics["timing_s/step"] = time.perf_counter() - start
        return metrics

    def fit(self) -> dict:
        """Train for ``total_steps`` optimiser steps (resuming when a checkpoint exists); return
        ``{"steps", "validation": [(step, metrics), ...], "out_dir"}``."""
        cfg = self.config.trainer
        self._open_outputs()
        self._maybe_resume()
        validating = self.val_set is not None and (cfg.val_before_train or cfg.test_freq > 0)
        if validating and cfg.val_before_train and not self.val_history:
            self._log_validation()
        bar = Progress(self.total_steps, initial=self.global_step, enabled=cfg.progress_bar, desc=self.label)
        try:
            while self.global_step < self.total_steps:
                metrics = self.step(next(self.train_loader))
                metrics["train/epoch"] = self.train_loader.epoch
                self.tracker.log(metrics, self.global_step)
                bar.update(self.postfix(metrics))
                last = self.global_step == self.total_steps
                if self.val_set is not None and cfg.test_freq > 0 and (self.global_step % cfg.test_freq == 0 or last):
                    self._log_validation()
                if cfg.save_freq > 0 and (self.global_step % cfg.save_freq == 0 or last):
                    self.save_checkpoint()
        finally:
            bar.close()
        if validating and (not self.val_history or self.val_history[-1][0] != self.global_step):
            self._log_validation()
        export_hf(self.policy.model, self.tokenizer, self.out_dir / "huggingface")
        self.tracker.close()
        return {"steps": self.global_step, "validation": self.val_history, "out_dir": self.out_dir}

    def _open_outputs(self) -> None:
        cfg = self.config.trainer
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "config.yaml").write_text(self.config.to_yaml())
        self.tracker = Tracker(cfg.logger, self.out_dir, project=cfg.project_name, experiment=cfg.experiment_name,
                               config=self.config.to_dict(), progress_bar=cfg.progress_bar)

    def _log_validation(self) -> None:
        was_training = self.policy.model.training
        self.policy.model.eval()
        try:
            with torch.no_grad():
                metrics = self.validate()
        finally:
            self.policy.model.train(was_training)
        self.val_history.append((self.global_step, metrics))
        self.tracker.log(metrics, self.global_step)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {"global_step": self.global_step, "policy": self.policy.state_dict(),
                "loader": self.train_loader.state_dict(), "rng": rng_state(), "val_history": self.val_history}

    def load_state_dict(self, state: dict) -> None:
        self.global_step = state["global_step"]
        self.policy.load_state_dict(state["policy"])
        self.train_loader.load_state_dict(state["loader"])
        restore_rng_state(state["rng"])
        self.val_history = state["val_history"]

    def save_checkpoint(self) -> Path:
        """Write ``default_local_dir/global_step_N`` (crash-safe: written aside, renamed into place)."""
        return self.checkpoints.save(self.global_step, self.state_dict())

    def _maybe_resume(self) -> None:
        cfg = self.config.trainer
        path = self.checkpoints.resume_path(cfg)
        if path is None:
            return
        self.load_state_dict(self.checkpoints.load(path))
        if cfg.progress_bar:
            print(f"Resumed from {path} at step {self.global_step}", flush=True)
