"""Built-in verifiable tasks: generators that write verl-layout data, and their scorers.

Each task module exposes ``DATA_SOURCE`` (the ``data_source`` value its rows carry),
``make_rows(split, n, seed)`` and ``compute_score(data_source, solution_str, ground_truth,
extra_info=None)``; a visual task ``VISION = True`` (its rows carry images); an agentic task also
``sft_messages(row)``, the worked conversation its warm start trains on (tool calls and results
included). ``TASKS`` maps a task name (``data.builtin_task``) to its module.
docs/builtin_tasks.md describes each task's rows and scoring.
"""

from verl.data.tasks import addition, calculator, countdown, shapes, spell, word_problems

TASKS = {"addition": addition, "calculator": calculator, "countdown": countdown, "shapes": shapes, "spell": spell,
         "word_problems": word_problems}

__all__ = ["TASKS", "addition", "calculator", "countdown", "shapes", "spell", "word_problems"]
