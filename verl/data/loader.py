"""An epoch-aware, resumable iterator of Batches: the prompts of RL, the rows of SFT, DPO and KTO.

The order of epoch ``e`` is a permutation drawn from ``torch.Generator().manual_seed(seed + e)``,
so it depends only on (seed, epoch, dataset size): a loader restored from ``state_dict()`` yields
exactly the batches the original would have yielded next. With ``replacement=True`` every batch is
instead ``batch_size`` distinct rows drawn from the whole dataset, independently of the others
(``random.Random(seed).sample``; its state is in ``state_dict()``): an "epoch" is then just as many
batches.
"""

from __future__ import annotations

import functools
import random
from typing import Callable, Iterator

import torch

from verl.data.collate import collate_prompts
from verl.data.io import DataError
from verl.errors import NEW_RUN
from verl.protocol import Batch


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
                 size_key: str = "the prompt batch size (e.g. data.train_batch_size)", replacement: bool = False):
        """``collate`` turns a list of dataset items into a Batch; by default the prompts are
        left-padded with ``pad_token_id`` (:func:`~verl.data.collate.collate_prompts`). ``unit`` and
        ``size_key`` name the rows and the setting in the errors."""
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
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue where ``state`` left off. The order must be the same one, so the dataset size,
        batch size, seed and shuffle setting must match those of the saved run."""
        # (a checkpoint of an older version holds epoch and position alone)
        saved = {k: state[k] for k in ("seed", "batch_size", "dataset_len", "shuffle") if k in state}
        saved["replacement"] = state.get("replacement", False)
        current = {**self.state_dict(), "replacement": self.replacement}
        now = {k: current[k] for k in saved}
        if saved != now:
            changed = ", ".join(f"{k}: saved {saved[k]} now {now[k]}" for k in saved if saved[k] != now[k])
            raise DataError(f"cannot resume the {'prompt' if self.unit == 'prompts' else 'data'} loader: {changed}; "
                            f"the resumed run would see a different order of {self.unit}. Use the saved settings "
                            f"and data to resume, or {NEW_RUN}")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        if self.replacement:
            version, internal, gauss = state["rng"]
            self._rng.setstate((version, tuple(internal), gauss))
