"""data.custom_cls: a dataset class loaded from a python file, built as verl builds it, for training and
validation; every way it can be wrong fails with a ConfigError naming the file and the class."""

import pytest
import torch

from verl.config import ConfigError, TrainerConfig
from verl.data import DataError, RLDataset, collate_prompts, create_rl_dataset, write_jsonl
from verl.models.tiny import build_char_tokenizer

# Subclasses RLDataset as verl's users subclass RLHFDataset: one prompt hook and one item hook.
HINTED = '''
from verl.data import RLDataset


class HintedDataset(RLDataset):
    def prompt_of(self, row):
        return "Hint: " + row["question"]

    def __getitem__(self, i):
        item = super().__getitem__(i)
        item["extra_info"] = {**item["extra_info"], "hinted": True}
        return item
'''

# verl's own subclass habit: __init__ with verl's signature, passed on to the base class.
VERL_STYLE = '''
from verl.data import RLDataset


class VerlStyle(RLDataset):
    def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
        self.seen = (processor, config.max_prompt_length)
        super().__init__(data_files, tokenizer, config, processor, max_samples)
'''

# A dataset that yields items as verl's RLHFDataset does: no input_ids.
UPSTREAM_ITEMS = '''
import torch


class RawItems(torch.utils.data.Dataset):
    def __init__(self, data_files, tokenizer, processor, config):
        self.n = 3

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"raw_prompt": [{"role": "user", "content": "hi"}], "data_source": "echo", "index": i}
'''


@pytest.fixture()
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture()
def data_file(tmp_path):
    rows = [{"question": f"{i}+1=", "data_source": "arith", "answer": str(i + 1), "extra_info": {"i": i}}
            for i in range(4)]
    return write_jsonl(rows, tmp_path / "train.jsonl")


def data_config(tmp_path, source, name, *overrides):
    path = tmp_path / "my_dataset.py"
    path.write_text(source)
    return TrainerConfig.from_overrides([f"data.custom_cls.path={path}", f"data.custom_cls.name={name}",
                                         "data.max_prompt_length=32", *overrides]).data


def test_a_subclass_of_rldataset_changes_the_prompt_and_the_items(tmp_path, tokenizer, data_file):
    ds = create_rl_dataset(str(data_file), tokenizer, data_config(tmp_path, HINTED, "HintedDataset"))
    assert type(ds).__name__ == "HintedDataset" and isinstance(ds, RLDataset) and len(ds) == 4
    item = ds[2]
    assert item["raw_prompt"] == "Hint: 2+1="
    assert tokenizer.decode(item["input_ids"]) == "Q: Hint: 2+1=\nA: "  # rendered by the chat template
    assert item["ground_truth"] == "3" and item["data_source"] == "arith" and item["index"] == 2
    assert item["extra_info"] == {"i": 2, "hinted": True}
    batch = collate_prompts([ds[0], ds[1]], tokenizer.pad_token_id)
    assert list(batch["ground_truth"]) == ["1", "2"]


def test_the_data_section_sets_the_subclass_limits(tmp_path, tokenizer, data_file):
    cfg = data_config(tmp_path, HINTED, "HintedDataset", "data.max_prompt_length=12", "data.truncation=left")
    ds = create_rl_dataset(str(data_file), tokenizer, cfg)
    assert tokenizer.decode(ds[0]["input_ids"]) == "nt: 0+1=\nA: "  # "Q: Hint: 0+1=\nA: " cut to 12 from the left
    cfg = data_config(tmp_path, HINTED, "HintedDataset", "data.max_prompt_length=4")
    with pytest.raises(ConfigError, match=r"HintedDataset.*data\.val_files.*row 0 is 17 tokens long"):
        create_rl_dataset(str(data_file), tokenizer, cfg, config_key="data.val_files")


def test_a_verl_style_constructor_gets_verls_arguments(tmp_path, tokenizer, data_file):
    cfg = data_config(tmp_path, VERL_STYLE, "VerlStyle", "data.prompt_key=question")
    ds = create_rl_dataset(str(data_file), tokenizer, cfg)
    assert ds.seen == (None, 32) and ds[1]["raw_prompt"] == "1+1=" and ds.config is cfg


