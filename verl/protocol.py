"""The one batch type that moves between the controller and the workers: :class:`Batch`.

A ``Batch`` holds B rows. Its columns are

* ``tensors``: torch tensors whose dim 0 is B (token ids, masks, log-probs, advantages, ...);
* ``non_tensors``: 1-D numpy object arrays of length B (ids, ground truths, raw prompts, dicts);
* ``meta``: a plain dict that belongs to the whole batch, not to a row (temperature, step, ...).

Token layout. A prompt is left-padded to ``T_prompt`` and its response right-padded to
``T_resp``; the model sees them concatenated::

    input_ids       = [pad pad p1 p2 p3 | r1 r2 r3 eos pad]
    attention_mask  = [ 0   0  1  1  1  |  1  1  1  1   0 ]
    position_ids    = [ 0   0  0  1  2  |  3  4  5  6   6 ]
    response_mask   =                   [  1  1  1  1   0 ]

Every per-token quantity of the response (log-probs, values, rewards, advantages) is
``[B, T_resp]`` and aligned with ``responses``. Each standard field is described once, in
:data:`FIELDS`.

Operations never modify the batch they are called on, except ``b[key] = value`` and ``pop``;
a new batch shares its tensors with the old one where slicing allows (views), as torch does.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from verl.errors import VerlError

# The controller's data flow (worker calls, device moves), shown by logging at INFO level.
_dataflow_logger = logging.getLogger("verl.dataflow")

FIELDS: dict[str, str] = {
    # tensors
    "input_ids": "[B, T_prompt + T_resp] long: prompt (left-padded) then response (right-padded)",
    "prompts": "[B, T_prompt] long: prompt token ids, left-padded",
    "responses": "[B, T_resp] long: generated token ids, right-padded",
    "attention_mask": "[B, T_prompt + T_resp] long: 1 on real tokens of prompt and response, 0 on padding",
    "position_ids": "[B, T_prompt + T_resp] long: cumsum(attention_mask) - 1, clamped at 0",
    "response_mask": "[B, T_resp] long/float: 1 on response tokens that count in losses, 0 on padding",
    "old_log_probs": "[B, T_resp] float: log-probs of the responses under the policy before the update",
    "ref_log_prob": "[B, T_resp] float: log-probs of the responses under the frozen reference model",
    "rollout_log_probs": "[B, T_resp] float: log-probs of the sampled tokens under the engine's sampling "
                         "distribution (after temperature, top-k, top-p); 0 on padding",
    "entropys": "[B, T_resp] float: entropy of the policy's next-token distribution",
    "sum_pi_squared": "[B, T_resp] float: sum over the vocabulary of pi(v)^2 at each response token (old policy; "
                      "read by the optimal token baseline)",
    "teacher_log_prob": "[B, T_resp] float: log-probs of the responses under the distillation teacher",
    "values": "[B, T_resp] float: critic values V(s_t) at each response token",
    "token_level_scores": "[B, T_resp] float: reward-function scores (rule and/or model), before KL",
    "token_level_rewards": "[B, T_resp] float: scores minus the KL penalty (equal to scores when no KL)",
    "advantages": "[B, T_resp] float: advantage estimates, zero on padding",
    "returns": "[B, T_resp] float: value targets for the critic",
    "reward_baselines": "[B] float: score of the greedy response to the same prompt (ReMax's baseline)",
    "sample_id": "[B] long: the row's position in its step's batch; set when Ray workers keep a column (e.g. "
                 "ref_log_prob) for a later call instead of returning it, which finds its rows by it",
    # non-tensors (numpy object arrays of length B)
    "uid": "[B] str: group id; all samples drawn from the same prompt share it",
    "data_source": "[B] str: dataset / task name; picks the default reward scorer",
    "ground_truth": "[B] any: reference answer handed to the reward function",
    "extra_info": "[B] dict: per-row extra data from the dataset, handed to the reward function",
    "raw_prompt": "[B] list[dict] | str: the prompt before templating (chat messages or text)",
    "index": "[B] int: row number of the prompt in the dataset files",
}


def _to_object_array(values: Any) -> np.ndarray:
    """A 1-D object array with one element per row (rows of a 2-D input become elements)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _same_objects(a: np.ndarray, b: np.ndarray) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x is y:
            continue
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not np.array_equal(x, y):
                return False
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and torch.equal(x, y)):
                return False
        elif x != y:
            return False
    return True


