"""An epoch-aware, resumable iterator of Batches: the prompts of RL, the rows of SFT, DPO and KTO.

The order of epoch ``e`` is a permutation drawn from ``torch.Generator().manual_seed(seed + e)``,
so it depends only on (seed, epoch, dataset size): a loader restored from ``state_dict()`` yields
exactly the batches the original would have yielded next. With ``replacement=True`` every batch is
instead ``batch_size`` distinct rows drawn from the whole dataset, independently of the others
(``random.Random(seed).sample``; its state is in ``state_dict()``): an "epoch" is then just as many
batches.
"""

from __future__ import annotations

import array
import functools
import logging
import random
import zlib
from typing import Callable, Iterator

import numpy as np
import torch

from verl.data.collate import collate_prompts
from verl.data.io import DataError
from verl.errors import NEW_RUN, first_few
from verl.protocol import Batch

logger = logging.getLogger(__name__)


class PromptLoader:
    """Batches of prompts, epoch after epoch.

    Two ways to use it, sharing one position:

    * ``for batch in loader:`` yields the rest of the current epoch, then moves to the next epoch;
    * ``next(loader)`` returns the next batch and rolls over into the next epoch by itself.

    ``state_dict()`` taken after receiving a batch resumes with the batch after it.
    """

    def __init__(self, dataset, batch_size: int, *, shuffle: bool = True, seed: int = 1,
                 drop_last: bool = True, pad_token_id: int | None = None,
                 collate: Callable[[list[dict]], Batch] | None = None, unit: str = "prompts",
                 size_key: str = "the prompt batch size (e.g. data.train_batch_size)", replacement: bool = False,
                 data_key: str = "the dataset", warn: bool = True):
        """``collate`` turns a list of dataset items into a Batch; by default the prompts are
        left-padded with ``pad_token_id`` (:func:`~verl.data.collate.collate_prompts`). ``unit``,
        ``size_key`` and ``data_key`` name the rows, the batch-size setting and the data in the errors and
        warnings; ``warn``: this process says them (rank 0 of a job)."""
        if batch_size < 1:
            raise DataError(f"batch size must be >= 1, got {batch_size}")
        if collate is None:
            if pad_token_id is None:
                raise TypeError("PromptLoader needs pad_token_id (for collate_prompts) or a collate function")
            collate = functools.partial(collate_prompts, pad_token_id=pad_token_id)
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.replacement = replacement
        self._rng = random.Random(seed)
        self.collate = collate
        self.unit = unit
        self.size_key = size_key
        self.data_key = data_key
        self.warn = warn
        self._digests: bytes | None = None
        self.epoch = 0
        self.position = 0  # batches already handed out in the current epoch
        if len(self) == 0:
            raise DataError(f"the dataset has {len(dataset)} {unit}, fewer than one batch of {batch_size}; "
                            f"lower {size_key} to at most {len(dataset)}, or add data")

    def __len__(self) -> int:
        """Batches per epoch."""
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(len(self.dataset))
        return torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.seed + epoch))

    def _batch_at(self, order: torch.Tensor, position: int) -> Batch:
        rows = order[position * self.batch_size:(position + 1) * self.batch_size].tolist()
        return self.collate([self.dataset[i] for i in rows])

    def _roll_over_if_done(self) -> None:
        if self.position >= len(self):
            self.epoch += 1
            self.position = 0

    def __iter__(self) -> Iterator[Batch]:
        self._roll_over_if_done()
        if self.replacement:
            while self.position < len(self):
                yield next(self)
            self._roll_over_if_done()
            return
        order = self._order(self.epoch)
        while self.position < len(self):
            batch = self._batch_at(order, self.position)
            self.position += 1
            yield batch
        self._roll_over_if_done()

    def __next__(self) -> Batch:
        self._roll_over_if_done()
        if self.replacement:
            batch = self.collate([self.dataset[i] for i in self._rng.sample(range(len(self.dataset)), self.batch_size)])
        else:
            batch = self._batch_at(self._order(self.epoch), self.position)
        self.position += 1
        return batch

    def state_dict(self) -> dict:
        state = {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                 "batch_size": self.batch_size, "dataset_len": len(self.dataset), "shuffle": self.shuffle}
        if self.replacement:
            state.update(replacement=True, rng=self._rng.getstate())
        state["row_digests"] = self.row_digests()
        return state

    def row_digests(self) -> bytes:
        """A CRC-32 of each item of the dataset (4 bytes a row, computed once): a resumed run finds the rows
        that changed since its checkpoint."""
        if self._digests is None:
            # The row as read where the dataset gives it (RLDataset: no image processed, no copy made), else the item.
            row = getattr(self.dataset, "raw_row", None) or self.dataset.__getitem__
            self._digests = array.array("I", (_digest(row(i)) for i in range(len(self.dataset)))).tobytes()
        return self._digests

    def load_state_dict(self, state: dict) -> None:
        """Continue where ``state`` left off. The order must be the same one, so the dataset size,
        batch size, seed and shuffle setting must match those of the saved run."""
        # (a checkpoint of an older version holds epoch and position alone)
        saved = {k: state[k] for k in ("seed", "batch_size", "dataset_len", "shuffle") if k in state}
        saved["replacement"] = state.get("replacement", False)
        current = {**self.state_dict(), "replacement": self.replacement}
        now = {k: current[k] for k in saved}
        if saved != now:
            names = {"batch_size": self.size_key, "dataset_len": f"{self.unit} in {self.data_key}"}
            changed = ", ".join(f"{names.get(k, k)}: saved {saved[k]} now {now[k]}" for k in saved if saved[k] != now[k])
            raise DataError(f"cannot resume the {'prompt' if self.unit == 'prompts' else 'data'} loader: {changed}; "
                            f"the resumed run would see a different order of {self.unit}. Use the saved settings "
                            f"and data to resume, or {NEW_RUN}")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        if self.replacement:
            version, internal, gauss = state["rng"]
            self._rng.setstate((version, tuple(internal), gauss))
        if "row_digests" in state:
            self._say_changed_rows(state["row_digests"])

    def _say_changed_rows(self, saved: bytes) -> None:
        """Warn when rows of the data changed since the checkpoint (the same number of rows, edited): the epoch
        goes on in the saved order of positions, over the rows there now."""
        before, now = array.array("I", saved), array.array("I", self.row_digests())
        changed = [i for i, (a, b) in enumerate(zip(before, now)) if a != b]
        if not changed or not self.warn:
            return
        shown = first_few(changed)
        logger.warning("%s changed since the checkpoint: %d of its %d %s differ (at positions %s). The run goes on at "
                       "batch %d of epoch %d in the saved order of positions, over the %s there now (one that moved "
                       "may be seen twice or not at all in this epoch). To go on over the saved data, resume with it; "
                       "to train on the new data from its start, %s", self.data_key, len(changed), len(now), self.unit,
                       shown, self.position + 1, self.epoch + 1, self.unit, NEW_RUN)


def _digest(item, crc: int = 0) -> int:
    """CRC-32 of a dataset item: its numbers, strings, tensors and arrays, in nested dicts and lists (other
    objects count by their type alone: a changed image is not seen)."""
    if isinstance(item, dict):
        for key in sorted(item, key=str):
            crc = _digest(item[key], _digest(key, crc))
        return crc
    if isinstance(item, (list, tuple)):
        crc = zlib.crc32(f"[{len(item)}".encode(), crc)
        for value in item:
            crc = _digest(value, crc)
        return crc
    if isinstance(item, torch.Tensor):
        item = item.detach().cpu().numpy()
    if isinstance(item, (np.ndarray, np.generic)):
        return zlib.crc32(item.tobytes() if item.dtype != object else repr(item.tolist()).encode(), crc)
    if isinstance(item, (bytes, bytearray, memoryview)):  # an image's bytes, as a row holds them
        return zlib.crc32(item, crc)
    if item is None or isinstance(item, (str, int, float, bool)):
        return zlib.crc32(repr(item).encode(), crc)
    return zlib.crc32(type(item).__name__.encode(), crc)
