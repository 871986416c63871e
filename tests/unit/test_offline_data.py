"""Offline datasets, token by token: loss masks of prompt/response rows and of chat conversations
(assistant turns only), truncation, column errors, collation and the resumable loader.

The tokenizer has one token per character and the chat template writes a user turn as
``Q: <content>\n``, an assistant turn as ``A: <content></s>`` and a system turn as ``<content>\n``
(the generation prompt is ``A: ``), so every expectation can be written as characters.
"""

import pytest
import torch

from verl.data.io import DataError
from verl.data.offline import (BatchLoader, Encoder, KTODataset, PreferenceDataset, SFTDataset, addition_rows,
                               collate_kto, collate_pairs, collate_sft)
from verl.models.tiny import build_char_tokenizer

TOK = build_char_tokenizer()
EOS = "</s>"


def chars(ids):
    return [TOK.decode([i]) for i in ids]


def encoder(**kwargs):
    kwargs.setdefault("max_length", 64)
    return Encoder(TOK, **kwargs)


def test_prompt_response_row_masks_exactly_the_response_and_its_eos():
    ids, mask = encoder().example([{"role": "user", "content": "12+34="}], "46", "row 0")
    assert chars(ids) == list("Q: 12+34=\nA: 46") + [EOS]
    assert mask == [0] * 13 + [1, 1, 1]


def test_text_prompt_is_wrapped_as_a_user_turn_and_without_template_eos_is_appended():
    templated = encoder().example("7+1=", "8", "row 0")
    plain = encoder(apply_chat_template=False).example("7+1=", "8", "row 0")
    assert chars(templated[0]) == list("Q: 7+1=\nA: 8") + [EOS] and templated[1] == [0] * 11 + [1, 1]
    assert chars(plain[0]) == list("7+1=8") + [EOS] and plain[1] == [0, 0, 0, 0, 1, 1]


def test_messages_without_a_chat_template_need_apply_chat_template_false():
    no_template = Encoder(build_char_tokenizer(chat_template=None), max_length=64)
    with pytest.raises(DataError, match="data.apply_chat_template=false"):
        no_template.example([{"role": "user", "content": "1+1="}], "2", "row 3 of data.train_files")
    ids, mask = Encoder(build_char_tokenizer(chat_template=None), max_length=64, apply_chat_template=False).example(
        [{"role": "user", "content": "1+1="}], "2", "row 0")
    assert chars(ids) == list("1+1=2") + [EOS] and mask == [0, 0, 0, 0, 1, 1]


def test_conversation_loss_mask_covers_assistant_turns_only():
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "1+1="},
                {"role": "assistant", "content": "2"}, {"role": "user", "content": "2+2="},
                {"role": "assistant", "content": "4"}]
    ids, mask = encoder().conversation(messages, "row 0")
    assert chars(ids) == [*"S\nQ: 1+1=\nA: ", "2", EOS, *"Q: 2+2=\nA: ", "4", EOS]
    assert mask == [0] * 13 + [1, 1] + [0] * 11 + [1, 1]


def test_conversation_ending_with_a_user_turn_masks_nothing_after_the_last_assistant_turn():
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}]
    ids, mask = encoder().conversation(messages, "row 0")
    assert chars(ids) == [*"Q: a\nA: ", "b", EOS, *"Q: c\n"] and mask == [0] * 8 + [1, 1] + [0] * 5


def test_a_template_that_rewrites_earlier_turns_is_refused_with_the_alternative():
    tok = build_char_tokenizer(chat_template="{% for m in messages %}{{ m['content'] }}{% if loop.last %}!{% endif %}"
                                             "{% endfor %}")
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}]
    with pytest.raises(DataError, match="data.prompt_key"):
        Encoder(tok, max_length=64).conversation(messages, "row 0")


def test_a_template_that_renders_the_last_assistant_turn_otherwise_trains_each_turn_as_the_whole_renders_it():
    """Qwen3's template puts an (empty) think block before the last assistant turn only: a conversation of two
    turns was refused. Each assistant turn is trained as the whole conversation renders it, through its eos."""
    tok = build_char_tokenizer(chat_template=(
        "{% for m in messages %}{% if m['role'] == 'user' %}{{ 'Q: ' + m['content'] + '\\n' }}"
        "{% elif loop.last %}{{ 'A: <t>' + m['content'] + eos_token }}{% else %}{{ 'A: ' + m['content'] + eos_token }}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'A: ' }}{% endif %}"))
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    ids, mask = Encoder(tok, max_length=64).conversation(messages, "row 0")
    assert [tok.decode([i]) for i in ids] == [*"Q: a\nA: ", "b", EOS, *"Q: c\nA: <t>", "d", EOS]
    assert mask == [0] * 8 + [1, 1] + [0] * 8 + [1] * 5