class Batch:
    """B rows of tensors and non-tensor columns, plus batch-level ``meta``. See the module doc."""

    def __init__(self, tensors: dict[str, torch.Tensor] | None = None,
                 non_tensors: dict[str, Any] | None = None, meta: dict | None = None):
        self.tensors: dict[str, torch.Tensor] = {}
        self.non_tensors: dict[str, np.ndarray] = {}
        self.meta: dict = dict(meta or {})
        for key, value in (tensors or {}).items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"tensors[{key!r}] must be a torch.Tensor, got {type(value).__name__}")
            self[key] = value
        for key, value in (non_tensors or {}).items():
            if isinstance(value, torch.Tensor):
                raise TypeError(f"non_tensors[{key!r}] is a torch.Tensor; put it in tensors")
            self[key] = value

    @classmethod
    def from_dict(cls, data: dict[str, Any], meta: dict | None = None) -> "Batch":
        """Torch tensors become tensor columns; lists and numpy arrays become non-tensor columns."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        non_tensors = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls(tensors, non_tensors, meta)

    def to_dict(self) -> dict[str, Any]:
        """All columns in one dict (tensors and numpy object arrays); meta is left out."""
        return {**self.tensors, **self.non_tensors}

    # ----------------------------------------------------------------- columns
    def __len__(self) -> int:
        for t in self.tensors.values():
            return t.shape[0]
        for a in self.non_tensors.values():
            return len(a)
        return 0

    def keys(self) -> list[str]:
        return list(self.tensors) + list(self.non_tensors)

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def __getitem__(self, key: str) -> torch.Tensor | np.ndarray:
        if not isinstance(key, str):
            raise TypeError(f"Batch[...] takes a column name; use Batch.index() to pick rows, got {key!r}")
        if key in self.tensors:
            return self.tensors[key]
        if key in self.non_tensors:
            return self.non_tensors[key]
        raise KeyError(f"no column {key!r} in batch; columns: {self.keys()}")

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if value.dim() == 0:
                raise ValueError(f"column {key!r} is a 0-dim tensor; per-batch scalars belong in meta")
            n, column = value.shape[0], value
        else:
            if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__"):
                raise TypeError(f"column {key!r} must be a tensor, list or numpy array (one value per row), "
                                f"got {type(value).__name__}; per-batch values belong in meta")
            column = _to_object_array(value)
            n = len(column)
        others = [k for k in self.keys() if k != key]
        if others and n != len(self):
            raise ValueError(f"column {key!r} has length {n} but column {others[0]!r} has length {len(self)}")
        self.tensors.pop(key, None)
        self.non_tensors.pop(key, None)
        if isinstance(column, torch.Tensor):
            self.tensors[key] = column
        else:
            self.non_tensors[key] = column

    def pop(self, key: str) -> torch.Tensor | np.ndarray:
        value = self[key]
        self.tensors.pop(key, None)
        self.non_tensors.pop(key, None)
        return value

    def select(self, *keys: str) -> "Batch":
        """A new batch with only the named columns (meta is kept)."""
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"cannot select {missing}: not in batch; columns: {self.keys()}")
        return Batch({k: self.tensors[k] for k in keys if k in self.tensors},
                     {k: self.non_tensors[k] for k in keys if k in self.non_tensors}, self.meta)

    def union(self, other: "Batch") -> "Batch":
        """A new batch with the columns and meta of both; a key present in both must hold equal data."""
        if len(self.keys()) and len(other.keys()) and len(self) != len(other):
            raise ValueError(f"cannot union batches of length {len(self)} and {len(other)}")
        out = Batch(self.tensors, self.non_tensors, self.meta)
        for key, value in other.tensors.items():
            if key in out.non_tensors or (key in out.tensors and not torch.equal(out.tensors[key], value)):
                raise ValueError(f"union: column {key!r} differs between the two batches")
            out.tensors[key] = value
        for key, value in other.non_tensors.items():
            if key in out.tensors or (key in out.non_tensors and not _same_objects(out.non_tensors[key], value)):
                raise ValueError(f"union: column {key!r} differs between the two batches")
            out.non_tensors[key] = value
        for key, value in other.meta.items():
            if key in out.meta and out.meta[key] != value:
                raise ValueError(f"union: meta[{key!r}] differs: {out.meta[key]!r} vs {value!r}")
            out.meta[key] = value
        return out

    # -------------------------------------------------------------------- rows
    def index(self, idx: int | slice | Sequence[int] | np.ndarray | torch.Tensor) -> "Batch":
        """The rows picked by ``idx``: an int, a slice, a list of ints, or a bool / integer
        tensor or numpy array. Always returns a Batch (an int gives one row)."""
        n = len(self)
        if isinstance(idx, slice):
            return Batch({k: t[idx] for k, t in self.tensors.items()},
                         {k: a[idx] for k, a in self.non_tensors.items()}, self.meta)
        if isinstance(idx, int):
            rows = np.array([idx])
        elif isinstance(idx, torch.Tensor):
            rows = idx.detach().cpu().numpy()
        else:
            rows = np.asarray(idx)
        if rows.dtype == bool:
            if rows.shape != (n,):
                raise IndexError(f"boolean index has shape {rows.shape}, batch has {n} rows")
            rows = np.nonzero(rows)[0]
        elif rows.size == 0:
            rows = rows.astype(np.int64)
        elif rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer):
            raise IndexError(f"row index must be 1-D integers or booleans, got {rows.dtype} of shape {rows.shape}")
        if rows.size and (rows.max() >= n or rows.min() < -n):
            raise IndexError(f"row index out of range for a batch of {n} rows")
        rows_t = torch.from_numpy(rows.astype(np.int64))
        return Batch({k: t[rows_t.to(t.device)] for k, t in self.tensors.items()},
                     {k: a[rows] for k, a in self.non_tensors.items()}, self.meta)

    def split(self, size: int) -> list["Batch"]:
        """Consecutive batches of ``size`` rows; the last one may be smaller."""
        if size < 1:
            raise ValueError(f"split size must be >= 1, got {size}")
        return [self.index(slice(start, start + size)) for start in range(0, len(self), size)]

    def chunk(self, n: int) -> list["Batch"]:
        """``n`` consecutive parts whose sizes differ by at most one (the first ones are larger)."""
        if n < 1 or len(self) < n:
            raise ValueError(f"cannot chunk a batch of {len(self)} rows into {n} parts")
        base, extra = divmod(len(self), n)
        parts, start = [], 0
        for i in range(n):
            stop = start + base + (1 if i < extra else 0)
            parts.append(self.index(slice(start, stop)))
            start = stop
        return parts

    @staticmethod
    def concat(batches: Iterable["Batch"]) -> "Batch":
        """Rows of all batches in order; all must have the same columns. Meta comes from the first."""
        batches = list(batches)
        if not batches:
            raise ValueError("Batch.concat needs at least one batch")
        first = batches[0]
        for i, b in enumerate(batches[1:], start=1):
            if set(b.tensors) != set(first.tensors) or set(b.non_tensors) != set(first.non_tensors):
                raise ValueError(f"Batch.concat: batch {i} has columns {sorted(b.keys())}, "
                                 f"batch 0 has {sorted(first.keys())}")
        tensors = {}
        for k in first.tensors:
            shapes = {tuple(b.tensors[k].shape[1:]) for b in batches}
            if len(shapes) > 1:
                raise ValueError(f"Batch.concat: column {k!r} has different trailing shapes {sorted(shapes)}")
            tensors[k] = torch.cat([b.tensors[k] for b in batches])
        return Batch(tensors, {k: np.concatenate([b.non_tensors[k] for b in batches]) for k in first.non_tensors},
                     first.meta)

    def repeat(self, n: int, interleave: bool = True) -> "Batch":
        """Each row ``n`` times: ``[a, a, b, b]`` when ``interleave`` else ``[a, b, a, b]``.

        Repeated non-tensor rows refer to the same python objects (a dict is not copied).
        """
        if n < 1:
            raise ValueError(f"repeat count must be >= 1, got {n}")
        if interleave:
            tensors = {k: t.repeat_interleave(n, dim=0) for k, t in self.tensors.items()}
            non_tensors = {k: np.repeat(a, n) for k, a in self.non_tensors.items()}
        else:
            tensors = {k: t.repeat(n, *([1] * (t.dim() - 1))) for k, t in self.tensors.items()}
            non_tensors = {k: np.tile(a, n) for k, a in self.non_tensors.items()}
        return Batch(tensors, non_tensors, self.meta)

    def shuffle(self, generator: torch.Generator) -> "Batch":
        """The rows in a random order drawn from ``generator``."""
        return self.index(torch.randperm(len(self), generator=generator))

    # ------------------------------------------------------------------ misc
    def to(self, device: torch.device | str) -> "Batch":
        """A batch with the tensors moved to ``device`` (non-tensor columns are shared).

        A move that copies anything is logged at INFO on ``verl.dataflow``: devices, bytes, time.
        """
        start = time.perf_counter()
        tensors = {k: t.to(device) for k, t in self.tensors.items()}
        # Tensor.to returns the tensor itself when it is already there: those cost nothing.
        moved = [(k, t) for k, t in self.tensors.items() if tensors[k] is not t]
        if moved and _dataflow_logger.isEnabledFor(logging.INFO):
            sources = sorted({str(t.device) for _, t in moved})
            _dataflow_logger.info("Batch.to: %s -> %s, %d of %d tensors, %d bytes, %.4fs", "+".join(sources),
                                  torch.device(device), len(moved), len(tensors),
                                  sum(t.numel() * t.element_size() for _, t in moved), time.perf_counter() - start)
        return Batch(tensors, self.non_tensors, self.meta)

    def nbytes(self) -> int:
        """Bytes held by the tensor columns (what moving this batch between workers costs)."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def __repr__(self) -> str:
        cols = [f"{k}: {list(t.shape)} {str(t.dtype).removeprefix('torch.')}" for k, t in self.tensors.items()]
        cols += [f"{k}: [{len(a)}] object" for k, a in self.non_tensors.items()]
        meta = f", meta={sorted(self.meta)}" if self.meta else ""
        return f"Batch(len={len(self)}, {{{', '.join(cols)}}}{meta})"


