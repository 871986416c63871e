"""Prompt data: file reading, datasets, collation into a Batch, and a resumable loader."""

from verl.data.collate import collate_prompts
from verl.data.custom import create_rl_dataset
from verl.data.dataset import RLDataset
from verl.data.io import DataError, read_rows, write_jsonl, write_parquet
from verl.data.loader import PromptLoader

__all__ = ["DataError", "PromptLoader", "RLDataset", "collate_prompts", "create_rl_dataset", "read_rows",
           "write_jsonl", "write_parquet"]