def test_truncation_error_left_and_right_token_by_token():
    row = ([{"role": "user", "content": "123+456="}], "579")  # "Q: 123+456=\nA: " 15 + "579</s>" 4 = 19
    with pytest.raises(DataError, match=r"row 5 .* 19 tokens long, over data.max_length=6.*data.truncation=left"):
        encoder(max_length=6).example(*row, "row 5 of data.train_files")
    ids, mask = encoder(max_length=6, truncation="left").example(*row, "row 0")
    assert chars(ids) == [":", " ", "5", "7", "9", EOS] and mask == [0, 0, 1, 1, 1, 1]
    ids, mask = encoder(max_length=17, truncation="right").example(*row, "row 0")
    assert chars(ids) == list("Q: 123+456=\nA: 57") and mask == [0] * 15 + [1, 1]


def test_sft_dataset_missing_columns_names_the_columns_found_and_the_keys():
    rows = [{"question": "1+1=", "answer": "2"}]
    with pytest.raises(DataError) as err:
        SFTDataset(rows, encoder(), source="data.train_files")
    text = str(err.value)
    assert "'prompt'" in text and "'response'" in text and "question, answer" in text
    assert "data.prompt_key" in text and "data.response_key" in text
    SFTDataset(rows, encoder(), prompt_key="question", response_key="answer")  # the fix works


def test_sft_dataset_points_at_messages_key_when_rows_hold_conversations():
    rows = [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}]
    with pytest.raises(DataError, match="data.messages_key=messages"):
        SFTDataset(rows, encoder())
    item = SFTDataset(rows, encoder(), messages_key="messages")[0]
    assert chars(item["input_ids"]) == [*"Q: a\nA: ", "b", EOS] and item["loss_mask"] == [0] * 8 + [1, 1]


def test_preference_and_kto_datasets_check_their_columns_and_labels():
    missing = r"lacks the column 'rejected' \(columns found: prompt, chosen\); set data.rejected_key"
    with pytest.raises(DataError, match=missing):
        PreferenceDataset([{"prompt": "a", "chosen": "b"}], encoder())
    # The column is there, one row has no value in it (a null cell of a parquet file): said as such.
    with pytest.raises(DataError, match=r"^row 1 of data.train_files has no value \(null\) in 'rejected'; fill it "
                                        r"in or drop the row"):
        PreferenceDataset([{"prompt": "a", "chosen": "b", "rejected": "c"},
                           {"prompt": "a", "chosen": "b", "rejected": None}], encoder())
    with pytest.raises(DataError, match="data.label_key"):
        KTODataset([{"prompt": "a", "completion": "b"}], encoder())
    with pytest.raises(DataError, match="must be true .desirable. or false"):
        KTODataset([{"prompt": "a", "completion": "b", "label": "good"}], encoder())


def test_collate_sft_left_pads_ids_masks_and_positions():
    ds = SFTDataset([{"prompt": "1+1=", "response": "2"}, {"prompt": "10+10=", "response": "20"}], encoder())
    b = collate_sft([ds[0], ds[1]], TOK.pad_token_id)
    # row 0: 13 tokens ("Q: 1+1=\nA: 2</s>") padded to row 1's 16 ("Q: 10+10=\nA: 20</s>")
    assert b["input_ids"].shape == (2, 16)
    assert b["attention_mask"][0].tolist() == [0, 0, 0] + [1] * 13
    assert b["position_ids"][0].tolist() == [0, 0, 0, *range(13)]
    assert b["loss_mask"][0].tolist() == [0] * 14 + [1, 1]
    assert b["loss_mask"][1].tolist() == [0] * 13 + [1, 1, 1]


def test_collate_pairs_gives_both_halves_one_width():
    ds = PreferenceDataset([{"prompt": "1+1=", "chosen": "2", "rejected": "11"}], encoder())
    b = collate_pairs([ds[0]], TOK.pad_token_id)
    assert b["chosen_input_ids"].shape == b["rejected_input_ids"].shape == (1, 14)
    assert chars(b["chosen_input_ids"][0][1:].tolist()) == list("Q: 1+1=\nA: 2") + [EOS]
    assert b["chosen_loss_mask"][0].tolist() == [0] * 12 + [1, 1]
    assert b["rejected_loss_mask"][0].tolist() == [0] * 11 + [1, 1, 1]


