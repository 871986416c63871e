"""Balancing rows by token count: dynamic micro-batches and the step's order over ranks.

Pure functions on lists of lengths (tokens of prompt + response a row holds, its attention mask's
sum); the collectives that make ranks agree live in :mod:`verl.workers.engine`.

* :func:`token_micro_batches`: a rank's rows in as few groups as fit a token budget, balanced
  (``actor.use_dynamic_bsz``).
* :func:`balanced_order`: a permutation of a step's rows after which the worker group's contiguous
  split of every mini-batch block gives each rank a similar number of tokens (``trainer.balance_batch``).

Both use longest-processing-time-first greedy packing (Graham 1969: the longest rows first, each
into the lightest group), which is within 4/3 of the best possible maximum load.
"""

from __future__ import annotations

from collections.abc import Sequence


def balanced_groups(lengths: Sequence[int], k: int, sizes: Sequence[int] | None = None) -> list[list[int]]:
    """Row indices in ``k`` groups of similar total length, each group's indices ascending.

    Longest rows first, each into the lightest group (the lowest-numbered on ties). With ``sizes``
    group ``g`` takes exactly ``sizes[g]`` rows (they must sum to ``len(lengths)``); without, any
    number, so some groups are empty when ``k > len(lengths)``.
    """
    if sizes is not None and sum(sizes) != len(lengths):
        raise ValueError(f"group sizes {list(sizes)} do not add up to {len(lengths)} rows")
    groups: list[list[int]] = [[] for _ in range(k)]
    loads = [0] * k
    for row in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        open_groups = [g for g in range(k) if sizes is None or len(groups[g]) < sizes[g]]
        g = min(open_groups, key=lambda j: (loads[j], j))
        groups[g].append(row)
        loads[g] += lengths[row]
    return [sorted(group) for group in groups]


def fits(lengths: Sequence[int], groups: list[list[int]], budget: int) -> bool:
    """Every group holds at most ``budget`` tokens, or is one row (a longer row still runs, alone)."""
    return all(len(g) <= 1 or sum(lengths[i] for i in g) <= budget for g in groups)


def fewest_groups(lengths: Sequence[int], budget: int, at_least: int = 1) -> int:
    """The smallest ``k >= at_least`` (and >= total tokens / budget) whose balanced groups fit ``budget``."""
    if budget < 1:
        raise ValueError(f"token budget must be >= 1, got {budget}")
    # A lower bound: each row over the budget alone, the others at best packed full. More groups
    # than rows only when asked (``at_least``): one row per group always fits.
    short = [n for n in lengths if n <= budget]
    k = max(at_least, min(len(lengths) - len(short) + -(-sum(short) // budget), len(lengths)), 1)
    while not fits(lengths, balanced_groups(lengths, k), budget):
        k += 1  # ends by k = len(lengths) at the latest: one row per group always fits
    return k


def token_micro_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """A rank's rows in the fewest balanced micro-batches of at most ``budget`` tokens each."""
    lengths = [int(x) for x in lengths]
    return balanced_groups(lengths, fewest_groups(lengths, budget))


def balanced_order(lengths: Sequence[int], world: int, block: int | None = None) -> list[int]:
    """A permutation of rows (``batch.index(order)``) that balances tokens over ``world`` ranks.

    The worker group cuts every block of ``block`` rows into ``world`` contiguous parts, rank ``r``
    taking part ``r`` (``verl.distributed.worker_group.shard_rows``; no ``block``: the whole batch
    is one block). Rows move only within their block, so every mini-batch keeps the samples it had
    (the update's gradient is unchanged up to rounding) and each part keeps its number of rows;
    within a block, rows are dealt to the parts longest first, each to the lightest part with room.
    At ``world=1`` it is the identity. Group-baseline advantages must be computed before (they
    find a group by ``uid``, not by position, so they would also survive the move).
    """
    lengths = [int(x) for x in lengths]
    n = len(lengths)
    block = block or n
    order: list[int] = []
    for start in range(0, n, block):
        size = min(block, n - start)
        bounds = [size * r // world for r in range(world + 1)]
        parts = balanced_groups(lengths[start:start + size], world,
                                sizes=[bounds[r + 1] - bounds[r] for r in range(world)])
        order.extend(start + i for part in parts for i in part)
    return order
