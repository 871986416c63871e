"""The checkpoint engine: how the trainer's weights reach a rollout that holds its own copy.

One seam, three backends, chosen by ``async_training.checkpoint_engine.backend``:

* ``memory``: the state dict is cloned and handed over in this process (a rollout thread);
* ``shm``: the clone's tensors are moved to shared memory; the message that crosses to the rollout
  process carries only their handles (torch.multiprocessing), so the weights are copied once, by
  the trainer, and mapped by the rollout;
* ``file``: a safetensors file written aside and renamed into place; the message carries its path
  (a rollout on another machine with a shared folder; the rollout deletes it once loaded).

The sender stamps every message with its policy version and measures what it cost
(:class:`SyncCost`); the rollout side calls :func:`unpack`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

BACKENDS = ("memory", "shm", "file")


@dataclass
class WeightMessage:
    """One version of the weights on its way to the rollout: ``tensors`` (memory, shm) or ``path`` (file)."""

    version: int
    backend: str
    tensors: dict[str, torch.Tensor] | None = None
    path: str | None = None
    nbytes: int = 0


@dataclass
class SyncCost:
    """The trainer-side cost of one message: seconds to pack it, bytes it holds."""

    seconds: float
    nbytes: int


class WeightSender:
    """Packs the trainer's state dicts into :class:`WeightMessage` s of one backend."""

    def __init__(self, backend: str, folder: str | os.PathLike | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"checkpoint engine backend {backend!r}: choose one of {BACKENDS}")
        if backend == "file" and folder is None:
            raise ValueError("the file backend of the checkpoint engine needs a folder")
        self.backend = backend
        self.folder = Path(folder) if folder is not None else None

    def pack(self, state: dict[str, torch.Tensor], version: int) -> tuple[WeightMessage, SyncCost]:
        start = time.perf_counter()
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        if self.backend == "file":
            from safetensors.torch import save_file

            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"weights_v{version}.safetensors"
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            # A copy of each: tied weights (embeddings and lm_head) share memory, which safetensors refuses.
            save_file({k: t.detach().to("cpu", copy=True).contiguous() for k, t in state.items()}, str(tmp))
            tmp.replace(path)
            message = WeightMessage(version, "file", path=str(path), nbytes=nbytes)
        else:
            # A copy the trainer's next update cannot touch; in shared memory for another process.
            tensors = {k: t.detach().to("cpu", copy=True) for k, t in state.items()}
            if self.backend == "shm":
                for tensor in tensors.values():
                    tensor.share_memory_()
            message = WeightMessage(version, self.backend, tensors=tensors, nbytes=nbytes)
        return message, SyncCost(time.perf_counter() - start, nbytes)


def unpack(message: WeightMessage) -> dict[str, torch.Tensor]:
    """The rollout side: the state dict a message carries (a file is read, then deleted)."""
    if message.backend == "file":
        from safetensors.torch import load_file

        state = load_file(message.path)
        Path(message.path).unlink(missing_ok=True)
        return state
    return message.tensors