def test_kto_mismatched_pairs_never_join_a_prompt_with_its_own_completions():
    rows = [{"prompt": "1+1=", "completion": "2", "label": True}, {"prompt": "1+1=", "completion": "3", "label": False},
            {"prompt": "5+5=", "completion": "10", "label": True}]
    ds = KTODataset(rows, encoder())
    b = collate_kto([ds[i] for i in range(3)], TOK.pad_token_id, encoder())
    assert b["label"].tolist() == [True, False, True]
    kl = ["".join(c for c in chars(row.tolist()) if c != "<pad>") for row in b["kl_input_ids"]]
    # rows 0 and 1 share a prompt, so both borrow row 2's completion; row 2 borrows row 0's
    assert kl == ["Q: 1+1=\nA: 10" + EOS, "Q: 1+1=\nA: 10" + EOS, "Q: 5+5=\nA: 2" + EOS]
    assert b["kl_loss_mask"][2].tolist()[-2:] == [1, 1]


def test_batch_loader_resumes_with_the_batch_it_would_have_given_next():
    ds = SFTDataset([{"prompt": f"{i}+0=", "response": str(i)} for i in range(10)], encoder())
    collate = lambda items: collate_sft(items, TOK.pad_token_id)
    loader = BatchLoader(ds, 3, collate, seed=7)
    assert len(loader) == 3
    for _ in range(4):  # into the second epoch
        next(loader)
    resumed = BatchLoader(ds, 3, collate, seed=7)
    resumed.load_state_dict(loader.state_dict())
    assert torch.equal(next(loader)["input_ids"], next(resumed)["input_ids"])
    with pytest.raises(DataError, match="lower data.train_batch_size to at most 10"):
        BatchLoader(ds, 11, collate)


def test_builtin_addition_rows_are_right_and_wrong_as_labelled():
    for row in addition_rows("preference", "test", n=50):
        a, b = row["prompt"][0]["content"].rstrip("=").split("+")
        assert row["chosen"] == str(int(a) + int(b)) != row["rejected"]
    kto = addition_rows("kto", "train", n=20)
    assert len(kto) == 40 and sum(r["label"] for r in kto) == 20
    assert addition_rows("sft", "train", n=3)[0].keys() == {"prompt", "response"}


def test_sft_on_a_builtin_task_trains_on_its_worked_solutions():
    from verl.config.offline import SFTTrainerConfig
    from verl.errors import VerlError
    from verl.trainer.offline.rows import offline_rows

    data = SFTTrainerConfig(data={"builtin_task": "word_problems"}).data
    train, val = offline_rows(data, "sft")
    assert len(val) == 200 and all(r["response"].rstrip().split("#### ")[-1].isdigit() for r in train[:50])
    with pytest.raises(VerlError, match=r"'word_problems'.*no preference data.*\['addition'\]"):
        offline_rows(data, "preference")


def test_kto_labels_written_as_text_are_read_as_the_bools_they_spell():
    """A CSV cell is always text: before, every KTO row of a CSV stopped the run with "label 'true' ... must
    be true (desirable) or false (undesirable)"."""
    rows = [{"prompt": "a", "completion": "b", "label": label} for label in ("true", "False", " 1", "0", True, 0)]
    assert [item["label"] for item in KTODataset(rows, encoder()).items] == [True, False, True, False, True, False]
    with pytest.raises(DataError, match=r"^row 0 of data.train_files: label 'yes' in column 'label' must be true "
                                        r"\(desirable\) or false \(undesirable\): a bool, 1 / 0, or that text"):
        KTODataset([{"prompt": "a", "completion": "b", "label": "yes"}], encoder())


def test_a_conversation_without_an_assistant_turn_is_refused_naming_the_row():
    """Before: the row was trained on with an empty loss mask (it taught nothing) and the run ended with 0."""
    rows = [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "c"}]}]
    with pytest.raises(DataError, match=r"^row 1 of data.train_files: the conversation has no assistant turn, and "
                                        r"the loss covers assistant turns only"):
        SFTDataset(rows, encoder(), messages_key="messages")


def test_preference_rows_whose_chosen_is_their_rejected_are_counted_once(caplog):
    """Their DPO loss is constant (no gradient): before, they went into every batch without a word."""
    rows = [{"prompt": "a", "chosen": "b", "rejected": "b" if i in (1, 3) else "c"} for i in range(4)]
    with caplog.at_level("WARNING", logger="verl.data.offline"):
        PreferenceDataset(rows, encoder())
        PreferenceDataset(rows[:1], encoder())
    assert [r.getMessage() for r in caplog.records] == [
        "data.train_files: 2 of 4 rows have the same chosen and rejected response (row 1, 3): they carry no "
        "preference, so DPO learns nothing from them; drop them or fix the rejected column"]


