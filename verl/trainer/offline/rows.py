"""The rows an offline trainer trains and validates on: from files, or from a built-in task."""

from __future__ import annotations

from verl.data.io import read_rows, subset_positions
from verl.data.offline import addition_rows
from verl.errors import VerlError

BUILTIN_VAL_ROWS = 200  # held-out prompts of the built-in task used for validation


def offline_rows(data_cfg, kind: str) -> tuple[list[dict], list[dict] | None]:
    """(training rows, validation rows or None): from the files, or from the built-in task."""
    if data_cfg.train_files is None:
        if data_cfg.builtin_task != "addition":
            return _solution_rows(data_cfg, kind)
        val = read_rows(data_cfg.val_files, config_key="data.val_files") if data_cfg.val_files else \
            addition_rows(kind, "test", n=BUILTIN_VAL_ROWS, seed=data_cfg.seed)
        return addition_rows(kind, "train", seed=data_cfg.seed), val
    train = _at_most(read_rows(data_cfg.train_files, config_key="data.train_files"), data_cfg, "train")
    val = _at_most(read_rows(data_cfg.val_files, config_key="data.val_files"), data_cfg, "val") \
        if data_cfg.val_files else None
    return train, val


def _at_most(rows: list[dict], data_cfg, split: str) -> list[dict]:
    """verl's ``data.{split}_max_samples`` (SFT; see :func:`verl.data.io.subset_positions`)."""
    limit = getattr(data_cfg, f"{split}_max_samples", -1)
    return [rows[k] for k in subset_positions(len(rows), limit, data_cfg.shuffle, data_cfg.seed)]


def _solution_rows(data_cfg, kind: str) -> tuple[list[dict], list[dict]]:
    """SFT rows of a built-in task whose rows carry a worked solution (``extra_info.solution``)."""
    from verl.data.tasks import TASKS

    task = TASKS.get(data_cfg.builtin_task)
    if task is None or kind != "sft":
        offered = sorted(TASKS) if kind == "sft" else ["addition"]
        raise VerlError(f"built-in task {data_cfg.builtin_task!r} (data.builtin_task) has no {kind} data; the "
                        f"{kind} trainer's built-in tasks: {offered}. Or set data.train_files")

    def rows(split, n=None):
        return [{"prompt": r["prompt"], "response": r["extra_info"]["solution"]}
                for r in task.make_rows(split, n, data_cfg.seed)]
    val = read_rows(data_cfg.val_files, config_key="data.val_files") if data_cfg.val_files else \
        rows("test", BUILTIN_VAL_ROWS)
    return rows("train"), val
