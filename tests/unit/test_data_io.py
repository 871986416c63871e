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
    (tmp_path / "d.xlsx").write_text("a,b\n")
    with pytest.raises(DataError, match=r"'\.xlsx'.*\.parquet, \.jsonl, \.json, \.csv, \.tsv"):
        read_rows(tmp_path / "d.xlsx")


def test_csv_and_tsv_tables_read_as_text_with_empty_cells_as_none(tmp_path):
    (tmp_path / "d.csv").write_text('prompt,data_source,ground_truth\n"What is 1+1, exactly?",gsm8k,2\n2+2=,gsm8k,\n')
    assert read_rows(tmp_path / "d.csv") == [
        {"prompt": "What is 1+1, exactly?", "data_source": "gsm8k", "ground_truth": "2"},  # a quoted comma stays
        {"prompt": "2+2=", "data_source": "gsm8k", "ground_truth": None}]                # an empty cell is None
    (tmp_path / "d.tsv").write_text("prompt\tanswer\n1,2=\t3\n")
    assert read_rows(tmp_path / "d.tsv") == [{"prompt": "1,2=", "answer": "3"}]
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n1,2,3\n")
    with pytest.raises(DataError, match=r"bad\.csv, row 2: 3 cells for 2 header columns; quote cells that hold the "
                                        r"delimiter"):
        read_rows(tmp_path / "bad.csv")


def test_a_pattern_reads_its_matches_in_name_order_and_one_matching_nothing_is_named(tmp_path):
    # Sharded datasets: train-00000-of-00002.parquet, train-00001-of-00002.parquet.
    for shard in (1, 0):
        write_parquet([{"shard": shard}], tmp_path / f"train-0000{shard}-of-00002.parquet")
    assert read_rows(str(tmp_path / "train-*.parquet")) == [{"shard": 0}, {"shard": 1}]
    assert read_rows([str(tmp_path / "train-00001*"), str(tmp_path / "train-00000*")]) == [{"shard": 1}, {"shard": 0}]
    with pytest.raises(DataError, match=r"^no file matches .*val-\*\.parquet \(from `data.val_files`\); check the "
                                        r"pattern"):
        read_rows(str(tmp_path / "val-*.parquet"), config_key="data.val_files")


