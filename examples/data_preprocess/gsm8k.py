"""Turn GSM8K into verl-layout parquet: ``train.parquet`` and ``test.parquet`` in --local_save_dir.

    python examples/data_preprocess/gsm8k.py --local_save_dir data/gsm8k        # openai/gsm8k from the Hub
    python examples/data_preprocess/gsm8k.py --local_dataset_path gsm8k/main --local_save_dir data/gsm8k

Input: GSM8K's public layout, rows with ``question`` and ``answer``, where the answer is a worked
solution whose last line is ``#### 72``. --local_dataset_path takes a folder of such files (as
downloaded from the Hub, or ``train.jsonl`` / ``test.jsonl``), or the files themselves; a file's
name says its split (it contains "train" or "test").

Output rows: the question plus an instruction to end with ``#### <number>`` as the user message,
``data_source`` "openai/gsm8k" (scored by ``verl.rewards.scorers.gsm8k``), and the number after
``####`` as ``reward_model.ground_truth``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from verl.data.io import write_parquet
from verl.rewards.scorers.gsm8k import extract_solution

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = ('Work through it step by step, then give the final answer as a number on a last line of the form '
               '"#### 42".')
SPLITS = ("train", "test")
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def local_source(local_paths: list[str]) -> tuple[str, dict | None]:
    """``(folder or builder name, data_files)`` for ``datasets.load_dataset``; exits naming a bad path."""
    paths = [Path(p).expanduser() for p in local_paths]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        sys.exit(f"--local_dataset_path: no such file or folder: {missing}")
    if len(paths) == 1 and paths[0].is_dir():
        return str(paths[0]), None  # datasets finds the split files in it
    builders = {BUILDERS.get(p.suffix.lower()) for p in paths}
    if None in builders or len(builders) > 1:
        sys.exit(f"--local_dataset_path: give files of one type, {sorted(BUILDERS)}; got {local_paths}")
    data_files: dict[str, list[str]] = {}
    for path in paths:
        split = next((s for s in SPLITS if s in path.name.lower()), None)
        if split is None:
            sys.exit(f"cannot tell the split of {path}: its name should contain 'train' or 'test'")
        data_files.setdefault(split, []).append(str(path))
    return builders.pop(), data_files


def load_splits(local_paths: list[str] | None, hub_name: str, hub_config: str | None):
    """A ``datasets.DatasetDict`` from local files (a folder, or files named by split) or the Hub."""
    source = local_source(local_paths) if local_paths else None  # checked before the slow import
    import datasets

    if source is not None:
        return datasets.load_dataset(source[0], data_files=source[1])
    try:
        return datasets.load_dataset(hub_name, hub_config)
    except OSError as e:  # ConnectionError when offline, FileNotFoundError for an unknown name
        sys.exit(f"could not load {hub_name!r} from the Hugging Face Hub ({type(e).__name__}: {e}).\n"
                 f"Without access to the Hub, copy the dataset's files to this machine and pass "
                 f"--local_dataset_path FOLDER (or the files)")


def save_splits(dataset, to_row, save_dir: str) -> None:
    """Write ``to_row(example, split, index)`` for every example of each split present; rows for
    which it returns None (no reference answer) are left out and counted."""
    present = [s for s in SPLITS if s in dataset]
    if not present:
        sys.exit(f"the dataset has none of the splits {SPLITS}; it has {sorted(dataset)}")
    for split in present:
        rows = [to_row(example, split, i) for i, example in enumerate(dataset[split])]
        kept = [row for row in rows if row is not None]
        path = write_parquet(kept, Path(save_dir).expanduser() / f"{split}.parquet")
        skipped = f" ({len(rows) - len(kept)} without a reference answer left out)" if len(kept) < len(rows) else ""
        print(f"{path}: {len(kept)} rows{skipped}")


def to_row(example: dict, split: str, index: int) -> dict | None:
    answer = extract_solution(example["answer"], method="strict")
    if answer is None:
        return None
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{example['question']} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer": example["answer"], "question": example["question"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_dataset_path", nargs="+", default=None,
                        help="folder or files in GSM8K's layout (default: download --hub_name)")
    parser.add_argument("--local_save_dir", default="~/data/gsm8k", help="where train/test.parquet are written")
    parser.add_argument("--hub_name", default="openai/gsm8k", help="dataset on the Hugging Face Hub")
    parser.add_argument("--hub_config", default="main", help="its configuration")
    args = parser.parse_args()
    save_splits(load_splits(args.local_dataset_path, args.hub_name, args.hub_config), to_row, args.local_save_dir)


if __name__ == "__main__":
    main()