def test_rldataset_reads_its_settings_from_a_config_and_keywords_win(tokenizer, data_file):
    config = {"prompt_key": "question", "max_prompt_length": 7, "truncation": "right"}
    ds = RLDataset(data_files=data_file, tokenizer=tokenizer, processor=None, config=config)
    assert tokenizer.decode(ds[0]["input_ids"]) == "Q: 0+1="  # "Q: 0+1=\nA: " cut to 7
    assert tokenizer.decode(RLDataset(data_file, tokenizer, config, max_prompt_length=16)[0]["input_ids"]) == \
        "Q: 0+1=\nA: "
    assert len(RLDataset(data_file, tokenizer, config, max_samples=2)) == 2


def test_without_custom_cls_the_builtin_dataset_is_built(tmp_path, tokenizer, data_file):
    cfg = TrainerConfig.from_overrides(["data.prompt_key=question"]).data
    ds = create_rl_dataset(str(data_file), tokenizer, cfg)
    assert type(ds) is RLDataset and ds[0]["raw_prompt"] == "0+1="


def test_items_without_the_needed_fields_fail_at_the_first_item_naming_them(tmp_path, tokenizer, data_file):
    cfg = data_config(tmp_path, UPSTREAM_ITEMS, "RawItems")
    with pytest.raises(ConfigError, match=r"RawItems from .*my_dataset\.py: item 0 of data\.train_files lacks "
                                          r"input_ids, ground_truth, extra_info .*subclass verl\.data\.RLDataset"):
        create_rl_dataset(str(data_file), tokenizer, cfg)


def test_collate_names_the_missing_fields_of_a_later_item(tokenizer):
    good = {"input_ids": torch.tensor([3, 4]), "raw_prompt": "x", "data_source": "s", "ground_truth": "1",
            "extra_info": {}, "index": 0}
    assert collate_prompts([good], tokenizer.pad_token_id)["input_ids"].tolist() == [[3, 4]]
    with pytest.raises(DataError, match=r"item 1 of this batch lacks ground_truth"):
        collate_prompts([good, {k: v for k, v in good.items() if k != "ground_truth"}], tokenizer.pad_token_id)
    with pytest.raises(DataError, match=r"item 0 of this batch has input_ids .*not a non-empty list"):
        collate_prompts([{**good, "input_ids": "abc"}], tokenizer.pad_token_id)


@pytest.mark.parametrize("source, name, message", [
    (None, "HintedDataset", r"dataset class file not found: .*nowhere\.py"),
    ("import no_such_module_xyz\n", "X", r"importing .*my_dataset\.py raised ModuleNotFoundError"),
    (HINTED, "Hinted", r"my_dataset\.py has no class 'Hinted'; Dataset classes it defines: \['HintedDataset'\]"),
    (HINTED, None, r"custom_cls\.name is not; Dataset classes it defines: \['HintedDataset'\]"),
    ("class NotADataset:\n    pass\n", "NotADataset",
     r"class NotADataset does not subclass torch\.utils\.data\.Dataset \(.*my_dataset\.py\)"),
    ("make = 3\n", "make", r"'make' is a int, not a class"),
    ("from torch.utils.data import Dataset\nclass Broken(Dataset):\n    def __init__(self):\n        pass\n",
     "Broken", r"Broken from .*my_dataset\.py failed to build from data\.train_files=.*TypeError.*"
               r"Broken\(data_files=\.\.\., tokenizer=\.\.\., processor=None, config="),
])
def test_a_bad_class_fails_with_a_config_error_naming_file_and_class(tmp_path, tokenizer, data_file, source,
                                                                      name, message):
    path = tmp_path / ("nowhere.py" if source is None else "my_dataset.py")
    if source is not None:
        path.write_text(source)
    overrides = [f"data.custom_cls.path={path}"] + ([f"data.custom_cls.name={name}"] if name else [])
    with pytest.raises(ConfigError, match=message):
        create_rl_dataset(str(data_file), tokenizer, TrainerConfig.from_overrides(overrides).data)


def test_a_misspelt_custom_cls_key_is_refused(tmp_path, tokenizer, data_file):
    with pytest.raises(ConfigError, match=r"data\.custom_cls\.pth is not set"):
        TrainerConfig.from_overrides(["data.custom_cls.pth=my_dataset.py"])
    cfg = TrainerConfig.from_overrides(["+data.custom_cls.pth=my_dataset.py"]).data  # forced in
    with pytest.raises(ConfigError, match=r"data\.custom_cls has unknown keys \['pth'\]"):
        create_rl_dataset(str(data_file), tokenizer, cfg)
