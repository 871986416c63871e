"""Reading and writing row files: parquet (verl's format), JSON lines and CSV/TSV; Hugging Face datasets
(a dataset folder or a hub name, see :mod:`verl.data.hf`) are read too.

Rows are plain python dicts. Nested parquet columns come back as python objects: a struct
column as a dict, a list-of-struct column (chat messages) as a list of dicts. A struct column has
one set of fields for all rows, so a dict key missing from some rows reads back as None there.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from verl.errors import DataError

SUPPORTED_EXTENSIONS = (".parquet", ".jsonl", ".json", ".csv", ".tsv")


def is_messages(value: Any) -> bool:
    """True for a chat conversation: a list of ``{"role": ..., "content": ...}`` dicts."""
    return isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value)


def _listed(text: str) -> list[str] | None:
    """The files of a list written as one string, as verl's scripts build it in the shell
    (``"['a.parquet', 'b.parquet']"``) and a YAML file or Python call may pass it on unparsed; None
    for anything else (a glob's ``[...]`` is a pattern: ``data/part-[0-9].parquet``)."""
    import glob

    import yaml

    text = text.strip()
    if not (text.startswith("[") and text.endswith("]")) or os.path.exists(text) or glob.glob(text):
        return None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    return None


def _as_paths(paths: str | os.PathLike | Sequence[str | os.PathLike], config_key: str) -> list[Path]:
    """The files named; a pattern (``data/train-*.parquet``, a sharded dataset) is its matches, in name order."""
    import glob

    if isinstance(paths, (str, os.PathLike)):
        paths = _listed(str(paths)) or [paths]
    out = []
    for given in paths:
        path = os.path.expanduser(str(given))
        if glob.has_magic(path) and not os.path.exists(path):
            matches = sorted(glob.glob(path))
            if not matches:
                raise DataError(f"no file matches {given} (from `{config_key}`); check the pattern, or give the "
                                f"files themselves")
            out.extend(Path(m) for m in matches)
        else:
            out.append(Path(path))
    return out


def files_read_by_both(train_files, val_files) -> list[str]:
    """The local files that ``data.train_files`` and ``data.val_files`` both name (hub ids and patterns that
    match nothing are left out: their reading says what is wrong with them)."""
    def resolved(files, key):
        try:
            return {str(p.resolve()) for p in _as_paths(files, key) if p.is_file()}
        except DataError:
            return set()
    if train_files is None or val_files is None:
        return []
    return sorted(resolved(train_files, "data.train_files") & resolved(val_files, "data.val_files"))


def subset_positions(count: int, max_samples: int | None, shuffle: bool, seed: int | None) -> list[int]:
    """The positions kept of ``count`` rows under verl's ``data.*_max_samples``: all of them when it is
    None, -1, 0 or at least ``count``; else that many, drawn with ``seed`` (in file order) when
    ``shuffle``, or the first ones."""
    if max_samples is None or not 0 < max_samples < count:
        return list(range(count))
    if not shuffle:
        return list(range(max_samples))
    import numpy as np

    return sorted(np.random.default_rng(seed).choice(count, size=max_samples, replace=False).tolist())


def read_rows(paths: str | os.PathLike | Sequence[str | os.PathLike], *,
              config_key: str = "data.train_files") -> list[dict]:
    """All rows of one file or of several files, concatenated in order.

    ``config_key`` is the setting the paths came from; errors name it so the user knows what to fix.
    """
    files = _as_paths(paths, config_key)
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
        elif suffix in (".csv", ".tsv"):
            rows.extend(_read_csv(path, config_key, "\t" if suffix == ".tsv" else ","))
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
        # One file: ParquetFile, not read_table (whose dataset layer imports pandas, ~0.3 s of every start)
        with pq.ParquetFile(path) as parquet:
            return parquet.read().to_pylist()
    except (pa.ArrowException, OSError) as e:  # truncated, corrupt, or not parquet at all
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"{path} (from `{config_key}`) is not a readable parquet file ({detail}); the file is "
                        f"truncated or corrupt: write it again (e.g. verl.data.write_parquet, or pandas "
                        f"DataFrame.to_parquet)") from None


