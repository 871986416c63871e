"""The ``torch.distributed`` process group that sharded models run in.

Launched by torchrun (``WORLD_SIZE`` is set), the job's group is initialised from the
environment. In a plain Python process (the default single-process trainer, a notebook, pytest)
a one-rank group is started in-process on first use, so a single process runs the code path that
N ranks run (the collectives, the state dicts; its models stay plain where FSDP over one rank would
change no number, see :func:`verl.distributed.fsdp.parallelize`). That group lives until the
interpreter exits: sharded modules keep references to it, so tearing it down earlier would break
every model wrapped in it.

Every rank of the group is a data-parallel rank (each holds its own share of a step's samples);
the collectives below run over all of them and are free at world size 1.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

COLLECTIVE_SLACK_S = 60.0
"""How much longer than ``trainer.dist_timeout_s`` one collective may wait (see ensure_process_group)."""

_local_group = None  # the one-rank group this module started, if any
_local_store_dir: str | None = None
_alone = 0  # depth of alone() contexts


@contextmanager
def alone():
    """Inside, this process is a world of one even in a multi-rank job: rank 0, world size 1, no
    process group started, and every collective of this module free. For work one rank does by
    itself while the others wait (the demo's warm start: rank 0 trains and caches it). A model
    built inside must stay unsharded: FSDP needs a process group."""
    global _alone
    _alone += 1
    try:
        yield
    finally:
        _alone -= 1


def collective_timeout(dist_timeout_s: float) -> timedelta:
    """The ``timeout`` for ``init_process_group``: a rank waits this long in one collective.

    Longer than the watchdog's, so that a dead or stalled rank is reported by the watchdog (rank and
    stage) before gloo or NCCL raise their own error (NCCL's ends the process without Python); it
    still ends the hangs that heartbeats cannot see.
    """
    return timedelta(seconds=dist_timeout_s + COLLECTIVE_SLACK_S)


def ensure_process_group(timeout_s: float | None = None) -> None:
    """Initialise the default process group unless one exists (torchrun's, or one-rank local).

    ``timeout_s``: the job's ``trainer.dist_timeout_s``. A collective then waits at most a minute
    longer than that, so that the watchdog (:mod:`verl.distributed.watchdog`) reports a dead or
    stalled rank before the backend's own timeout does.
    """
    global _local_group, _local_store_dir
    if dist.is_initialized() or _alone:
        return
    if "WORLD_SIZE" in os.environ:  # torchrun and friends: rank, size and rendezvous come from env://
        if timeout_s is None:
            dist.init_process_group()
        else:
            dist.init_process_group(timeout=collective_timeout(timeout_s))
        # Torn down before the interpreter's own teardown: a group left to die with the process can
        # abort it ("terminate called without an active exception") while its threads still run.
        atexit.register(_destroy_launched_group)
        return
    _local_store_dir = tempfile.mkdtemp(prefix="verl-pg-")
    # A file store: no port to pick and no race with other processes for one.
    dist.init_process_group(init_method=f"file://{_local_store_dir}/store", rank=0, world_size=1)
    _local_group = dist.group.WORLD
    atexit.register(destroy_local_process_group)


def leave_job(code: int = 0) -> None:
    """End this rank of a torchrun job now, after its work: flush, tear the process group down and
    exit with ``code`` without running C++ static destructors. With torch 2.13 and gloo, a rank
    exiting the usual way aborts now and then, after all its work, with "terminate called without an
    active exception" (a joinable C++ thread destroyed at shutdown; about 1 exit in 10 on a busy
    2-core machine). In a plain process it returns and the script ends as usual."""
    if not launched_distributed():
        return
    _destroy_launched_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _destroy_launched_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def destroy_local_process_group() -> None:
    """Tear down the one-rank group started by :func:`ensure_process_group` (never a launcher's)."""
    global _local_group, _local_store_dir
    if _local_group is not None and dist.is_initialized() and dist.group.WORLD is _local_group:
        dist.destroy_process_group()
    _local_group = None
    if _local_store_dir is not None:
        shutil.rmtree(_local_store_dir, ignore_errors=True)
        _local_store_dir = None


def launched_world_size() -> int:
    """The job's number of ranks as the launcher set it (``WORLD_SIZE``; 1 in a plain process),
    without starting a group; 1 inside :func:`alone`."""
    return 1 if _alone else int(os.environ.get("WORLD_SIZE", "1"))


def launched_distributed() -> bool:
    """True inside a multi-rank launcher's job (torchrun), without starting a group."""
    return launched_world_size() > 1


def rank() -> int:
    """This process's rank in the default group (0 in a plain process and inside :func:`alone`);
    starts no group."""
    if _alone:
        return 0
    if dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_main_process() -> bool:
    """Rank 0: the one process that prints, logs, validates for the record and writes files."""
    return rank() == 0


def barrier() -> None:
    """Wait for every rank (free at world size 1)."""
    if world_size() > 1:
        dist.barrier()


def world_size() -> int:
    """Ranks in the default group (initialising it when needed); 1 inside :func:`alone`."""
    if _alone:
        return 1
    ensure_process_group()
    return dist.get_world_size()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over all ranks, in place (untouched at world size 1); returns it."""
    if world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast_object(obj, src: int = 0):
    """``obj`` of rank ``src`` on every rank (``obj`` itself at world size 1); a collective."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_objects(obj) -> list:
    """``obj`` of every rank, in rank order (``[obj]`` at world size 1); a collective."""
    world = world_size()
    if world == 1:
        return [obj]
    gathered = [None] * world
    dist.all_gather_object(gathered, obj)
    return gathered
