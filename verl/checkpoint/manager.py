"""Checkpoints that survive crashes: every save is written aside and renamed into place.

Layout under ``trainer.default_local_dir``::

    global_step_20/state.pt             everything needed to resume exactly
    latest_checkpointed_iteration.txt   the step of the newest complete checkpoint
    huggingface/                        the final policy, loadable with from_pretrained

A crash or Ctrl-C during a save leaves only a ``.tmp-*`` folder, which the next save removes;
the previous checkpoint and the pointer file are untouched until the new one is complete.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from verl.errors import VerlError

logger = logging.getLogger(__name__)

POINTER = "latest_checkpointed_iteration.txt"


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def restore_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointManager:
    def __init__(self, root: str | os.PathLike, max_to_keep: int | None = None):
        self.root = Path(root)
        self.max_to_keep = max_to_keep

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        pointer = self.root / POINTER
        if not pointer.exists():
            return None
        path = self.step_dir(int(pointer.read_text().strip()))
        return path if (path / "state.pt").exists() else None

    def resume_path(self, trainer_cfg) -> Path | None:
        """The checkpoint a run resumes from under ``trainer.resume_mode`` (None = start fresh).

        ``auto``: the newest complete checkpoint here, if any; ``disable``: none;
        ``resume_path``: ``trainer.resume_from_path``, which must hold a checkpoint.
        """
        if trainer_cfg.resume_mode == "disable":
            return None
        if trainer_cfg.resume_mode != "resume_path":
            return self.latest()
        if not trainer_cfg.resume_from_path:
            raise VerlError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N>")
        path = Path(trainer_cfg.resume_from_path)
        if not (path / "state.pt").exists():
            raise VerlError(f"trainer.resume_from_path={path} holds no checkpoint (no state.pt); give a "
                            f"global_step_N folder under a run's default_local_dir")
        return path

    def save(self, step: int, state: dict) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=".tmp-"))
        torch.save(state, tmp / "state.pt")
        final = self.step_dir(step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _atomic_write_text(self.root / POINTER, str(step))
        self._prune()
        logger.info("saved checkpoint %s", final)
        return final

    def load(self, path: str | os.PathLike) -> dict:
        return torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=False)

    def _prune(self) -> None:
        if not self.max_to_keep:
            return
        # Newest saves survive, whatever their step numbers (an older run's higher steps go first).
        saved = sorted((p for p in self.root.glob("global_step_*") if (p / "state.pt").exists()),
                       key=lambda p: (p / "state.pt").stat().st_mtime_ns)
        for path in saved[:-self.max_to_keep]:
            shutil.rmtree(path, ignore_errors=True)


def write_hf_folder(model: torch.nn.Module, tokenizer, target: str | os.PathLike, *,
                    state_dict: dict | None = None) -> Path:
    """Write ``model`` and ``tokenizer`` as a Hugging Face folder (safetensors), atomically, from
    this process alone. ``state_dict``: the full weights to write, for a sharded model (gathered
    beforehand by every rank: ``verl.distributed.fsdp.export_hf`` does both)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-hf-"))
    model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
    tokenizer.save_pretrained(tmp)
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    return target
