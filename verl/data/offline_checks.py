"""Checks of the offline trainers' rows once they are tokens: what each row leaves for the loss to train on.

A row whose loss mask has no target token (its response cut away by ``data.truncation=right``, a
conversation whose assistant turns fall outside ``data.max_length``) adds nothing to a step but its
count: DPO would compare a response with nothing, and a batch of such rows is a step with no token.
Such rows are left out with one warning naming them; when no row is left, the run stops.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from verl.data.io import DataError
from verl.errors import first_few

logger = logging.getLogger("verl.data.offline")


def targets(mask: Sequence[int]) -> int:
    """The tokens a loss mask trains on: token 0 never is (nothing predicts it)."""
    return sum(mask[1:])


def keep_trained(items: list, masks: list[tuple[Sequence[int], ...]], source: str, max_length: int,
                 truncation: str) -> list:
    """``items`` without those whose masks (one per sequence of the row: both sides of a pair) leave a
    sequence with no target token; a warning names them, and a DataError stops the run when none is left."""
    empty = [i for i, row_masks in enumerate(masks) if any(targets(m) == 0 for m in row_masks)]
    if not empty:
        return items
    why = (f"data.truncation={truncation} cut them to data.max_length={max_length}" if truncation != "error" else
           "their responses have no token")
    fix = ("raise data.max_length, or set data.truncation=left (it keeps the end of a row, where the response is)"
           if truncation == "right" else "raise data.max_length, or drop them")
    if len(empty) == len(items):
        raise DataError(f"no row of {source} has a response token left to train on ({why}; row {first_few(empty)}); "
                        f"{fix}")
    logger.warning("%s: %d of %d rows have no response token left to train on (%s; row %s): they are left out; %s",
                   source, len(empty), len(items), why, first_few(empty), fix)
    drop = set(empty)
    return [item for i, item in enumerate(items) if i not in drop]
