"""``OfflineTrainer``: the loop SFT, DPO and KTO share; each subclass brings its data and its loss.

``fit()`` reads as the run: resume, validate, then one optimiser step per batch with logging,
periodic validation and crash-safe checkpoints, and finally the policy as a Hugging Face folder.
A subclass sets ``kind`` (which built-in rows it trains on) and implements:

* ``make_dataset(rows, source)``: tokenized rows;
* ``collate(items)``: a :class:`~verl.protocol.Batch` of them;
* ``update(batch)``: one optimiser step on this rank's share of a step's batch through
  ``self.policy.train_batch`` (a :class:`~verl.workers.engine.TrainingEngine`), returning metrics
  (``train/loss``, ...);
* ``validate()``: metrics on the validation set (``val/loss``, ...), over all ranks;

and may replace ``rows()`` (where the rows come from), ``make_policy(model)`` (how the model
trains) and ``goal_reached()`` (a reason to stop before ``total_steps``), and set ``replacement``.

Data parallel (torchrun): every rank reads the same rows and draws the same batches; each trains
on its contiguous share of every step's batch, the losses normalised by the step's counts over all
ranks, so the update is the one of one process on the whole batch. Each rank validates on its
share of the validation set and the results are combined. Rank 0 alone prints, logs and writes
files; every rank takes part in gathering the full state dicts (a collective under FSDP2).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from verl.checkpoint import CheckpointManager, restore_rng_state, rng_state
from verl.data.offline import BatchLoader, Encoder
from verl.distributed.fsdp import export_hf
from verl.distributed.process_group import (ensure_process_group, is_main_process, launched_world_size, rank,
                                            world_size)
from verl.distributed.watchdog import Watchdog
from verl.distributed.worker_group import shard_rows
from verl.errors import VerlError, naming_the_file
from verl.models.loading import resolve_device
from verl.models.lora import BaseView, lora_requested
from verl.protocol import Batch
from verl.tracking import Tracker
from verl.trainer.nonfinite import NonfiniteGuard
from verl.trainer.offline.rows import offline_rows
from verl.trainer.offline.runtime import frozen_reference, load_policy, trainable_policy
from verl.trainer.run_loop import (refuse_changed_lora, resume_from_checkpoint, run_loop, save_checkpoint,
                                  warn_changed_settings)
from verl.utils.seed import seed_everything

logger = logging.getLogger(__name__)


class OfflineTrainer:
    kind = "sft"  # rows of the built-in task: sft, preference or kto
    label = "SFT"  # shown on the progress line
    replacement = False  # each batch drawn from all rows anew, instead of epochs of one permutation each

    def __init__(self, config, *, with_reference: bool = False):
        config.validate(dp_size=launched_world_size())
        # Under torchrun: collectives time out a minute after the watchdog would report a lost rank.
        ensure_process_group(timeout_s=config.trainer.dist_timeout_s)
        self.rank, self.world, self.is_main = rank(), world_size(), is_main_process()
        self.nonfinite = NonfiniteGuard(config.trainer.max_nonfinite_steps, {"update": ("train", "optim.lr")},
                                        warn=self.is_main)
        self.watchdog = Watchdog.start(config.trainer.dist_timeout_s)  # inert in one process
        self.config = config
        data_cfg, trainer_cfg = config.data, config.trainer
        seed_everything(trainer_cfg.seed)
        self.device = resolve_device(trainer_cfg.device)
        model, self.tokenizer = load_policy(config.model)
        self.encoder = Encoder(self.tokenizer, max_length=data_cfg.max_length, truncation=data_cfg.truncation,
                               apply_chat_template=data_cfg.apply_chat_template,
                               chat_template_kwargs=dict(data_cfg.chat_template_kwargs))
        train_rows, val_rows = self.rows()
        self.train_set = self.make_dataset(train_rows, "data.train_files")
        self.val_set = self.make_dataset(val_rows, "data.val_files") if val_rows else None
        self.train_loader = BatchLoader(self.train_set, data_cfg.train_batch_size, self.collate,
                                        shuffle=data_cfg.shuffle, seed=data_cfg.seed, replacement=self.replacement)
        self.total_steps = trainer_cfg.total_training_steps or trainer_cfg.total_epochs * len(self.train_loader)
        # The reference is copied from the initial weights, before the policy wraps (and trains) them;
        # with new LoRA adapters it is the policy with its adapters off (the same weights, no copy).
        base_is_reference = with_reference and not config.ref.path and lora_requested(config.model) and \
            config.model.lora_adapter_path is None
        self.ref_model = frozen_reference(model, config.ref, config.model, self.device) \
            if with_reference and not base_is_reference else None
        self.policy = self.make_policy(model)
        if base_is_reference:
            self.ref_model = BaseView(self.policy.model)
        self.micro_batch_size = data_cfg.micro_batch_size_per_gpu
        self.out_dir = Path(trainer_cfg.default_local_dir).expanduser()
        self.checkpoints = CheckpointManager(self.out_dir, trainer_cfg.max_ckpt_to_keep, main=self.is_main)
        self.global_step = 0
        self.val_history: list[tuple[int, dict]] = []
        self.tracker: Tracker | None = None

    # ------------------------------------------------------------------ subclass hooks
    def rows(self) -> tuple[list[dict], list[dict] | None]:
        """(training rows, validation rows or None): the configured files, else the built-in task's."""
        return offline_rows(self.config.data, self.kind)

    def make_policy(self, model: torch.nn.Module):
        """The :class:`~verl.workers.engine.TrainingEngine` that trains ``model`` (sharded by
        ``model.fsdp_config``, the optimiser and schedule of ``optim``)."""
        return trainable_policy(model, self.config, self.device, self.total_steps)

    def goal_reached(self) -> bool:
        """Whether the run may stop before ``total_steps`` (asked after each validation): never, unless
        a subclass sets a goal (the demo's warm start: a held-out accuracy)."""
        return False

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
    def shard(self, batch: Batch) -> Batch:
        """This rank's contiguous share of a step's batch (all of it in one process)."""
        rows = shard_rows(len(batch), self.world, block=len(batch))[self.rank]  # one block: contiguous, unpadded
        share = batch.index(rows)
        # Which rows each rank trains on; the checksums (sums of the integer columns) of the ranks'
        # shares add up to that of the whole batch.
        if logger.isEnabledFor(logging.DEBUG):
            start, stop = (rows[0], rows[-1] + 1) if rows else (0, 0)
            checksum = sum(int(t.sum()) for t in share.tensors.values() if not t.is_floating_point())
            logger.debug("rank %d of %d, step %d: rows %d:%d of %d, checksum %d", self.rank, self.world,
                         self.global_step, start, stop, len(batch), checksum)
        return share

    def val_batches(self):
        """This rank's share of the validation set (:func:`shard_rows`: contiguous and equal) as
        ``(batch, n)`` in batches of the micro-batch size (the whole share when that is null), of which
        the first ``n`` rows count. Every rank runs as many batches (FSDP's forward is a collective), so
        a rank short of rows ends with copies of the last row, which do not count."""
        total = len(self.val_set)
        rows = shard_rows(total, self.world)[self.rank]
        counted = max(0, min(len(rows), total - self.rank * len(rows)))  # the padding comes last
        size = self.micro_batch_size or len(rows)
        for start in range(0, len(rows), size):
            chunk = rows[start:start + size]
            yield (self.collate([self.val_set[r] for r in chunk]).to(self.device),
                   max(0, min(len(chunk), counted - start)))

    # ------------------------------------------------------------------ the run
    def step(self, batch: Batch) -> dict[str, float]:
        """One optimiser step on ``batch`` (a batch of this trainer's ``collate``, the same on every
        rank); it counts towards ``total_steps``. Returns the step's metrics. A dict of its tensors is taken as the
        Batch, and integer token ids or positions of another dtype (int32) as int64."""
        batch = self._typed_batch(batch)
        self.global_step += 1
        start = time.perf_counter()
        metrics = self.update(self.shard(batch))
        metrics["timing_s/step"] = time.perf_counter() - start
        return metrics

    def _typed_batch(self, batch) -> Batch:
        """Before: a dict (``batch.to_dict()``, a collate of one's own) failed with "'dict' object has no attribute
        'index'", and int32 ids inside the loss with "expected target dtype to be Long or Byte, but got Int"."""
        if isinstance(batch, Mapping) and all(isinstance(v, torch.Tensor) for v in batch.values()):
            batch = Batch(dict(batch))
        if not isinstance(batch, Batch):
            raise VerlError(f"{type(self).__name__}.step takes a verl.protocol.Batch of tensors, as "
                            f"next(trainer.train_loader) gives it (or a dict of its tensors), got {type(batch).__name__}")
        ids = {k: v.long() for k, v in batch.tensors.items() if k.endswith(("input_ids", "position_ids"))
               and v.dtype not in (torch.long, torch.bool) and not v.is_floating_point() and not v.is_complex()}
        return Batch({**batch.tensors, **ids}, batch.non_tensors, batch.meta) if ids else batch

    def fit(self) -> dict:
        """Train for ``total_steps`` optimiser steps (resuming when a checkpoint exists); return
        ``{"steps", "validation": [(step, metrics), ...], "out_dir"}``."""
        self._open_outputs()
        run_loop(self, self.config.trainer)
        return {"steps": self.global_step, "validation": self.val_history, "out_dir": self.out_dir}

    # ------------------------------------------------------------------ what run_loop calls
    def has_validation(self) -> bool:
        return self.val_set is not None

    def next_step(self) -> dict[str, float]:
        metrics = self.step(next(self.train_loader))
        metrics["train/epoch"] = self.train_loader.epoch
        self.nonfinite.observe(self.global_step, metrics, lambda m: self.tracker.log(m, self.global_step))
        return metrics

    def export(self, target: Path | None = None) -> None:
        """Write the policy as a Hugging Face folder, by default ``default_local_dir/huggingface``
        (every rank gathers the weights, rank 0 writes)."""
        export_hf(self.policy.model, self.tokenizer, target or self.out_dir / "huggingface")

    def _open_outputs(self) -> None:
        cfg = self.config.trainer
        if self.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with naming_the_file(self.out_dir / "config.yaml"):
                (self.out_dir / "config.yaml").write_text(self.config.to_yaml())
        self.tracker = Tracker(cfg.logger, self.out_dir, project=cfg.project_name, experiment=cfg.experiment_name,
                               config=self.config.to_dict(), progress_bar=cfg.progress_bar, record=self.is_main)

    def log_validation(self) -> None:
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
        """The run's state, with the full (unsharded) weights: a collective, every rank calls it."""
        return {"global_step": self.global_step, "policy": self.policy.state_dict(),
                "loader": self.train_loader.state_dict(), "rng": rng_state(), "val_history": self.val_history,
                "config": self.config.to_dict()}  # a resume under other settings is told which

    def load_state_dict(self, state: dict) -> None:
        refuse_changed_lora(state.get("config"), self.config.to_dict(), ("model",), self.checkpoints.root)
        if self.is_main:
            warn_changed_settings(state.get("config"), self.config.to_dict(), self.checkpoints.root)
        self.global_step = state["global_step"]
        self.policy.load_state_dict(state["policy"])
        self.train_loader.load_state_dict(state["loader"])
        restore_rng_state(state["rng"])
        self.val_history = state["val_history"]

    def save_checkpoint(self) -> Path:
        """Write ``default_local_dir/global_step_N`` (see :func:`verl.trainer.run_loop.save_checkpoint`)."""
        return save_checkpoint(self.checkpoints, self.global_step, self.state_dict())

    def resume(self) -> None:
        """Load the checkpoint ``trainer.resume_mode`` points at, if any."""
        cfg = self.config.trainer
        resume_from_checkpoint(self, self.checkpoints, cfg, announce=cfg.progress_bar)

