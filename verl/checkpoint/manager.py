"""Checkpoints that survive crashes: every save is written aside and renamed into place.

Layout under ``trainer.default_local_dir``::

    global_step_20/state.pt             everything needed to resume exactly
    latest_checkpointed_iteration.txt   the step of the newest complete checkpoint
    huggingface/                        the final policy, loadable with from_pretrained

A crash or Ctrl-C during a save leaves only a ``.tmp-*`` folder (``.tmp-hf-*`` for the export),
which the next save, export or resume removes; the previous checkpoint and the pointer file are
untouched until the new one is complete, and the new one's files are on the disk (fsync) before it is
renamed into place, so a power cut does not leave a named but empty checkpoint either. A folder saved
again (the same step, the export) is first renamed aside to ``.old-<name>`` and removed only once the
new one is in place; one left aside by a crash between the two renames is put back by the next save,
export or resume. A save or export that fills the disk removes its partial
write at once and stops with a :class:`VerlError` naming the folder and its free space.

Resuming reads the newest checkpoint that loads. One that is missing or damaged (a truncated or
unreadable ``state.pt``, a folder emptied by hand) is skipped with a warning naming it and why; when
checkpoints exist but none loads, the run stops with an error rather than start again from step 0
over them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from verl.errors import DISK_FULL, VerlError

logger = logging.getLogger(__name__)

POINTER = "latest_checkpointed_iteration.txt"


def _fsync(path: Path) -> None:
    """Flush ``path`` (a file, or a folder's entries) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            _fsync(path)
    _fsync(folder)


def _replace_folder(tmp: Path, final: Path) -> None:
    """Rename the complete folder ``tmp`` to ``final``. An existing ``final`` is renamed aside first
    (``.old-<name>``) and removed after, so that at every moment a complete folder holds the name or
    lies aside, where :func:`restore_replaced` finds it."""
    aside = final.with_name(f".old-{final.name}")
    if final.exists():
        if aside.exists():
            shutil.rmtree(aside)
        os.replace(final, aside)
    os.replace(tmp, final)
    _fsync(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def restore_replaced(folder: Path, pattern: str) -> None:
    """Put back a folder named by ``pattern`` that a crash left aside (``.old-<name>``) while its new version
    was being renamed into place: it is the complete one when ``<name>`` is missing, a leftover otherwise."""
    for aside in Path(folder).glob(f".old-{pattern}"):
        final = aside.with_name(aside.name[len(".old-"):])
        if final.exists():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(aside, final)


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


@contextlib.contextmanager
def _said_if_out_of_space(folder: Path, tmp: Path, what: str, previous: Callable[[], Path | None]):
    """Within the block, a write into ``tmp`` that fails removes it; when the disk is full the error is one
    :class:`VerlError` (:func:`_out_of_space`), otherwise the write's own error goes on. ``previous()``: the
    checkpoint or folder the failed write leaves in place, asked only then."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        full = _out_of_space(error, folder, tmp, what, previous)
        if full is None:
            raise
        raise full from error


def _out_of_space(error: BaseException, folder: Path, tmp: Path, what: str,
                  previous: Callable[[], Path | None]) -> VerlError | None:
    """Remove ``tmp``, the partial write that ``error`` interrupted; a :class:`VerlError` naming ``folder``,
    its free space and the ways out when the disk is full (torch.save reports it as a RuntimeError from its
    zip writer, not as ENOSPC), else None (the caller re-raises ``error``)."""
    written = _size(tmp)
    free = shutil.disk_usage(folder).free
    shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
    full = isinstance(error, OSError) and error.errno in DISK_FULL
    if not full and free >= 16 * 2**20:
        return None
    intact = previous()
    # The partial file may stay open (so not yet freed) until the error is gone: count its bytes as freed.
    free = max(shutil.disk_usage(folder).free, free + written)
    if intact is not None and intact.is_dir():
        kept = f"{intact.name} ({_mib(_size(intact))}) is intact"
    else:
        kept = "nothing written before was damaged"
    return VerlError(f"no space left on the device to write {what} in {folder} ({_mib(written)} written when the "
                     f"disk filled up; {_mib(free)} free once that partial write is removed); {kept}. Fix: free space "
                     f"there, keep fewer checkpoints (trainer.max_actor_ckpt_to_keep; SFT, DPO, KTO: "
                     f"trainer.max_ckpt_to_keep), or give another trainer.default_local_dir, then run the same "
                     f"command again")


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def restore_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def remove_temporary(folder: Path, pattern: str) -> None:
    """Remove the files and folders matching ``pattern`` in ``folder``: what an interrupted atomic
    write left there."""
    for stale in Path(folder).glob(pattern):
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)


class CheckpointManager:
    def __init__(self, root: str | os.PathLike, max_to_keep: int | None = None, *, main: bool = True):
        """``main``: this process writes and speaks (rank 0 of a job): :meth:`load_latest` warns and
        removes leftovers only there; the other ranks make the same choice silently."""
        self.root = Path(root)
        self.max_to_keep = max_to_keep
        self.main = main

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    def latest(self) -> Path | None:
        """The newest complete checkpoint (the pointer's, else the highest step), or None. Whether its
        file loads is checked by :meth:`load_latest`."""
        for path in self._candidates():
            if (path / "state.pt").exists():
                return path
        return None

    def resume_path(self, trainer_cfg) -> Path | None:
        """The checkpoint a run resumes from under ``trainer.resume_mode`` (None = start fresh); see
        :meth:`resume_state`, which also loads it."""
        found = self.resume_state(trainer_cfg)
        return None if found is None else found[0]

    def resume_state(self, trainer_cfg) -> tuple[Path, dict] | None:
        """``(folder, state)`` of the checkpoint a run resumes from under ``trainer.resume_mode``, or
        None to start fresh.

        ``auto``: the newest checkpoint here that loads (:meth:`load_latest`); ``disable``: none;
        ``resume_path``: ``trainer.resume_from_path``, which must hold a checkpoint that loads.
        """
        if trainer_cfg.resume_mode == "disable":
            return None
        if trainer_cfg.resume_mode != "resume_path":
            return self.load_latest()
        if not trainer_cfg.resume_from_path:
            raise VerlError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N>")
        path = Path(trainer_cfg.resume_from_path).expanduser()
        if not (path / "state.pt").exists():
            raise VerlError(f"trainer.resume_from_path={trainer_cfg.resume_from_path} {_not_a_checkpoint(path)}")
        state, problem = self._try_load(path)
        if problem:
            raise VerlError(f"trainer.resume_from_path={path}: {problem}; give another global_step_N folder")
        return path, state

    def load_latest(self) -> tuple[Path, dict] | None:
        """``(folder, state)`` of the newest checkpoint that loads, or None when there is none at all.

        The pointer file names the newest; when its checkpoint is missing or damaged, the next lower
        steps are tried in turn, each one skipped with a warning. Checkpoints that exist but none of
        which loads raise a :class:`VerlError` (starting again from step 0 would overwrite them)."""
        if self.main:
            self.remove_temporary()
        skipped = []
        pointer = self._pointer_step()
        if isinstance(pointer, int) and not self.step_dir(pointer).exists():
            skipped.append(f"{self.step_dir(pointer).name} (named by {POINTER}, but the folder is missing)")
        elif isinstance(pointer, str):
            skipped.append(f"{POINTER} ({pointer})")
        for path in self._candidates():
            state, problem = self._try_load(path)
            if problem is None:
                if skipped:
                    self._warn(f"resuming from {path.name}, the newest checkpoint in {self.root} that loads; skipped "
                               f"{'; '.join(skipped)}")
                return path, state
            skipped.append(f"{path.name} ({problem})")
        if skipped and any(self.root.glob("global_step_*")):
            raise VerlError(
                f"no checkpoint in {self.root} can be resumed from: {'; '.join(skipped)}. Fix: move the damaged "
                f"global_step_N folders away (or restore them), or start over with trainer.resume_mode=disable "
                f"(steps are saved again over these folders), or give another trainer.default_local_dir")
        return None

    def remove_temporary(self) -> None:
        """Remove what an interrupted save or export left here (``.tmp-*``: no complete checkpoint
        or export is ever in one), and put back a checkpoint left aside by a crash during a save
        (:func:`restore_replaced`)."""
        remove_temporary(self.root, ".tmp-*")
        restore_replaced(self.root, "global_step_*")

    def _pointer_step(self) -> int | str | None:
        """The pointer file's step, None when there is no pointer file, or what is wrong with it."""
        pointer = self.root / POINTER
        if not pointer.exists():
            return None
        try:
            return int(pointer.read_text().strip())
        except (OSError, ValueError) as error:
            return f"unreadable: {error}"

    def _candidates(self) -> list[Path]:
        """Checkpoint folders, newest first: the pointer's step, then every lower step (all of them,
        highest first, without a readable pointer). Steps above the pointer's belong to an earlier run
        in the same folder and are never resumed from."""
        steps = [int(path.name[len("global_step_"):]) for path in self._step_folders()]
        pointer = self._pointer_step()
        if isinstance(pointer, int):
            steps = [s for s in steps if s <= pointer]
        return [self.step_dir(s) for s in sorted(steps, reverse=True)]

    def _step_folders(self) -> list[Path]:
        """The ``global_step_<N>`` folders here; a copy beside them (``global_step_3.bak``, ``global_step_3_old``)
        is none: never resumed from, never pruned."""
        return [path for path in self.root.glob("global_step_*")
                if path.name[len("global_step_"):].isdigit() and path.is_dir()]

    def _try_load(self, path: Path) -> tuple[dict | None, str | None]:
        """``(state, None)``, or ``(None, what is wrong)`` for a checkpoint that does not load."""
        file = path / "state.pt"
        if not file.exists():
            return None, "no state.pt"
        try:
            state = self.load(path)
        except Exception as error:  # torch.load reports damage as many types: EOFError, RuntimeError, pickle errors
            first_line = (str(error).splitlines() or [""])[0][:200]
            return None, f"state.pt does not load: {type(error).__name__}: {first_line}"
        return state, None

    def _warn(self, message: str) -> None:
        if self.main:
            logger.warning(message)

    def save(self, step: int, state: dict) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        self.remove_temporary()
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=".tmp-"))
        with _said_if_out_of_space(self.root, tmp, f"the checkpoint of step {step}", self.latest):
            torch.save(state, tmp / "state.pt")
            _fsync_tree(tmp)
        final = self.step_dir(step)
        _replace_folder(tmp, final)
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
        saved = sorted((p for p in self._step_folders() if (p / "state.pt").exists()),
                       key=lambda p: (p / "state.pt").stat().st_mtime_ns)
        for path in saved[:-self.max_to_keep]:
            shutil.rmtree(path, ignore_errors=True)


def save_tokenizer(tokenizer, folder) -> None:
    """``tokenizer.save_pretrained(folder)`` as the checkpoint shipped it: without the pad token
    :func:`verl.models.loading.load_tokenizer` set to the eos for batching where it had none (Llama 3,
    Mistral). A pad equal to the eos in the exported folder would make a later fine-tune mask the eos out
    of its labels. ``tokenizer``: a tokenizer, or a processor holding one (``.tokenizer``)."""
    import copy

    inner = tokenizer if hasattr(tokenizer, "pad_token") else getattr(tokenizer, "tokenizer", None)
    if not getattr(inner, "_verl_pad_from_eos", False) or inner.pad_token != inner.eos_token:
        tokenizer.save_pretrained(folder)
        return
    plain = copy.deepcopy(tokenizer)  # the caller's tokenizer keeps its pad (another thread may be padding)
    plain_inner = plain if hasattr(plain, "pad_token") else plain.tokenizer
    plain_inner.pad_token = None
    plain.save_pretrained(folder)


def write_hf_folder(model: torch.nn.Module, tokenizer, target: str | os.PathLike, *,
                    state_dict: dict | None = None, extra=None) -> Path:
    """Write ``model`` and ``tokenizer`` as a Hugging Face folder (safetensors), atomically, from
    this process alone. ``state_dict``: the full weights to write, for a sharded model (gathered
    beforehand by every rank: ``verl.distributed.fsdp.export_hf`` does both). ``extra(folder)``
    writes more into the folder before it is renamed into place (a LoRA adapter)."""
    def fill(folder: Path) -> None:
        model.save_pretrained(folder, safe_serialization=True, state_dict=state_dict)
        save_tokenizer(tokenizer, folder)  # as the checkpoint had it: without the pad verl set to the eos
        if extra is not None:
            extra(folder)

    return write_folder_atomically(target, fill)


def write_folder_atomically(target: str | os.PathLike, fill) -> Path:
    """``fill(folder)`` writes a temporary ``.tmp-hf-*`` folder beside ``target``, which then replaces
    ``target`` in one rename: an interrupted write leaves the old folder (and a temporary one, removed by
    the next write)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_temporary(target.parent, ".tmp-hf-*")  # left by an interrupted export
    restore_replaced(target.parent, target.name)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-hf-"))
    with _said_if_out_of_space(target.parent, tmp, f"{target.name}/", lambda: target if target.exists() else None):
        fill(tmp)
        _fsync_tree(tmp)
    _replace_folder(tmp, target)
    return target


def _not_a_checkpoint(path: Path) -> str:
    """Why ``path`` is no checkpoint, and the folder to give instead: a run's output folder names its newest,
    a path inside a checkpoint (its ``state.pt``, or upstream verl's ``global_step_N/actor``) that checkpoint."""
    for parent in list(path.parents)[:2]:
        if (parent / "state.pt").exists():
            return (f"is inside the checkpoint {parent.name}, not a checkpoint itself (verl's layout here is one "
                    f"state.pt per global_step_N folder): trainer.resume_from_path={parent}")
    if not path.exists():
        return "does not exist; give a global_step_N folder under a run's default_local_dir"
    newest = CheckpointManager(path, main=False).latest()  # the one resume_mode=auto would take
    if newest is not None:
        return (f"is a run's output folder, not one of its checkpoints; its newest is {newest.name}: "
                f"trainer.resume_from_path={newest} (or trainer.resume_mode=auto with "
                f"trainer.default_local_dir={path} resumes from the newest)")
    return "holds no checkpoint (no state.pt); give a global_step_N folder under a run's default_local_dir"
