"""Placement of role workers: the one contract the controller talks to, and its backends.

The controller (``fit()``) never touches a worker; it calls its role's group:

* ``group.run(method, batch, **kwargs)``: data-parallel work. The group splits ``batch`` over
  its ranks, each rank's worker runs ``method`` on its share, and the results come back
  concatenated in the original row order (a ``Batch`` or tensor; a dict of metrics, which the
  workers already reduced over the ranks, comes back as it is). ``block=k`` splits every block
  of ``k`` rows over the ranks instead of the whole batch, so rank ``r``'s ``i``-th share is its
  part of block ``i``: an update whose mini-batches are blocks then trains on exactly the
  mini-batches one process would. ``private=(columns...)`` names result columns that only later
  calls of the same group read, never the controller: a group whose workers live in other
  processes (Ray) keeps them there, matched to rows by a ``sample_id`` column it adds, until
  ``group.end_step()``; the others return them like any column.
* ``group.call(method, *args, **kwargs)``: every rank's worker runs ``method`` with the same
  arguments (state dicts, exports, settings); the result of rank 0's worker, which for these
  methods is the same everywhere, comes back.

Backends: :class:`LocalWorkerGroup` (the worker in this process; breakpoints and tracebacks work
as usual) and :class:`SPMDWorkerGroup` (torchrun: every process runs the controller and holds one
rank of each role; "splitting" is each rank taking its share, "gathering" an all-gather).
:func:`make_worker_group` picks the one that fits how the process was launched.

Both log the data flow at INFO level on ``verl.dataflow`` (method, rows, shapes, bytes, time)
and turn an out-of-memory error inside a worker into a VerlError naming the role and the
settings that lower its memory use (``verl.utils.preflight.explain_oom``).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod

import torch

from verl.distributed import process_group
from verl.distributed.watchdog import Watchdog
from verl.protocol import Batch
from verl.utils.preflight import explain_oom

logger = logging.getLogger("verl.dataflow")


def _nbytes(value) -> int:
    if isinstance(value, Batch):
        return value.nbytes()
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor{list(value.shape)} on {value.device}"
    if not isinstance(value, Batch):
        return type(value).__name__
    shapes = ", ".join(f"{k}{list(v.shape)}" for k, v in value.tensors.items())
    devices = "+".join(sorted({str(t.device) for t in value.tensors.values()})) or "-"
    return f"{len(value)} rows [{shapes}] {value.nbytes()} bytes on {devices}"


class Traffic:
    """Tensor bytes that the groups moved between processes from its creation on, as the step's
    ``perf/bytes_to_workers``, ``perf/bytes_from_workers`` and ``perf/bytes_moved`` (0 in one process)."""

    def __init__(self, groups):
        self.groups = [group for group in groups if group is not None]
        self.start = self._totals()

    def _totals(self) -> tuple[int, int]:
        return (sum(g.bytes_to_workers for g in self.groups), sum(g.bytes_from_workers for g in self.groups))

    def metrics(self) -> dict[str, int]:
        (to_now, from_now), (to_start, from_start) = self._totals(), self.start
        sent, received = to_now - to_start, from_now - from_start
        return {"perf/bytes_to_workers": sent, "perf/bytes_from_workers": received, "perf/bytes_moved": sent + received}


def shard_rows(num_rows: int, world: int, block: int | None = None) -> list[list[int]]:
    """The rows each of ``world`` ranks takes, in order.

    Without ``block``: contiguous, equal shares; when ``num_rows`` does not divide, the last
    shares are padded with copies of the last row (their results are dropped when gathering),
    so every rank runs equally many rows (FSDP's collectives need the same calls on all ranks).
    With ``block``: every block of ``block`` rows is cut into ``world`` contiguous parts, rank
    ``r`` takes part ``r`` of every block, and nothing is padded (an update must not count a row
    twice); a last, shorter block is cut as evenly as it goes.
    """
    if block is None:
        per_rank = -(-num_rows // world)
        return [[min(i, num_rows - 1) for i in range(r * per_rank, (r + 1) * per_rank)] for r in range(world)]
    rows: list[list[int]] = [[] for _ in range(world)]
    for start in range(0, num_rows, block):
        size = min(block, num_rows - start)
        bounds = [start + size * r // world for r in range(world + 1)]
        for r in range(world):
            rows[r].extend(range(bounds[r], bounds[r + 1]))
    return rows


class WorkerGroup(ABC):
    """A role's workers, wherever they run. See the module docstring for the contract."""

    def __init__(self, name: str, world_size: int):
        self.name = name
        self.world_size = world_size
        self.bytes_sent = 0
        """Tensor bytes handed to this process's worker (its share of every batch)."""
        self.bytes_received = 0
        """Tensor bytes of the results, as the controller holds them (the whole gathered batch)."""
        self.bytes_to_workers = 0
        """Tensor bytes sent from the controller's process to other processes (Ray: the shares
        and arguments shipped to the actors; 0 in one process and under torchrun, where every rank
        already holds the batch)."""
        self.bytes_from_workers = 0
        """Tensor bytes of results that came back from other processes (Ray: from the actors;
        torchrun: the other ranks' shares of each all-gather)."""

    @property
    def bytes_moved(self) -> int:
        """Tensor bytes that crossed between processes, both ways (0 in one process)."""
        return self.bytes_to_workers + self.bytes_from_workers

    @abstractmethod
    def run(self, method: str, batch: Batch | None = None, *, block: int | None = None,
            private: tuple[str, ...] = (), **kwargs):
        """Data-parallel ``method`` over ``batch`` (see the module docstring, ``private`` included)."""

    def end_step(self) -> None:
        """The step's data is done: forget the private columns the workers kept (a no-op where none are)."""

    @abstractmethod
    def call(self, method: str, *args, **kwargs):
        """``method`` on every rank's worker with the same arguments; rank 0's result."""

    def _invoke(self, worker, method: str, args: tuple, kwargs: dict):
        with explain_oom(self.name, method=method):
            return getattr(worker, method)(*args, **kwargs)

    def _log(self, method: str, sent, result, start: float, where: str = "") -> None:
        if logger.isEnabledFor(logging.INFO):
            logger.info("%s%s.%s: sent %s -> returned %s, %.3fs", where, self.name, method,
                        _describe(sent) if sent is not None else "-", _describe(result),
                        time.perf_counter() - start)


class LocalWorkerGroup(WorkerGroup):
    """One worker, in this process (world size 1)."""

    def __init__(self, worker, name: str):
        super().__init__(name, 1)
        self.worker = worker

    def run(self, method: str, batch: Batch | None = None, *, block: int | None = None,
            private: tuple[str, ...] = (), **kwargs):
        start = time.perf_counter()
        result = self._invoke(self.worker, method, () if batch is None else (batch,), kwargs)
        self.bytes_sent += _nbytes(batch)
        self.bytes_received += _nbytes(result)
        self._log(method, batch, result, start)
        return result

    def call(self, method: str, *args, **kwargs):
        return self._invoke(self.worker, method, args, kwargs)


class SPMDWorkerGroup(WorkerGroup):
    """Rank ``r`` of a torchrun job: this process's worker is the role's rank ``r``.

    Every rank runs the same controller code on the same data, so each takes its own share of a
    batch without any message, and an all-gather gives every rank the whole result: the
    controller's next steps (advantages, metrics) see the whole batch on every rank.
    """

    def __init__(self, worker, name: str, watchdog: Watchdog):
        super().__init__(name, process_group.world_size())
        self.worker = worker
        self.rank = process_group.rank()
        self.watchdog = watchdog

    def _invoke(self, worker, method: str, args: tuple, kwargs: dict):
        # A rank that dies or hangs in here is reported with this stage's name (role.method).
        with self.watchdog.stage(f"{self.name}.{method}"):
            return super()._invoke(worker, method, args, kwargs)

    def run(self, method: str, batch: Batch | None = None, *, block: int | None = None,
            private: tuple[str, ...] = (), **kwargs):
        start = time.perf_counter()
        if batch is None:
            return self._invoke(self.worker, method, (), kwargs)
        rows = shard_rows(len(batch), self.world_size, block)
        share = batch.index(rows[self.rank])
        result = self._invoke(self.worker, method, (share,), kwargs)
        self.bytes_sent += _nbytes(share)
        if isinstance(result, (Batch, torch.Tensor)):
            result = self._gather(result, rows, len(batch))
            self.bytes_received += _nbytes(result)
        where = f"rank {self.rank}/{self.world_size} rows {_spans(rows[self.rank])} "
        self._log(method, share, result, start, where)
        return result

    def call(self, method: str, *args, **kwargs):
        return self._invoke(self.worker, method, args, kwargs)

    def _gather(self, result, rows: list[list[int]], num_rows: int):
        """Every rank's result, concatenated and put back into the batch's row order."""
        device = result.device if isinstance(result, torch.Tensor) else None
        local = result.to("cpu")  # pickled CUDA tensors would land on the sender's device index
        shares = process_group.all_gather_objects(local)
        self.bytes_from_workers += sum(_nbytes(s) for r, s in enumerate(shares) if r != self.rank)
        gathered = merge_shares(shares, rows, num_rows, self.name)
        if isinstance(result, torch.Tensor):
            return gathered.to(device)
        devices = {t.device for t in result.tensors.values()}
        return gathered.to(devices.pop()) if len(devices) == 1 else gathered


def merge_shares(shares: list, rows: list[list[int]], num_rows: int, role: str):
    """The ranks' results (``Batch`` or tensor, one per rank, for the rows of :func:`shard_rows`)
    concatenated and put back into the batch's row order, padded copies dropped.

    A result may hold ``k`` rows per input row (``generate_sequences``: ``n`` samples per prompt,
    adjacent); they stay together, after the rows of the input rows before them.
    """
    per_row = {len(share) // max(len(share_rows), 1) for share, share_rows in zip(shares, rows) if share_rows}
    if len(per_row) != 1 or any(len(share) != len(share_rows) * min(per_row) for share, share_rows in zip(shares, rows)):
        raise RuntimeError(f"{role}: the ranks returned {[len(s) for s in shares]} rows for "
                           f"{[len(r) for r in rows]} input rows; a worker method must return the same "
                           f"number of rows per input row on every rank")
    k = per_row.pop()
    order = [row for share_rows in rows for row in share_rows]
    first = {}
    for position, row in enumerate(order):
        first.setdefault(row, position)  # a padded copy of a row comes after the row itself
    keep = torch.tensor([first[row] * k + j for row in range(num_rows) for j in range(k)], dtype=torch.long)
    if isinstance(shares[0], torch.Tensor):
        return torch.cat(shares).index_select(0, keep)
    return Batch.concat(shares).index(keep)


def tensor_bytes(value) -> int:
    """Bytes of the tensors in ``value`` (a Batch, a tensor, or dicts / lists / tuples of them)."""
    if isinstance(value, (Batch, torch.Tensor)):
        return _nbytes(value)
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def _spans(rows: list[int]) -> str:
    """``[0-3, 8-11]`` for rows 0..3 and 8..11."""
    spans, start = [], None
    for i, row in enumerate(rows):
        if start is None:
            start = row
        if i + 1 == len(rows) or rows[i + 1] != row + 1:
            spans.append(f"{start}-{row}" if row != start else str(row))
            start = None
    return "[" + ", ".join(spans) + "]"


def make_worker_group(worker, name: str, watchdog: Watchdog) -> WorkerGroup:
    """The group for how this process was launched: SPMD under torchrun (its stages reported by
    ``watchdog`` when a rank fails), else local."""
    if process_group.launched_distributed():
        return SPMDWorkerGroup(worker, name, watchdog)
    return LocalWorkerGroup(worker, name)
