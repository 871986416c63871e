"""Write the built-in addition task as verl-layout parquet files, to show (and test) the layout.

    python examples/data/make_addition_parquet.py --out data/addition

Each row: ``prompt`` (chat messages), ``data_source``, ``ability``, ``reward_model.ground_truth``,
``extra_info``. Any dataset in this layout trains with ``data.train_files=...``.
"""

import argparse
from pathlib import Path

from verl.data import write_parquet
from verl.data.tasks import addition


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/addition", help="output folder")
    parser.add_argument("--train-size", type=int, default=None, help="rows in train.parquet (default: all)")
    parser.add_argument("--test-size", type=int, default=200, help="rows in test.parquet")
    args = parser.parse_args()
    out = Path(args.out)
    for split, n in (("train", args.train_size), ("test", args.test_size)):
        rows = addition.make_rows(split, n=n, seed=0)
        # Tell the custom reward function which task a row came from.
        for row in rows:
            row["data_source"] = "addition_example"
        print(f"{write_parquet(rows, out / f'{split}.parquet')}: {len(rows)} rows")


if __name__ == "__main__":
    main()