# The columns a model reads, by what each must be: token ids and positions (int64, as embedding lookups and
# cross_entropy's targets take them) and masks (any dtype: bool, int or float read the same).
ID_COLUMNS = ("input_ids", "prompts", "responses", "position_ids")
MODEL_COLUMNS = (*ID_COLUMNS, "attention_mask", "response_mask")


def model_columns(batch: Batch, where: str) -> Batch:
    """``batch`` with the columns a model reads as the tensors it takes: int32 (or other integer) token ids and
    positions as int64, a numeric column that ``Batch.from_dict`` kept as a numpy or list column (it keeps those
    as objects) as a tensor. The same batch when nothing changes. Before, int32 responses failed inside the
    model with "expected target dtype to be Long or Byte, but got Int", and a numpy input_ids with "'numpy.ndarray'
    object has no attribute 'dim'". ``where`` (the method called) begins each error."""
    changed: dict[str, torch.Tensor] = {}
    for key in MODEL_COLUMNS:
        if key in batch.non_tensors:
            try:
                column = torch.as_tensor(np.array(batch.non_tensors[key].tolist()))
            except (TypeError, ValueError, RuntimeError):
                column = None
            if column is None or column.dim() < 1:
                raise VerlError(f"{where}: column {key!r} is not numbers of one shape (a {type(batch[key][0]).__name__}"
                                 f" per row); give a tensor [B, T]: Batch({{{key!r}: torch.as_tensor(...)}})")
            changed[key] = column
        elif key in batch.tensors:
            changed[key] = batch.tensors[key]
        if key in ID_COLUMNS and key in changed and changed[key].dtype != torch.long:
            if changed[key].is_floating_point() or changed[key].dtype == torch.bool:
                raise VerlError(f"{where}: {key} holds {changed[key].dtype} values; token ids and positions are "
                                 f"integers: give a long tensor ({key}.long() if they are whole numbers)")
            changed[key] = changed[key].long()
    if "input_ids" in changed and changed["input_ids"].dim() != 2:
        raise VerlError(f"{where}: input_ids has shape {list(changed['input_ids'].shape)}; give [B, T], one row per "
                         f"sequence (input_ids.unsqueeze(0) for a single one, and its attention_mask likewise)")
    changed = {k: v for k, v in changed.items() if k in batch.non_tensors or v is not batch.tensors[k]}
    if not changed:
        return batch
    tensors = {**batch.tensors, **changed}
    return Batch(tensors, {k: v for k, v in batch.non_tensors.items() if k not in changed}, batch.meta)
