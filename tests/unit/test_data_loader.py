import logging

import pytest
from transformers import AutoTokenizer

from verl.data import DataError, PromptLoader, RLDataset, write_jsonl


@pytest.fixture(scope="module")
def dataset(tiny_model_dir, tmp_path_factory):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": f"{i}+1="}],
             "reward_model": {"ground_truth": str(i + 1)}} for i in range(10)]
    return RLDataset(write_jsonl(rows, tmp_path_factory.mktemp("data") / "d.jsonl"), tok)


def indices(batch):
    return [int(i) for i in batch["index"]]


def make(dataset, **kw):
    return PromptLoader(dataset, kw.pop("batch_size", 4), pad_token_id=0, **kw)


def test_len_counts_batches_per_epoch(dataset):
    assert len(make(dataset)) == 2
    assert len(make(dataset, drop_last=False)) == 3


def test_one_epoch_covers_distinct_rows_in_a_seeded_order(dataset):
    first = [indices(b) for b in make(dataset, seed=3)]
    again = [indices(b) for b in make(dataset, seed=3)]
    other = [indices(b) for b in make(dataset, seed=4)]
    assert first == again and first != other
    assert len(first) == 2 and len(set(sum(first, []))) == 8


def test_epochs_differ_and_next_rolls_over(dataset):
    loader = make(dataset)
    epoch0 = [indices(b) for b in loader]
    assert loader.epoch == 1 and loader.position == 0
    epoch1 = [indices(b) for b in loader]
    assert epoch0 != epoch1
    by_next = make(dataset)
    assert [indices(next(by_next)) for _ in range(4)] == epoch0 + epoch1


def test_no_shuffle_keeps_file_order_and_keeps_the_last_partial_batch(dataset):
    got = [indices(b) for b in make(dataset, shuffle=False, drop_last=False)]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_restored_loader_yields_the_same_next_batches(dataset):
    original = make(dataset, batch_size=3, seed=7)
    next(original)
    next(original)
    state = original.state_dict()
    expected = [next(original) for _ in range(5)]  # crosses into epoch 1 and 2

    resumed = make(dataset, batch_size=3, seed=7)
    resumed.load_state_dict(state)
    got = [next(resumed) for _ in range(5)]
    for e, g in zip(expected, got):
        assert e["input_ids"].equal(g["input_ids"]) and e["attention_mask"].equal(g["attention_mask"])
        assert indices(e) == indices(g) and list(e["ground_truth"]) == list(g["ground_truth"])


def test_state_after_the_last_batch_of_an_epoch_resumes_with_the_next_epoch(dataset):
    original = make(dataset)
    for _ in original:
        break
    next(original)  # the epoch's last batch
    state = original.state_dict()
    resumed = make(dataset)
    resumed.load_state_dict(state)
    fresh = make(dataset)
    list(fresh)
    epoch1 = [indices(b) for b in fresh]
    assert [indices(b) for b in resumed] == [indices(b) for b in original] == epoch1


def test_resume_with_other_settings_is_refused(dataset):
    state = make(dataset, batch_size=4).state_dict()
    with pytest.raises(DataError, match=r"^cannot resume the prompt loader: the prompt batch size \(e.g. data.train_batch_size\): "
                                        r"saved 4 now 2; the resumed run "
                                        r"would see a different order of prompts. Use the saved settings and data to "
                                        r"resume, or start a new run \(another trainer.default_local_dir, or "
                                        r"trainer.resume_mode=disable"):
        make(dataset, batch_size=2).load_state_dict(state)


def test_a_resume_over_edited_rows_says_how_many_changed_and_where_it_goes_on(dataset, tiny_model_dir, tmp_path,
                                                                            caplog):
    """The same number of rows, edited (data.train_files rewritten in place). Before: resumed without a word, the
    rest of the epoch drawn by position from rows the run never saw in that order."""
    loader = make(dataset, data_key="data.train_files")
    next(loader)
    state = loader.state_dict()
    rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": f"{i}+{2 if i in (3, 7) else 1}="}],
             "reward_model": {"ground_truth": str(i + 1)}} for i in range(10)]
    edited = RLDataset(write_jsonl(rows, tmp_path / "d.jsonl"), AutoTokenizer.from_pretrained(tiny_model_dir))
    with caplog.at_level(logging.WARNING, logger="verl.data.loader"):
        make(dataset, data_key="data.train_files").load_state_dict(state)  # the same rows: nothing said
        assert caplog.text == ""
        resumed = make(edited, data_key="data.train_files")
        resumed.load_state_dict(state)
    assert ("data.train_files changed since the checkpoint: 2 of its 10 prompts differ (at positions 3, 7). The run "
            "goes on at batch 2 of epoch 1 in the saved order of positions") in caplog.text
    assert "trainer.resume_mode=disable" in caplog.text
    assert (resumed.epoch, resumed.position) == (0, 1)


def test_the_rows_checksums_read_the_rows_as_read_not_the_items(dataset, monkeypatch):
    """The checksums were taken over the dataset's items: for a vision dataset that ran the image processor on
    every picture of the training set at the first checkpoint. RLDataset's rows are read as they are; an
    image's bytes are checksummed as bytes."""
    from verl.data.loader import _digest

    monkeypatch.setattr(type(dataset), "__getitem__", lambda self, i: pytest.fail("an item was built"))
    assert make(dataset).row_digests() == make(dataset).row_digests() and len(make(dataset).row_digests()) == 40
    image = {"bytes": bytes(range(256)) * 400}
    assert _digest(image) != _digest({"bytes": bytes(range(256)) * 399 + bytes(range(255)) + b"x"})


def test_dataset_smaller_than_a_batch_names_both_numbers(dataset):
    with pytest.raises(DataError, match="10 prompts, fewer than one batch of 16"):
        make(dataset, batch_size=16)


def test_with_replacement_each_batch_is_drawn_from_all_rows_as_random_sample_draws():
    """A batch of distinct rows drawn anew from the whole dataset every time: the rows
    random.Random(seed).sample would pick, so rows recur before an epoch's worth of batches."""
    import random

    rows = [{"index": i} for i in range(10)]
    collate = lambda items: [item["index"] for item in items]  # noqa: E731
    loader = PromptLoader(rows, 4, collate=collate, seed=5, replacement=True)
    got = [next(loader) for _ in range(6)]
    rng = random.Random(5)
    assert got == [rng.sample(range(10), 4) for _ in range(6)]
    assert all(len(set(batch)) == 4 for batch in got)
    assert (loader.epoch, loader.position) == (2, 2)  # two batches per epoch, as without replacement
    assert len([batch for batch in PromptLoader(rows, 4, collate=collate, seed=5, replacement=True)]) == 2


def test_with_replacement_a_restored_loader_draws_the_same_next_batches():
    rows = [{"index": i} for i in range(10)]
    collate = lambda items: [item["index"] for item in items]  # noqa: E731
    original = PromptLoader(rows, 3, collate=collate, seed=2, replacement=True)
    next(original)
    state = original.state_dict()
    expected = [next(original) for _ in range(4)]
    resumed = PromptLoader(rows, 3, collate=collate, seed=2, replacement=True)
    resumed.load_state_dict(state)
    assert [next(resumed) for _ in range(4)] == expected
    with pytest.raises(DataError, match="replacement: saved True now False"):
        PromptLoader(rows, 3, collate=collate, seed=2).load_state_dict(state)
