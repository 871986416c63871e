"""Placement of role workers. ``LocalWorkerGroup``: the worker lives in this process.

The controller calls ``group.run("method", batch)``; a group decides where the call executes
(here: a plain method call, so breakpoints and stack traces work as usual) and logs the data
flow at INFO level on ``verl.dataflow``: method, batch shapes and devices, bytes handed to and
returned from the worker, time. An out-of-memory error inside a worker becomes a VerlError that
names the role and the settings that lower its memory use (``verl.utils.checks.explain_oom``).
"""

from __future__ import annotations

import logging
import time

from verl.protocol import Batch
from verl.utils.checks import explain_oom

logger = logging.getLogger("verl.dataflow")


def _nbytes(value) -> int:
    return value.nbytes() if isinstance(value, Batch) else 0


def _describe(value) -> str:
    if not isinstance(value, Batch):
        return type(value).__name__
    shapes = ", ".join(f"{k}{list(v.shape)}" for k, v in value.tensors.items())
    devices = "+".join(sorted({str(t.device) for t in value.tensors.values()})) or "-"
    return f"{len(value)} rows [{shapes}] {value.nbytes()} bytes on {devices}"


class LocalWorkerGroup:
    """One worker, in-process (world size 1).

    ``bytes_sent`` / ``bytes_received`` count the tensor bytes of every batch handed to the
    worker and returned by it (what a remote placement would move over the wire).
    """

    def __init__(self, worker, name: str):
        self.worker = worker
        self.name = name
        self.world_size = 1
        self.bytes_sent = 0
        self.bytes_received = 0

    def run(self, method: str, batch: Batch | None = None, **kwargs):
        start = time.perf_counter()
        args = () if batch is None else (batch,)
        with explain_oom(self.name, method=method):
            result = getattr(self.worker, method)(*args, **kwargs)
        self.bytes_sent += _nbytes(batch)
        self.bytes_received += _nbytes(result)
        if logger.isEnabledFor(logging.INFO):
            logger.info("%s.%s: sent %s -> returned %s, %.3fs", self.name, method,
                        _describe(batch) if batch is not None else "-", _describe(result),
                        time.perf_counter() - start)
        return result
