"""Built-in verifiable tasks: generators that write verl-layout data, and their scorers.

Each task module exposes ``DATA_SOURCE`` (the ``data_source`` value its rows carry),
``make_rows(split, n, seed)`` and ``compute_score(data_source, solution_str, ground_truth,
extra_info=None)``; a visual task ``VISION = True`` (its rows carry images); an agentic task also
``sft_messages(row)``, the worked conversation its warm start trains on (tool calls and results
included). ``TASKS`` maps a task name (``data.builtin_task``) to its module.
docs/builtin_tasks.md describes each task's rows and scoring.
"""

import hashlib
from pathlib import Path

from verl.data.tasks import addition, calculator, countdown, shapes, spell, word_problems

TASKS = {"addition": addition, "calculator": calculator, "countdown": countdown, "shapes": shapes, "spell": spell,
         "word_problems": word_problems}


def sources_digest() -> str:
    """A hash of the sources of every built-in task. What is cached from a task (its parquet files, a
    warm start trained on it) is keyed by it, so an edited task, or a helper it shares with another
    (calculator's rows are made by addition's code), never serves stale rows or weights."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


__all__ = ["TASKS", "sources_digest", "addition", "calculator", "countdown", "shapes", "spell", "word_problems"]
