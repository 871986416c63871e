"""Placement of role workers. ``LocalWorkerGroup``: the worker lives in this process.

The controller calls ``group.run("method", batch)``; a group decides where the call executes
(here: a plain method call, so breakpoints and stack traces work as usual) and logs the data
flow at INFO level: method, batch shape, bytes moved, time.
"""

from __future__ import annotations

import logging
import time

from verl.protocol import Batch

logger = logging.getLogger("verl.dataflow")


def _describe(batch) -> str:
    if not isinstance(batch, Batch):
        return type(batch).__name__
    shapes = ", ".join(f"{k}{list(v.shape)}" for k, v in batch.tensors.items())
    return f"{len(batch)} rows [{shapes}] {batch.nbytes() / 1024:.1f} KiB"


class LocalWorkerGroup:
    """One worker, in-process (world size 1)."""

    def __init__(self, worker, name: str):
        self.worker = worker
        self.name = name
        self.world_size = 1

    def run(self, method: str, batch: Batch | None = None, **kwargs):
        start = time.perf_counter()
        args = () if batch is None else (batch,)
        result = getattr(self.worker, method)(*args, **kwargs)
        if logger.isEnabledFor(logging.INFO):
            logger.info("%s.%s: in %s -> out %s (%.3fs)", self.name, method,
                        _describe(batch) if batch is not None else "-", _describe(result),
                        time.perf_counter() - start)
        return result
