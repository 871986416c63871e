"""data.custom_cls end to end through ``main_ppo`` on the tiny model: the user's RLDataset subclass
makes the training and the validation prompts (its reward function refuses any other), and a class
whose items lack the trainer's fields stops the run before training, naming them."""

import json

import pytest

from verl.data import write_parquet
from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow

DATASET_FILE = '''
from verl.data import RLDataset


class HintedDataset(RLDataset):
    def prompt_of(self, row):
        return [{"role": "system", "content": "Answer with one digit."}, *row["prompt"]]

    def __getitem__(self, i):
        item = super().__getitem__(i)
        item["extra_info"] = {**item["extra_info"], "hinted": item["raw_prompt"][0]["role"] == "system"}
        return item
'''

RAW_ITEMS_FILE = '''
import torch


class RawItems(torch.utils.data.Dataset):
    def __init__(self, data_files, tokenizer, processor, config):
        pass

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"raw_prompt": [{"role": "user", "content": "hi"}], "data_source": "echo", "index": i}
'''

REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if not extra_info.get("hinted"):
        raise ValueError("this prompt did not come from HintedDataset")
    return float(solution_str[:1] == ground_truth)
'''


def _args(tiny_model_dir, tmp_path, dataset_source, name, *overrides):
    rows = [{"prompt": [{"role": "user", "content": f"say {i % 10}:"}], "data_source": "echo",
             "reward_model": {"style": "rule", "ground_truth": str(i % 10)}, "extra_info": {"i": i}}
            for i in range(16)]
    train = write_parquet(rows, tmp_path / "train.parquet")
    val = write_parquet(rows[:4], tmp_path / "val.parquet")
    (tmp_path / "my_dataset.py").write_text(dataset_source)
    (tmp_path / "reward.py").write_text(REWARD_FILE)
    return [f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={train}", f"data.val_files={val}",
            f"data.custom_cls.path={tmp_path / 'my_dataset.py'}", f"data.custom_cls.name={name}",
            f"custom_reward_function.path={tmp_path / 'reward.py'}", "reward.on_error=raise",
            "data.train_batch_size=4", "data.max_prompt_length=48", "data.max_response_length=4",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.val_before_train=true",
            f"trainer.default_local_dir={tmp_path / 'out'}", "trainer.progress_bar=false", *overrides]


def test_a_custom_dataset_class_makes_the_training_and_validation_prompts(tiny_model_dir, tmp_path):
    assert main(_args(tiny_model_dir, tmp_path, DATASET_FILE, "HintedDataset")) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "critic/score/mean" in r] == [1, 2]
    val_steps = sorted({r["step"] for r in rows if any(k.startswith("val-") for k in r)})
    assert val_steps == [0, 2]
    # The system message of the class is in the prompts: they are longer than the file's.
    assert min(r["prompt_length/min"] for r in rows if "prompt_length/min" in r) > len("say 0:")


def test_items_without_the_trainers_fields_stop_the_run_naming_them(tiny_model_dir, tmp_path, capsys):
    assert main(_args(tiny_model_dir, tmp_path, RAW_ITEMS_FILE, "RawItems")) == 2
    err = capsys.readouterr().err
    assert "RawItems from" in err and "item 0 of data.train_files lacks input_ids, ground_truth, extra_info" in err