def test_bad_jsonl_line_is_named(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"a": 1}\n{broken\n')
    with pytest.raises(DataError, match="line 2"):
        read_rows(tmp_path / "d.jsonl")


def test_writing_an_always_empty_dict_column_to_parquet_is_refused_with_advice(tmp_path):
    with pytest.raises(DataError, match=r"\['extra_info'\].*write_jsonl"):
        write_parquet([{"prompt": "a", "extra_info": {}}], tmp_path / "d.parquet")


def test_a_list_written_as_one_string_reads_its_files(tmp_path):
    """verl's scripts build `data.train_files="['$a', '$b']"`: a YAML file or a Python call can hand that
    on as one string, which read as a glob pattern matched nothing."""
    a = write_jsonl([{"prompt": "a"}], tmp_path / "a.jsonl")
    b = write_jsonl([{"prompt": "b"}], tmp_path / "b.jsonl")
    for text in (f"['{a}', '{b}']", f'["{a}", "{b}"]', f"[{a}, {b}]"):
        assert [r["prompt"] for r in read_rows(text)] == ["a", "b"]
    (tmp_path / "part-1.jsonl").write_text('{"prompt": "p"}\n')
    assert read_rows(str(tmp_path / "part-[0-9].jsonl")) == [{"prompt": "p"}]  # a pattern stays a pattern
    with pytest.raises(DataError, match=r"data file not found: .*nope\.jsonl"):
        read_rows(f"['{a}', '{tmp_path / 'nope.jsonl'}']")


def test_a_byte_order_mark_from_a_windows_editor_or_excel_is_not_part_of_the_first_row(tmp_path):
    """Before: the JSON lines file failed on line 1 ('Unexpected UTF-8 BOM'), and the CSV's first column
    was named '\\ufeffprompt', so 'no prompt column' listed a 'prompt' that looked right."""
    bom = "\ufeff"
    (tmp_path / "d.jsonl").write_text(bom + '{"prompt": "a"}\n', encoding="utf-8")
    (tmp_path / "d.csv").write_text(bom + "prompt,answer\nb,1\n", encoding="utf-8")
    assert read_rows(tmp_path / "d.jsonl") == [{"prompt": "a"}]
    assert read_rows(tmp_path / "d.csv") == [{"prompt": "b", "answer": "1"}]
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n{broken\n')
    with pytest.raises(DataError, match=r"bad\.jsonl \(from `data\.val_files`\), line 2: invalid JSON"):
        read_rows(tmp_path / "bad.jsonl", config_key="data.val_files")


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16"])
def test_a_utf16_file_is_named_as_utf16_not_as_invalid_json(tmp_path, encoding):
    """Windows' "Unicode" and PowerShell's `>` write UTF-16. Without its byte order mark every other byte
    is NUL and was read as UTF-8: "line 1: invalid JSON: Expecting property name ...", or a CSV whose
    header was not its columns."""
    for name, text in (("d.jsonl", '{"prompt": "1+1="}\n'), ("d.csv", "prompt,answer\n1+1=,2\n")):
        path = tmp_path / name
        path.write_bytes(text.encode(encoding))
        with pytest.raises(DataError, match=rf"{name} \(from `data.train_files`\) is UTF-16 text, not UTF-8; .*save "
                                            r"it as UTF-8"):
            read_rows(path)


def test_the_files_both_train_and_val_read_are_found_under_any_spelling(tmp_path, monkeypatch):
    from verl.data.io import files_read_by_both

    monkeypatch.chdir(tmp_path)
    train = write_jsonl(ROWS, tmp_path / "train.jsonl")
    test = write_jsonl(ROWS, tmp_path / "test.jsonl")
    assert files_read_by_both(str(train), ["./train.jsonl"]) == [str(train.resolve())]
    assert files_read_by_both("train*.jsonl", [str(test)]) == []
    assert files_read_by_both(str(train), None) == [] and files_read_by_both(str(train), "org/dataset") == []


def test_a_json_file_holding_the_table_in_one_object_is_named_with_the_layout_to_write(tmp_path):
    """Before: pandas' to_json default was read as one row whose prompt was the whole column ("the prompt ... must
    be a string or a list of messages, got dict: {'0': ..."), and rows under one key or written over several lines
    failed with "line 1: invalid JSON"."""
    import pandas as pd

    frame = pd.DataFrame(ROWS)
    frame.to_json(tmp_path / "columns.json")
    with pytest.raises(DataError, match=r"columns.json \(from `data.train_files`\) is one JSON object of columns "
                                        r"\['data_source', 'prompt', 'reward_model', 'extra_info'\], each \{row index: "
                                        r"value\} \(pandas' to_json default\), not rows; write one JSON object per row: "
                                        r"df.to_json\(path, orient='records', lines=True\)"):
        read_rows(tmp_path / "columns.json")
    frame.to_json(tmp_path / "index.json", orient="index")
    with pytest.raises(DataError, match=r"index.json \(from `data.val_files`\) is one JSON object of 2 rows keyed by "
                                        r"their index \(pandas' orient='index'\)"):
        read_rows(tmp_path / "index.json", config_key="data.val_files")
    (tmp_path / "wrapped.json").write_text(json.dumps({"version": "1.0", "data": ROWS}, indent=2))
    with pytest.raises(DataError, match=r"wrapped.json \(from `data.train_files`\) is one JSON object whose key 'data' "
                                        r"holds 2 rows; give the rows themselves, one JSON object per line \(e.g. jq -c "
                                        r"'.data\[\]' wrapped.json > rows.jsonl\)"):
        read_rows(tmp_path / "wrapped.json")
    # What is rows stays read as rows: records, one row over several lines, a row with a list of its own dicts.
    frame.to_json(tmp_path / "records.json", orient="records")
    assert read_rows(tmp_path / "records.json") == ROWS
    (tmp_path / "one.json").write_text(json.dumps(ROWS[0], indent=2))
    assert read_rows(tmp_path / "one.json") == ROWS[:1]
    tools = {"prompt": "2+3?", "tools": [{"type": "function", "name": "calc"}]}
    write_jsonl([tools], tmp_path / "tools.jsonl")
    assert read_rows(tmp_path / "tools.jsonl") == [tools]
