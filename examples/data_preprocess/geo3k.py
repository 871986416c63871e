"""Turn Geometry3K (hiyouga/geometry3k) into verl-layout parquet with images: ``train.parquet``, ``test.parquet``.

    python examples/data_preprocess/geo3k.py --local_save_dir data/geo3k                  # from the Hub
    python examples/data_preprocess/geo3k.py --local_dataset_path geometry3k/data --local_save_dir data/geo3k

Input: rows with ``problem`` (its text holds ``<image>`` where the figure goes), ``answer`` and
``images`` (PIL images, or ``{"bytes", "path"}`` dicts as parquet stores them): the layout of
hiyouga/geometry3k. --local_dataset_path works as in ``gsm8k.py``, whose loading this script shares.

Output rows (verl's examples/data_preprocess/geo3k.py layout): the problem plus an instruction to
think, then box the answer; the images as ``{"bytes": PNG}``; ``data_source`` hiyouga/geometry3k
(scored by ``verl.rewards.scorers.geo3k``); the answer as ``reward_model.ground_truth``. Train a
Qwen2-VL / Qwen2.5-VL policy on them (docs/vision.md).
"""

from __future__ import annotations

import argparse
import io

from gsm8k import load_splits, save_splits  # the sibling script: this folder is first on sys.path

DATA_SOURCE = "hiyouga/geometry3k"
INSTRUCTION = ("You FIRST think about the reasoning process as an internal monologue and then provide the final "
               "answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST "
               "BE put in \\boxed{}.")


def image_bytes(image) -> dict:
    """An image as parquet holds it: ``{"bytes": PNG}`` from a PIL image, a stored dict kept as it is."""
    if isinstance(image, dict):
        return {"bytes": image.get("bytes"), "path": image.get("path")}
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return {"bytes": buffer.getvalue(), "path": None}


def to_row(example: dict, split: str, index: int) -> dict | None:
    if example.get("answer") in (None, ""):
        return None
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{example['problem']} {INSTRUCTION}"}],
        "images": [image_bytes(image) for image in example["images"]],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": example["answer"]},
        "extra_info": {"split": split, "index": index, "answer": example["answer"], "question": example["problem"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_dataset_path", nargs="+", default=None,
                        help="folder or files in the Geometry3K layout (default: download hiyouga/geometry3k)")
    parser.add_argument("--local_save_dir", default="~/data/geo3k", help="where train/test.parquet are written")
    args = parser.parse_args()
    save_splits(load_splits(args.local_dataset_path, DATA_SOURCE, None), to_row, args.local_save_dir)


if __name__ == "__main__":
    main()