def test_verls_dict_keys_read_the_prompt_and_response_inside_an_extra_info_column(tmp_path):
    # verl's gsm8k SFT recipe: data.prompt_key=extra_info data.prompt_dict_keys=[question], the same for the answer
    from verl.config.offline import SFTTrainerConfig
    from verl.data import read_rows, write_parquet

    path = write_parquet([{"prompt": [{"role": "user", "content": "x"}], "data_source": "openai/gsm8k",
                           "extra_info": {"split": "train", "index": 0, "question": "1+1=", "answer": "2"}}],
                         tmp_path / "gsm8k.parquet")
    data = SFTTrainerConfig.from_overrides(["data.prompt_key=extra_info", "data.response_key=extra_info",
                                            "data.prompt_dict_keys=[question]", "data.response_dict_keys=[answer]"]).data
    item = SFTDataset(read_rows(path), encoder(), prompt_key=data.prompt_key, response_key=data.response_key,
                      prompt_dict_keys=data.prompt_dict_keys, response_dict_keys=data.response_dict_keys)[0]
    assert chars(item["input_ids"]) == [*"Q: 1+1=\nA: ", "2", EOS] and item["loss_mask"] == [0] * 11 + [1, 1]
    with pytest.raises(DataError, match=r"row 0 .*prompt_dict_keys=\['questio'\] reads 'questio' .*'question'"):
        SFTDataset(read_rows(path), encoder(), prompt_key="extra_info", response_key="extra_info",
                   prompt_dict_keys=["questio"], response_dict_keys=["answer"])


def test_verls_sft_model_key_partial_pretrain_is_model_path():
    from verl.config.offline import SFTTrainerConfig

    assert SFTTrainerConfig.from_overrides(["model.partial_pretrain=my/model"]).model.path == "my/model"


def test_verls_top_level_sft_keys_are_taken(caplog):
    # verl's SFT scripts end with: ulysses_sequence_parallel_size=2 use_remove_padding=true
    import logging

    from verl.config.offline import SFTTrainerConfig

    config = SFTTrainerConfig.from_overrides(["ulysses_sequence_parallel_size=2", "use_remove_padding=true"])
    with caplog.at_level(logging.WARNING, logger="verl.config.offline"):
        config.validate()
    assert config.model.use_remove_padding is True
    assert "ulysses_sequence_parallel_size=2: there is no sequence parallelism here" in caplog.text


def test_preference_pairs_as_whole_conversations_take_their_shared_turns_as_the_prompt():
    """TRL's layouts with the prompt inside the responses: ultrafeedback_binarized (a prompt column as text, and
    chosen / rejected as the whole conversation) and Anthropic HH (no prompt column). Before, the prompt was
    rendered twice and the row refused: "the chat template does not render the prompt as the start ..."."""
    def turns(answer):
        return [{"role": "system", "content": "add"}, {"role": "user", "content": "2+3="},
                {"role": "assistant", "content": answer}]

    explicit = PreferenceDataset([{"prompt": [{"role": "system", "content": "add"}, {"role": "user", "content": "2+3="}],
                                   "chosen": "5", "rejected": "6"}], encoder())[0]
    with_text_prompt = PreferenceDataset([{"prompt": "2+3=", "chosen": turns("5"), "rejected": turns("6")}], encoder())
    without_prompt = PreferenceDataset([{"chosen": turns("5"), "rejected": turns("6")}], encoder())
    for dataset in (with_text_prompt, without_prompt):
        assert dataset[0] == explicit
    ids, mask = explicit["chosen"]
    assert chars(ids) == list("add\nQ: 2+3=\nA: 5") + [EOS] and sum(mask) == 2
    # Answers of several turns, one longer than the other: the prompt ends where they part.
    longer = turns("5") + [{"role": "user", "content": "sure?"}, {"role": "assistant", "content": "yes"}]
    pair = PreferenceDataset([{"chosen": longer, "rejected": turns("6")}], encoder())[0]
    assert chars(pair["chosen"][0]) == list("add\nQ: 2+3=\nA: 5") + [EOS] + list("Q: sure?\nA: yes") + [EOS]
    with pytest.raises(DataError, match=r"row 0 of data.train_files lacks the column 'prompt'"):
        PreferenceDataset([{"chosen": "5", "rejected": "6"}], encoder())  # text answers: the prompt is needed


