"""Turn the MATH competition dataset into verl-layout parquet: ``train.parquet`` and ``test.parquet``.

    python examples/data_preprocess/math_dataset.py --local_save_dir data/math      # MATH-lighteval from the Hub
    python examples/data_preprocess/math_dataset.py --local_dataset_path MATH-lighteval/data --local_save_dir data/math

(The file is not called ``math.py``: run as a script, that name would hide the standard library's
``math`` module from every import.)

Input: rows with ``problem`` and a worked ``solution`` whose answer is in ``\\boxed{...}``, plus
``level`` and ``type`` (the layout of DigitalLearningGmbH/MATH-lighteval). Rows with an ``answer``
column (HuggingFaceH4/MATH-500, which has only a test split) use it as the reference answer, and
its ``subject`` stands in for ``type``. --local_dataset_path works as in ``gsm8k.py``, whose
loading this script shares.

Output rows: the problem plus an instruction to box the final answer, ``data_source`` --hub_name
(all of ``verl.rewards.scorers.SCORERS``' MATH names grade with ``math_answers``, by math-verify),
and the boxed answer as ``reward_model.ground_truth``.
"""

from __future__ import annotations

import argparse

from gsm8k import load_splits, save_splits  # the sibling script: this folder is first on sys.path

from verl.rewards.scorers.math_answers import extract_boxed

INSTRUCTION = "Solve it step by step and write the final answer in \\boxed{}."


def make_to_row(data_source: str):
    def to_row(example: dict, split: str, index: int) -> dict | None:
        answer = example.get("answer") or extract_boxed(example["solution"])
        if answer is None:
            return None
        return {
            "data_source": data_source,
            "prompt": [{"role": "user", "content": f"{example['problem']} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index, "answer": example["solution"],
                           "question": example["problem"], "level": example.get("level"),
                           "type": example.get("type", example.get("subject"))},
        }

    return to_row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_dataset_path", nargs="+", default=None,
                        help="folder or files in the MATH layout (default: download --hub_name)")
    parser.add_argument("--local_save_dir", default="~/data/math", help="where train/test.parquet are written")
    parser.add_argument("--hub_name", default="DigitalLearningGmbH/MATH-lighteval",
                        help="dataset on the Hugging Face Hub; also the rows' data_source")
    parser.add_argument("--hub_config", default=None, help="its configuration")
    args = parser.parse_args()
    dataset = load_splits(args.local_dataset_path, args.hub_name, args.hub_config)
    save_splits(dataset, make_to_row(args.hub_name), args.local_save_dir)


if __name__ == "__main__":
    main()
