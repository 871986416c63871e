"""Hugging Face datasets as inputs (folders and hub names), and TRL's prompt layouts."""

import pytest

datasets = pytest.importorskip("datasets")

from verl.data import DataError, RLDataset, read_rows, write_jsonl  # noqa: E402
from verl.models.tiny import build_char_tokenizer  # noqa: E402

CHAT = build_char_tokenizer(chat_template="{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                                          "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture
def saved(tmp_path):
    folder = tmp_path / "saved"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_list([{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": "4"}]),
        "test": datasets.Dataset.from_list([{"question": "3+3?", "answer": "6"}]),
    }).save_to_disk(str(folder))
    return folder


def test_save_to_disk_folder_picks_the_split_of_the_setting(saved):
    assert [r["answer"] for r in read_rows(str(saved))] == ["2", "4"]
    assert [r["answer"] for r in read_rows(str(saved), config_key="data.val_files")] == ["6"]
    assert [r["answer"] for r in read_rows(f"{saved}@test")] == ["6"]


def test_an_unknown_split_lists_the_splits(saved):
    with pytest.raises(DataError, match=r"no split 'dev'; its splits: \['train', 'test'\]"):
        read_rows(f"{saved}@dev")


def test_a_single_saved_dataset_has_no_splits(tmp_path):
    datasets.Dataset.from_list([{"prompt": "hi", "solution": "yo"}]).save_to_disk(str(tmp_path / "one"))
    assert read_rows(str(tmp_path / "one")) == [{"prompt": "hi", "solution": "yo"}]


def test_a_folder_of_data_files_is_read_by_split(tmp_path):
    write_jsonl([{"prompt": "a", "solution": "1"}], tmp_path / "files" / "train.jsonl")
    write_jsonl([{"prompt": "b", "solution": "2"}, {"prompt": "c", "solution": "3"}], tmp_path / "files" / "test.jsonl")
    assert [r["prompt"] for r in read_rows(str(tmp_path / "files"))] == ["a"]
    assert [r["prompt"] for r in read_rows(str(tmp_path / "files"), config_key="data.val_files")] == ["b", "c"]


def test_a_folder_of_data_files_of_several_kinds_is_refused_naming_them(tmp_path):
    """Before: datasets read the most common kind and dropped the others without a word (a parquet beside a
    .jsonl gave the parquet's rows only), or failed with "DatasetGenerationError: An error occurred while
    generating the dataset" on a stray stats.json."""
    from verl.data import write_parquet

    folder = tmp_path / "mixed"
    write_parquet([{"prompt": "a", "solution": "1"}], folder / "train.parquet")
    write_jsonl([{"prompt": "b", "solution": "2"}], folder / "extra.jsonl")
    with pytest.raises(DataError, match=rf"^{folder} \(from `data.train_files`\) holds data files of 2 kinds \(.jsonl: "
                                        rf"extra.jsonl; .parquet: train.parquet\), and a folder is read as one kind; give "
                                        rf"the files themselves, e.g. data.train_files='{folder}/\*.parquet'"):
        read_rows(str(folder))
    (folder / "extra.jsonl").unlink()
    (folder / "dataset_infos.json").write_text("{}")  # metadata of a hub download, not rows
    (folder / ".cache").mkdir()
    write_jsonl([{"prompt": "c"}], folder / ".cache" / "old.jsonl")
    assert [r["prompt"] for r in read_rows(str(folder))] == ["a"]


def test_a_hub_name_without_network_says_how_to_get_the_data(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataError, match=r"data\.train_files.*'nobody-here/no-such-dataset'.*save_to_disk"):
        read_rows("nobody-here/no-such-dataset")


def test_a_missing_file_with_an_extension_is_not_tried_on_the_hub(tmp_path):
    with pytest.raises(DataError, match="data file not found"):
        read_rows(str(tmp_path / "nope.parquet"))


def test_trl_conversational_messages_become_prompt_and_reference(tmp_path):
    datasets.Dataset.from_list([{"messages": [{"role": "system", "content": "be brief"},
                                              {"role": "user", "content": "2+2?"},
                                              {"role": "assistant", "content": "4"}], "level": 1}]
                               ).save_to_disk(str(tmp_path / "chat"))
    item = RLDataset(str(tmp_path / "chat"), CHAT)[0]
    assert CHAT.decode(item["input_ids"]) == "<system>be brief<user>2+2?<assistant>"
    assert item["ground_truth"] == "4" and item["extra_info"] == {"level": 1}
    assert [m["role"] for m in item["raw_prompt"]] == ["system", "user"]


def test_trl_standard_prompt_with_solution_column(tmp_path):
    path = write_jsonl([{"prompt": "Say hi", "solution": "hi"}], tmp_path / "d.jsonl")
    item = RLDataset(path, CHAT)[0]
    assert CHAT.decode(item["input_ids"]) == "<user>Say hi<assistant>" and item["ground_truth"] == "hi"


def test_messages_with_only_an_assistant_turn_are_refused(tmp_path):
    path = write_jsonl([{"messages": [{"role": "assistant", "content": "4"}]}], tmp_path / "d.jsonl")
    with pytest.raises(DataError, match="only assistant turns"):
        RLDataset(path, CHAT)
