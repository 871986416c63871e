"""The ``torch.distributed`` process group that sharded models run in.

Launched by torchrun (``WORLD_SIZE`` is set), the job's group is initialised from the
environment. In a plain Python process (the default single-process trainer, a notebook, pytest)
a one-rank group is started in-process on first use, so a single process runs the very FSDP2 code
path that N ranks run. That group lives until the interpreter exits: sharded modules keep
references to it, so tearing it down earlier would break every model wrapped in it.

Every rank of the group is a data-parallel rank (each holds its own share of a step's samples);
the collectives below run over all of them and are free at world size 1.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import torch
import torch.distributed as dist

_local_group = None  # the one-rank group this module started, if any
_local_store_dir: str | None = None


def ensure_process_group() -> None:
    """Initialise the default process group unless one exists (torchrun's, or one-rank local)."""
    global _local_group, _local_store_dir
    if dist.is_initialized():
        return
    if "WORLD_SIZE" in os.environ:  # torchrun and friends: rank, size and rendezvous come from env://
        dist.init_process_group()
        return
    _local_store_dir = tempfile.mkdtemp(prefix="verl-pg-")
    # A file store: no port to pick and no race with other processes for one.
    dist.init_process_group(init_method=f"file://{_local_store_dir}/store", rank=0, world_size=1)
    _local_group = dist.group.WORLD
    atexit.register(destroy_local_process_group)


def destroy_local_process_group() -> None:
    """Tear down the one-rank group started by :func:`ensure_process_group` (never a launcher's)."""
    global _local_group, _local_store_dir
    if _local_group is not None and dist.is_initialized() and dist.group.WORLD is _local_group:
        dist.destroy_process_group()
    _local_group = None
    if _local_store_dir is not None:
        shutil.rmtree(_local_store_dir, ignore_errors=True)
        _local_store_dir = None


def launched_distributed() -> bool:
    """True inside a launcher's job (torchrun sets ``WORLD_SIZE``), without starting a group."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def rank() -> int:
    """This process's rank in the default group (0 in a plain process); starts no group."""
    if dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_main_process() -> bool:
    """Rank 0: the one process that prints, logs, validates for the record and writes files."""
    return rank() == 0


def local_rank() -> int:
    """The rank on this node (torchrun's ``LOCAL_RANK``; 0 in a plain process)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def barrier() -> None:
    """Wait for every rank (free at world size 1)."""
    if world_size() > 1:
        dist.barrier()


def broadcast_object(obj, src: int = 0):
    """``obj`` of rank ``src`` on every rank (``obj`` itself at world size 1); a collective."""
    if world_size() == 1:
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=src)
    return holder[0]


def world_size() -> int:
    """Ranks in the default group (initialising it when needed)."""
    ensure_process_group()
    return dist.get_world_size()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over all ranks, in place (untouched at world size 1); returns it."""
    if world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather_objects(obj) -> list:
    """``obj`` of every rank, in rank order (``[obj]`` at world size 1); a collective."""
    world = world_size()
    if world == 1:
        return [obj]
    gathered = [None] * world
    dist.all_gather_object(gathered, obj)
    return gathered
