"""The checkpoint engine: how the trainer's weights reach a rollout that holds its own copy.

One seam, four backends, chosen by ``async_training.checkpoint_engine.backend``:

* ``memory``: the state dict is cloned and handed over in this process (a rollout thread);
* ``shm``: the clone's tensors are moved to shared memory; the message that crosses to the rollout
  process carries only their handles (torch.multiprocessing), so the weights are copied once, by
  the trainer, and mapped by the rollout;
* ``file``: a safetensors file written aside and renamed into place; the message carries its path
  (a rollout on another machine with a shared folder; the rollout deletes it once loaded);
* ``broadcast``: a torch.distributed broadcast over a group of its own (the trainer's rank 0 and the
  rollout processes; gloo, over TCP, so it crosses machines): the weights are packed
  into one flat buffer per dtype and sent without waiting; the message carries only their layout,
  and the rollout receives the buffers when it loads it (:class:`BroadcastChannel`).

The sender stamps every message with its policy version and measures what it cost
(:class:`SyncCost`); the rollout side calls :func:`unpack`. Every message is unpacked, in order
(a broadcast is a collective: a message skipped would leave the next one reading its bytes).
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from verl.errors import VerlError

BACKENDS = ("memory", "shm", "file", "broadcast")


@dataclass
class WeightMessage:
    """One version of the weights on its way to the rollout: ``tensors`` (memory, shm), ``path`` (file)
    or the ``layout`` of the buffers broadcast (name, dtype, shape, offset in its dtype's buffer)."""

    version: int
    backend: str
    tensors: dict[str, torch.Tensor] | None = None
    path: str | None = None
    nbytes: int = 0
    layout: list[tuple[str, str, tuple[int, ...], int]] | None = None


class BroadcastChannel:
    """A torch.distributed group apart from any the trainer is in: the trainer (root, rank 0) and the
    rollout processes (ranks 1 .. members), met through a TCP store the trainer opens.

    The trainer side: :meth:`open` (before the rollout processes start: its :attr:`address` goes to
    them), then :meth:`connect` once they have; the rollout side: :meth:`join` with its rank. Sends never
    wait (the buffers are kept until their broadcast completes); a receive waits at most ``timeout_s``."""

    def __init__(self, store, rank: int, timeout_s: float, world: int = 2):
        self.store, self.rank, self.timeout = store, rank, datetime.timedelta(seconds=timeout_s)
        self.world = world
        self.group = None
        self.in_flight: list[tuple[list, list[torch.Tensor]]] = []
        """Sends not yet received: their works, and the buffers they read."""

    @property
    def address(self) -> tuple[str, int, float, int]:
        """Where the rollout processes meet the trainer: host, port, timeout and the group's size."""
        return "127.0.0.1" if self.store.host in ("", "0.0.0.0") else self.store.host, self.store.port, \
            self.timeout.total_seconds(), self.world

    @classmethod
    def open(cls, timeout_s: float, members: int = 1, host: str | None = None) -> "BroadcastChannel":
        """The trainer's end of a channel to ``members`` rollout processes, reached at ``host`` (default
        ``VERL_WEIGHT_SYNC_HOST``, else the loopback)."""
        import torch.distributed as dist

        host = host or os.environ.get("VERL_WEIGHT_SYNC_HOST", "127.0.0.1")
        store = dist.TCPStore(host, 0, members + 1, True, datetime.timedelta(seconds=timeout_s),
                              wait_for_workers=False)
        return cls(store, 0, timeout_s, world=members + 1)

    def connect(self, gone) -> None:
        """Build the trainer's end, waiting for every rollout process to join; ``gone()`` says why one can
        no longer join (it died), checked while waiting."""
        import torch.distributed as dist

        built: dict = {}

        def build():
            try:
                built["group"] = dist.ProcessGroupGloo(self.store, 0, self.world, self.timeout)
            except BaseException as e:  # noqa: BLE001 - said below
                built["error"] = e
        thread = threading.Thread(target=build, name="verl-weight-broadcast", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.2)
            why = gone()
            if why is not None and thread.is_alive():
                raise VerlError(f"the rollout process {why} before joining the weight broadcast "
                                f"(async_training.checkpoint_engine.backend=broadcast)")
        if "error" in built:
            raise VerlError(f"the rollout process did not join the weight broadcast within "
                            f"{self.timeout.total_seconds():.0f} s (trainer.dist_timeout_s): {built['error']}")
        self.group = built["group"]

    @classmethod
    def join(cls, address: tuple[str, int, float, int], rank: int = 1) -> "BroadcastChannel":
        """A rollout process's end (``rank`` 1 .. members) of the channel at ``address``."""
        import torch.distributed as dist

        host, port, timeout_s, world = address
        store = dist.TCPStore(host, port, world, False, datetime.timedelta(seconds=timeout_s))
        channel = cls(store, rank, timeout_s, world=world)
        channel.group = dist.ProcessGroupGloo(store, rank, world, channel.timeout)
        return channel

    def _broadcast(self, buffer: torch.Tensor):
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        return self.group.broadcast([buffer], opts)

    def send(self, buffers: list[torch.Tensor]) -> None:
        self.in_flight = [(works, kept) for works, kept in self.in_flight
                          if not all(work.is_completed() for work in works)]
        self.in_flight.append(([self._broadcast(buffer) for buffer in buffers], buffers))

    def receive(self, buffers: list[torch.Tensor]) -> None:
        for buffer in buffers:
            self._broadcast(buffer).wait(self.timeout)

    def close(self) -> None:
        """Forget the sends not received: the rollout is gone or closing, and will not take them."""
        self.in_flight = []


@dataclass
class SyncCost:
    """The trainer-side cost of one message: seconds to pack it, bytes it holds."""

    seconds: float
    nbytes: int


class WeightSender:
    """Packs the trainer's state dicts into :class:`WeightMessage` s of one backend."""

    def __init__(self, backend: str, folder: str | os.PathLike | None = None,
                 channel: BroadcastChannel | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"checkpoint engine backend {backend!r}: choose one of {BACKENDS}")
        if backend == "file" and folder is None:
            raise ValueError("the file backend of the checkpoint engine needs a folder")
        self.backend = backend
        self.folder = Path(folder) if folder is not None else None
        self.channel = channel

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
        elif self.backend == "broadcast":
            layout, buffers = flatten(state)
            self.channel.send(buffers)
            message = WeightMessage(version, "broadcast", layout=layout, nbytes=nbytes)
        else:
            # A copy the trainer's next update cannot touch; in shared memory for another process.
            tensors = {k: t.detach().to("cpu", copy=True) for k, t in state.items()}
            if self.backend == "shm":
                for tensor in tensors.values():
                    tensor.share_memory_()
            message = WeightMessage(version, self.backend, tensors=tensors, nbytes=nbytes)
        return message, SyncCost(time.perf_counter() - start, nbytes)


def flatten(state: dict[str, torch.Tensor]) -> tuple[list, list[torch.Tensor]]:
    """The tensors of ``state`` copied into one flat CPU buffer per dtype, and where each one lies."""
    dtypes = sorted({str(t.dtype) for t in state.values()})
    layout, sizes = [], dict.fromkeys(dtypes, 0)
    for name, tensor in state.items():
        dtype = str(tensor.dtype)
        layout.append((name, dtype, tuple(tensor.shape), sizes[dtype]))
        sizes[dtype] += tensor.numel()
    buffers = {d: torch.empty(sizes[d], dtype=_dtype(d)) for d in dtypes}
    for (name, dtype, _, offset), tensor in zip(layout, state.values()):
        buffers[dtype][offset:offset + tensor.numel()].copy_(tensor.detach().reshape(-1))
    return layout, [buffers[d] for d in dtypes]


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def unflatten(layout, receive) -> dict[str, torch.Tensor]:
    """The state dict of ``layout``, its buffers filled by ``receive(buffers)`` (in :func:`flatten`'s order)."""
    dtypes = sorted({dtype for _, dtype, _, _ in layout})
    sizes = dict.fromkeys(dtypes, 0)
    for _, dtype, shape, offset in layout:
        sizes[dtype] = max(sizes[dtype], offset + int(torch.Size(shape).numel()))
    buffers = {d: torch.empty(sizes[d], dtype=_dtype(d)) for d in dtypes}
    receive([buffers[d] for d in dtypes])
    return {name: buffers[dtype][offset:offset + int(torch.Size(shape).numel())].view(shape)
            for name, dtype, shape, offset in layout}


def unpack(message: WeightMessage, channel: BroadcastChannel | None = None) -> dict[str, torch.Tensor]:
    """The rollout side: the state dict a message carries (a file is read, then deleted; a broadcast
    received through ``channel``)."""
    if message.backend == "broadcast":
        return unflatten(message.layout, channel.receive)
    if message.backend == "file":
        from safetensors.torch import load_file

        state = load_file(message.path)
        Path(message.path).unlink(missing_ok=True)
        return state
    return message.tensors
