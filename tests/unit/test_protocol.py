import numpy as np
import pytest
import torch

from verl.protocol import FIELDS, Batch


def make_batch(n=5):
    return Batch(
        tensors={"input_ids": torch.arange(n * 3).reshape(n, 3), "score": torch.arange(n, dtype=torch.float32)},
        non_tensors={"uid": [f"u{i}" for i in range(n)], "extra_info": [{"i": i} for i in range(n)]},
        meta={"temperature": 1.0},
    )


def assert_same(a: Batch, b: Batch):
    assert a.keys() == b.keys()
    for k in a.tensors:
        assert torch.equal(a[k], b[k]), k
    for k in a.non_tensors:
        assert list(a[k]) == list(b[k]), k
    assert a.meta == b.meta


def rows_of(b: Batch) -> list[int]:
    """Original row numbers, read from the non-tensor column so that it follows the rows too."""
    uid_rows = [int(u[1:]) for u in b["uid"]]
    assert uid_rows == [d["i"] for d in b["extra_info"]]
    assert uid_rows == b["input_ids"][:, 0].div(3, rounding_mode="floor").tolist()
    assert uid_rows == b["score"].long().tolist()
    return uid_rows


def test_columns_have_the_right_types_and_length():
    b = make_batch()
    assert len(b) == 5
    assert set(b.tensors) == {"input_ids", "score"}
    assert b["uid"].dtype == object and b["uid"].shape == (5,)
    assert "uid" in b and "nope" not in b
    with pytest.raises(KeyError, match="nope"):
        b["nope"]


def test_from_dict_sorts_tensors_from_non_tensors():
    b = Batch.from_dict({"x": torch.zeros(2, 4), "tags": ["a", "b"], "num": np.array([1.0, 2.0])}, meta={"m": 1})
    assert set(b.tensors) == {"x"} and set(b.non_tensors) == {"tags", "num"}
    assert b.meta == {"m": 1}


def test_nested_lists_stay_one_object_per_row():
    msgs = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    b = Batch(non_tensors={"raw_prompt": msgs, "pairs": [[1, 2], [3, 4]]})
    assert b["raw_prompt"].shape == (2,) and b["raw_prompt"][1] == msgs[1]
    assert b["pairs"].shape == (2,) and b["pairs"][0] == [1, 2]


def test_length_mismatch_names_the_column_and_both_lengths():
    with pytest.raises(ValueError, match=r"'uid' has length 3 .* 'x' has length 4"):
        Batch({"x": torch.zeros(4, 2)}, {"uid": ["a", "b", "c"]})
    b = make_batch(5)
    with pytest.raises(ValueError, match=r"'bad' has length 2"):
        b["bad"] = torch.zeros(2)


def test_setitem_pop_select():
    b = make_batch()
    b["adv"] = torch.ones(5, 2)
    assert "adv" in b.tensors
    b["adv"] = ["x"] * 5  # replacing a tensor by a non-tensor moves it
    assert "adv" in b.non_tensors and "adv" not in b.tensors
    assert list(b.pop("adv")) == ["x"] * 5 and "adv" not in b
    s = b.select("input_ids", "uid")
    assert s.keys() == ["input_ids", "uid"] and s.meta == b.meta
    with pytest.raises(KeyError, match="missing"):
        b.select("missing")


def test_split_then_concat_round_trips():
    b = make_batch(5)
    parts = b.split(2)
    assert [len(p) for p in parts] == [2, 2, 1]
    assert rows_of(parts[2]) == [4]
    assert_same(Batch.concat(parts), b)


def test_chunk_gives_near_equal_parts_and_rejects_too_few_rows():
    b = make_batch(5)
    parts = b.chunk(3)
    assert [len(p) for p in parts] == [2, 2, 1]
    assert_same(Batch.concat(parts), b)
    with pytest.raises(ValueError, match="5 rows into 6"):
        b.chunk(6)


def test_concat_rejects_different_columns():
    a, b = make_batch(2), make_batch(2).select("input_ids")
    with pytest.raises(ValueError, match="columns"):
        Batch.concat([a, b])


def test_repeat_interleaved_and_tiled():
    b = make_batch(2)
    assert rows_of(b.repeat(2, interleave=True)) == [0, 0, 1, 1]
    assert rows_of(b.repeat(3, interleave=False)) == [0, 1, 0, 1, 0, 1]
    assert b.repeat(2)["input_ids"].shape == (4, 3)


@pytest.mark.parametrize("idx, expected", [
    ([3, 0], [3, 0]),
    (slice(1, 4), [1, 2, 3]),
    (torch.tensor([4, 1]), [4, 1]),
    (torch.tensor([True, False, True, False, False]), [0, 2]),
    (np.array([2, 2]), [2, 2]),
    (np.array([False, True, False, False, True]), [1, 4]),
    (2, [2]),
])
def test_index_moves_tensor_and_non_tensor_rows_together(idx, expected):
    assert rows_of(make_batch(5).index(idx)) == expected


def test_index_rejects_wrong_boolean_length():
    with pytest.raises(IndexError, match="shape"):
        make_batch(5).index(torch.tensor([True, False]))


def test_union_adds_columns_and_rejects_conflicts():
    b = make_batch(3)
    other = Batch({"values": torch.ones(3, 2)}, {"uid": b["uid"].copy()})
    u = b.union(other)
    assert "values" in u and "values" not in b
    assert set(u.keys()) == set(b.keys()) | {"values"}
    with pytest.raises(ValueError, match="'input_ids' differs"):
        b.union(Batch({"input_ids": torch.zeros(3, 3, dtype=torch.long)}))
    with pytest.raises(ValueError, match="'uid' differs"):
        b.union(Batch(non_tensors={"uid": ["x", "y", "z"]}))


def test_shuffle_is_a_permutation_decided_by_the_generator():
    b = make_batch(8)
    s1 = b.shuffle(torch.Generator().manual_seed(0))
    s2 = b.shuffle(torch.Generator().manual_seed(0))
    assert rows_of(s1) == rows_of(s2)
    assert sorted(rows_of(s1)) == list(range(8)) and rows_of(s1) != list(range(8))


def test_to_nbytes_and_repr():
    b = make_batch(5)
    moved = b.to("cpu")
    assert isinstance(moved, Batch)
    assert_same(moved, b)
    assert b.nbytes() == 5 * 3 * 8 + 5 * 4
    text = repr(b)
    assert "input_ids: [5, 3] int64" in text and "uid: [5] object" in text


def test_fields_document_the_standard_layout():
    for name in ["input_ids", "responses", "response_mask", "old_log_probs", "ref_log_prob", "advantages",
                 "token_level_scores", "uid", "data_source", "ground_truth"]:
        assert name in FIELDS
    assert FIELDS["responses"].startswith("[B, T_resp]")