def _read_csv(path: Path, config_key: str, delimiter: str) -> list[dict]:
    """A table with a header row; every value is text (a number column too, as typed in the file), and
    an empty cell is None. Chat messages and other nested values need JSON lines or parquet."""
    import csv

    text = _read_text(path, config_key, f"{path.suffix[1:]} files are UTF-8, a header row then one row per line")
    try:
        rows = [{key: (value if value != "" else None) for key, value in row.items()}
                for row in csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)]
    except csv.Error as e:
        raise DataError(f"{path} (from `{config_key}`) is not a readable UTF-8 {path.suffix[1:]} file ({e})") from None
    for i, row in enumerate(rows):
        if None in row:  # more cells than the header has columns
            raise DataError(f"{path}, row {i + 1}: {len(row) - 1 + len(row[None])} cells for {len(row) - 1} "
                            f"header columns; quote cells that hold the delimiter")
    return rows


def _read_text(path: Path, config_key: str, expected: str) -> str:
    """The file's text as UTF-8 (a byte order mark dropped). UTF-16 (Windows' "Unicode", PowerShell's
    ``>``) is named as such: without its mark every other byte is NUL, which UTF-8 reads without error."""
    raw = path.read_bytes()
    utf16 = raw[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in raw[:4096]
    if utf16:
        raise DataError(f"{path} (from `{config_key}`) is UTF-16 text, not UTF-8; {expected}: save it as UTF-8 "
                        f"(e.g. `iconv -f UTF-16 -t UTF-8 in > out`, or your editor's 'UTF-8' encoding)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} (from `{config_key}`) is not UTF-8 text ({e}); {expected}") from None


def _read_json(path: Path, config_key: str = "data.train_files") -> list[dict]:
    text = _read_text(path, config_key, "JSONL files are UTF-8, one JSON object per line")
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path} (from `{config_key}`): invalid JSON: {e}") from e
        where = [f"item {i}" for i in range(len(rows))]
    elif text.lstrip().startswith("{") and (whole := _one_object(text)) is not None:
        _refuse_a_table_in_one_object(whole, path, config_key)
        rows, where = [whole], ["its object"]  # one row written over several lines
    else:
        rows, where = [], []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path} (from `{config_key}`), line {lineno}: invalid JSON: {e}") from e
            where.append(f"line {lineno}")
    for row, loc in zip(rows, where):
        if not isinstance(row, dict):
            raise DataError(f"{path}, {loc}: expected a JSON object per row, got {type(row).__name__}")
    return rows


_ROW_KEYS = {"prompt", "messages", "question", "problem", "instruction", "query", "chosen", "completion",
             "conversations", "data_source", "reward_model"}


def _one_object(text: str) -> dict | None:
    """The file's text as one JSON object, if it is one (JSON lines of several rows are not)."""
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        return None
    return whole if isinstance(whole, dict) else None


def _refuse_a_table_in_one_object(whole: dict, path: Path, config_key: str) -> None:
    """A file that is one JSON object holding the table, not rows: pandas' ``to_json`` default (columns, each
    ``{row index: value}``), its ``orient='index'`` (``{row index: row}``), or rows under one key
    (``{"data": [...]}``). Before, it was read as one row whose prompt was a whole column."""
    fix = "write one JSON object per row: df.to_json(path, orient='records', lines=True), or write_jsonl(rows, path)"
    values = list(whole.values())
    if values and all(isinstance(v, dict) and v and all(str(k).isdigit() for k in v) for v in values):
        raise DataError(f"{path} (from `{config_key}`) is one JSON object of columns {list(whole)[:6]}, each "
                        f"{{row index: value}} (pandas' to_json default), not rows; {fix}")
    if len(whole) > 1 and all(str(k).isdigit() for k in whole) and all(isinstance(v, dict) for v in values):
        raise DataError(f"{path} (from `{config_key}`) is one JSON object of {len(whole)} rows keyed by their index "
                        f"(pandas' orient='index'); {fix}")
    # Rows, not a row's own list (its chat messages, tools or images): dicts holding a prompt of some layout.
    lists = [k for k, v in whole.items() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)
             and all(_ROW_KEYS & r.keys() for r in v)]
    if lists:
        key = lists[0]
        raise DataError(f"{path} (from `{config_key}`) is one JSON object whose key '{key}' holds {len(whole[key])} "
                        f"rows; give the rows themselves, one JSON object per line (e.g. jq -c '.{key}[]' "
                        f"{path.name} > rows.jsonl), or a JSON array of them")


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