def test_responses_holding_a_tool_or_user_turn_are_said_once_with_the_format_that_masks_them(caplog):
    """A response of several turns trains every token of it, a tool's result or a user's follow-up too (as TRL
    trains a completion); that was not said. The messages format trains the assistant's turns alone."""
    follow_up = [{"role": "assistant", "content": "5"}, {"role": "user", "content": "sure?"},
                 {"role": "assistant", "content": "yes"}]
    with caplog.at_level("WARNING", logger="verl.data.offline_encoder"):
        SFTDataset([{"prompt": "2+3=", "response": follow_up}] * 2 + [{"prompt": "2+3=", "response": "5"}], encoder())
    assert caplog.text.count("hold turns other than the assistant's") == 1
    assert "2 response(s)" in caplog.text and "(first: row 0 of data.train_files)" in caplog.text
    assert "data.messages_key" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="verl.data.offline_encoder"):
        SFTDataset([{"prompt": "2+3=", "response": follow_up[:1]}], encoder())
    assert caplog.text == ""


def test_a_response_holding_the_whole_conversation_is_named_as_such():
    """Before: "the chat template does not render the prompt as the start of the whole conversation"."""
    conversation = [{"role": "user", "content": "2+3="}, {"role": "assistant", "content": "5"}]
    with pytest.raises(DataError, match=r"^row 0 of data.train_files: the response begins with a user turn, so it "
                                        r"holds the conversation, prompt included, .*data.messages_key=<its column>"):
        SFTDataset([{"prompt": "2+3=", "response": conversation}], encoder())
    assert len(SFTDataset([{"prompt": "2+3=", "response": conversation[1:]}], encoder())) == 1


def test_empty_sft_responses_are_refused_when_all_and_counted_when_some(caplog):
    """Before: a response column of empty texts trained the model to answer nothing, without a word."""
    rows = [{"prompt": f"{i}+1=", "response": str(i + 1), "note": ""} for i in range(8)]
    with pytest.raises(DataError, match=r"^every row of data.train_files has an empty response \(column 'note'\): "
                                        r"the run "
                                        r"would train the model to answer nothing; set data.response_key"):
        SFTDataset(rows, encoder(), response_key="note")
    rows[2]["response"], rows[5]["response"] = " ", [{"role": "assistant", "content": ""}]
    with caplog.at_level("WARNING", logger="verl.data.offline"):
        assert len(SFTDataset(rows, encoder())) == 8
    assert [r.getMessage() for r in caplog.records] == [
        "data.train_files: 2 of 8 rows have an empty response (row 2, 5): they train the model to answer nothing; "
        "fill them in or drop them"]


def test_responses_that_repeat_their_prompt_are_refused_when_all_and_counted_when_some(caplog):
    """Before: prompt + answer written in one column (Anthropic HH's text) showed the model the prompt twice and
    trained it to answer with the prompt, without a word."""
    sft = [{"prompt": f"{i}+10=", "response": f"{i}+10={i + 10}"} for i in range(4)]
    with pytest.raises(DataError, match=r"^every row of data.train_files repeats its prompt at the start of column "
                                        r"'response' \(row 0: '0\+10=10'\): .*give column 'response' without the "
                                        r"prompt"):
        SFTDataset(sft, encoder())
    pairs = [{"prompt": "What is 2+3?", "chosen": "What is 2+3? 5", "rejected": "What is 2+3? 6"}] * 2
    with pytest.raises(DataError, match=r"repeats its prompt at the start of columns 'chosen' and 'rejected'"):
        PreferenceDataset(pairs, encoder())
    kto = [{"prompt": "What is 2+3?", "completion": "What is 2+3? 5", "label": True}] * 2
    with pytest.raises(DataError, match=r"repeats its prompt at the start of column 'completion'"):
        KTODataset(kto, encoder())
    sft[1]["response"], sft[2]["response"], sft[3]["response"] = "11", "12", "13"
    with caplog.at_level("WARNING", logger="verl.data.offline"):
        assert len(SFTDataset(sft, encoder())) == 4
        PreferenceDataset([{**pairs[0], "chosen": "5"}] * 2, encoder())  # one side alone may begin so
    assert [r.getMessage() for r in caplog.records] == [
        "data.train_files: 1 of 4 rows repeat their prompt at the start of column 'response' (row 0): the prompt is "
        "trained on as part of the answer; give column 'response' without the prompt (the text after it)"]
