"""Reading and writing row files: parquet (verl's format) and JSON lines; Hugging Face datasets
(a dataset folder or a hub name, see :mod:`verl.data.hf`) are read too.

Rows are plain python dicts. Nested parquet columns come back as python objects: a struct
column as a dict, a list-of-struct column (chat messages) as a list of dicts. A struct column has
one set of fields for all rows, so a dict key missing from some rows reads back as None there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from verl.errors import DataError

SUPPORTED_EXTENSIONS = (".parquet", ".jsonl", ".json")


def is_messages(value: Any) -> bool:
    """True for a chat conversation: a list of ``{"role": ..., "content": ...}`` dicts."""
    return isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value)


def _as_paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    return [Path(os.path.expanduser(str(p))) for p in paths]


def read_rows(paths: str | os.PathLike | Sequence[str | os.PathLike], *,
              config_key: str = "data.train_files") -> list[dict]:
    """All rows of one file or of several files, concatenated in order.

    ``config_key`` is the setting the paths came from; errors name it so the user knows what to fix.
    """
    files = _as_paths(paths)
    if not files:
        raise DataError(f"no data files given; set `{config_key}` to a .parquet or .jsonl file (or a list)")
    rows: list[dict] = []
    default_split = "test" if "val" in config_key else "train"
    for path in files:
        if not path.is_file():
            rows.extend(_read_dataset(path, default_split, config_key))
            continue
        suffix = path.suffix.lower()
        if suffix == ".parquet":
            rows.extend(_read_parquet(path, config_key))
        elif suffix in (".jsonl", ".json"):
            rows.extend(_read_json(path, config_key))
        else:
            raise DataError(f"cannot read {path} (from `{config_key}`): unknown extension {suffix!r}; "
                            f"supported: {', '.join(SUPPORTED_EXTENSIONS)}")
    return rows


def _read_dataset(path: Path, default_split: str, config_key: str) -> list[dict]:
    """A Hugging Face dataset folder or hub name (``verl.data.hf``), or a clear not-found error."""
    from verl.data import hf

    base, split = hf.split_spec(str(path))
    if Path(base).is_dir():
        return hf.read_local_dataset(Path(base), split, default_split, config_key)
    if path.suffix.lower() not in SUPPORTED_EXTENSIONS and hf.looks_like_hub_name(str(path)):
        return hf.read_hub_dataset(str(path), default_split, config_key)
    raise DataError(f"data file not found: {path} (from `{config_key}`); check the path "
                    f"or set `{config_key}` to an existing file")


def _read_parquet(path: Path, config_key: str) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as e:  # truncated, corrupt, or not parquet at all
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"{path} (from `{config_key}`) is not a readable parquet file ({detail}); the file is "
                        f"truncated or corrupt: write it again (e.g. verl.data.write_parquet, or pandas "
                        f"DataFrame.to_parquet)") from None


def _read_json(path: Path, config_key: str = "data.train_files") -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} (from `{config_key}`) is not UTF-8 text ({e}); JSONL files are UTF-8, one "
                        f"JSON object per line") from None
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: invalid JSON: {e}") from e
        where = [f"item {i}" for i in range(len(rows))]
    else:
        rows, where = [], []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}, line {lineno}: invalid JSON: {e}") from e
            where.append(f"line {lineno}")
    for row, loc in zip(rows, where):
        if not isinstance(row, dict):
            raise DataError(f"{path}, {loc}: expected a JSON object per row, got {type(row).__name__}")
    return rows


def write_parquet(rows: Iterable[dict], path: str | os.PathLike) -> Path:
    """Write rows as one parquet file (nested dicts and lists become struct / list columns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(list(rows))
    empty = [f.name for f in table.schema if pa.types.is_struct(f.type) and f.type.num_fields == 0]
    if empty:
        raise DataError(f"parquet cannot store columns whose dicts are empty in every row: {empty}; "
                        f"give them a field, leave them out, or use write_jsonl")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def write_jsonl(rows: Iterable[dict], path: str | os.PathLike) -> Path:
    """Write rows as JSON lines, one object per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
