"""Built-in verifiable tasks: generators that write verl-layout data, and their scorers.

Each task module exposes ``DATA_SOURCE`` (the ``data_source`` value its rows carry),
``make_rows(split, n, seed)`` and ``compute_score(data_source, solution_str, ground_truth,
extra_info=None)``. ``TASKS`` maps a task name (``data.builtin_task``) to its module.
"""

from verl.data.tasks import addition

TASKS = {"addition": addition}

__all__ = ["TASKS", "addition"]
