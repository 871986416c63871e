import json

import pytest

from verl.data.io import DataError, read_rows, write_jsonl, write_parquet

ROWS = [
    {"data_source": "arith", "prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1="}],
     "reward_model": {"ground_truth": "2", "style": "rule"}, "extra_info": {"index": 0, "split": "train"}},
    {"data_source": "arith", "prompt": [{"role": "user", "content": "2+3="}],
     "reward_model": {"ground_truth": "5", "style": "rule"}, "extra_info": {"index": 1, "split": "train"}},
]


@pytest.mark.parametrize("writer, name", [(write_parquet, "d.parquet"), (write_jsonl, "d.jsonl")])
def test_rows_written_are_read_back_with_nested_columns_as_python_objects(tmp_path, writer, name):
    path = writer(ROWS, tmp_path / name)
    assert read_rows(path) == ROWS
    assert read_rows(str(path))[0]["prompt"][1] == {"role": "user", "content": "1+1="}


def test_json_list_file_and_several_files_concatenate(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(ROWS[:1]))
    write_parquet(ROWS[1:], tmp_path / "b.parquet")
    assert read_rows([tmp_path / "a.json", tmp_path / "b.parquet"]) == ROWS


def test_missing_file_names_path_and_setting(tmp_path):
    with pytest.raises(DataError, match=r"not found: .*nope\.parquet.*data\.val_files"):
        read_rows(tmp_path / "nope.parquet", config_key="data.val_files")


def test_unknown_extension_lists_supported(tmp_path):
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DataError, match=r"'\.csv'.*\.parquet, \.jsonl, \.json"):
        read_rows(tmp_path / "d.csv")


def test_bad_jsonl_line_is_named(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"a": 1}\n{broken\n')
    with pytest.raises(DataError, match="line 2"):
        read_rows(tmp_path / "d.jsonl")


def test_writing_an_always_empty_dict_column_to_parquet_is_refused_with_advice(tmp_path):
    with pytest.raises(DataError, match=r"\['extra_info'\].*write_jsonl"):
        write_parquet([{"prompt": "a", "extra_info": {}}], tmp_path / "d.parquet")
