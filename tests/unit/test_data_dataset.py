import logging
import re

import pytest
import torch
from transformers import AutoTokenizer

from verl.data import DataError, RLDataset, collate_prompts, write_jsonl, write_parquet
from verl.models.tiny import build_char_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def row(content, answer="5", **extra):
    return {"data_source": "arith", "prompt": [{"role": "user", "content": content}],
            "reward_model": {"ground_truth": answer, "style": "rule"}, "extra_info": {"tag": content}, **extra}


def test_chat_template_is_applied_with_generation_prompt(tmp_path, tokenizer):
    messages = [{"role": "system", "content": "S:"}, {"role": "user", "content": "2+3="}]
    path = write_parquet([{"prompt": messages, "data_source": "arith", "reward_model": {"ground_truth": "5"}}],
                         tmp_path / "d.parquet")
    item = RLDataset(path, tokenizer)[0]
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert item["input_ids"] == tokenizer(expected, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(item["input_ids"]) == "S:\nQ: 2+3=\nA: "  # the built-in template's turns
    assert item["raw_prompt"] == messages
    assert item["ground_truth"] == "5" and item["data_source"] == "arith" and item["index"] == 0


def test_plain_string_prompt_is_wrapped_as_a_user_message(tmp_path):
    tok = build_char_tokenizer(
        chat_template="{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                      "{% if add_generation_prompt %}<assistant>{% endif %}")
    path = write_jsonl([{"prompt": "hi", "answer": 7}], tmp_path / "d.jsonl")
    item = RLDataset(path, tok)[0]
    assert tok.decode(item["input_ids"]) == "<user>hi<assistant>"
    assert item["raw_prompt"] == "hi" and item["ground_truth"] == 7
    assert item["extra_info"] == {"answer": 7}  # no extra_info column: the other columns stand in


def test_chat_template_kwargs_are_passed_through(tmp_path):
    tok = build_char_tokenizer(chat_template="{% if shout %}!{% endif %}{{ messages[0]['content'] }}")
    path = write_jsonl([row("ab")], tmp_path / "d.jsonl")
    assert tok.decode(RLDataset(path, tok, chat_template_kwargs={"shout": True})[0]["input_ids"]) == "!ab"


def test_ground_truth_falls_back_to_top_level_columns(tmp_path, tokenizer):
    path = write_jsonl([{"prompt": "a", "ground_truth": "g"}, {"prompt": "b", "answer": "x"}], tmp_path / "d.jsonl")
    ds = RLDataset(path, tokenizer)
    assert [ds[0]["ground_truth"], ds[1]["ground_truth"]] == ["g", "x"]


def test_missing_prompt_column_names_column_found_columns_and_setting(tmp_path, tokenizer):
    path = write_jsonl([{"question": "1+1=", "answer": "2"}], tmp_path / "d.jsonl")
    with pytest.raises(DataError, match=r"'prompt'.*\['answer', 'question'\].*data\.prompt_key"):
        RLDataset(path, tokenizer)
    assert RLDataset(path, tokenizer, prompt_key="question")[0]["raw_prompt"] == "1+1="


def test_missing_file_names_the_setting(tmp_path, tokenizer):
    with pytest.raises(DataError, match=r"missing\.parquet.*data\.train_files"):
        RLDataset(tmp_path / "missing.parquet", tokenizer)


def test_message_list_without_chat_template_says_how_to_fix(tmp_path):
    tok = build_char_tokenizer(chat_template=None)
    path = write_jsonl([row("1+1=")], tmp_path / "d.jsonl")
    with pytest.raises(DataError, match=r"no chat template.*actor_rollout_ref\.model\.custom_chat_template=.*"
                                        r"data\.apply_chat_template=false"):
        RLDataset(path, tok)
    item = RLDataset(path, tok, apply_chat_template=False)[0]
    assert tok.decode(item["input_ids"]) == "1+1="


# The template adds 7 tokens to a user message ("Q: " ... "\nA: "): "abc" is 10 tokens, "abcdefgh" 15.
def test_overlong_prompt_error_names_row_length_limit_and_fixes(tmp_path, tokenizer):
    path = write_jsonl([row("abc"), row("abcdefgh")], tmp_path / "d.jsonl")
    with pytest.raises(DataError, match=r"row 1 is 15 tokens.*max_prompt_length=12.*filter_overlong_prompts"
                                        r".*truncation"):
        RLDataset(path, tokenizer, max_prompt_length=12)


@pytest.mark.parametrize("mode, expected", [("left", "abcdefgh\nA: "), ("right", "Q: abcdefgh\n"),
                                            ("middle", "Q: abcgh\nA: ")])  # middle: verl's first 6 + last 6
def test_truncation_cuts_the_named_side(tmp_path, tokenizer, mode, expected):
    path = write_jsonl([row("abcdefgh")], tmp_path / "d.jsonl")
    ds = RLDataset(path, tokenizer, max_prompt_length=12, truncation=mode)
    assert tokenizer.decode(ds[0]["input_ids"]) == expected


def test_verls_middle_truncation_is_accepted_by_the_config_and_reaches_the_dataset(tmp_path, tokenizer):
    from verl.config import TrainerConfig

    data = TrainerConfig.from_overrides(["data.truncation=middle", "data.max_prompt_length=11"]).data
    ds = RLDataset(write_jsonl([row("abcdefgh")], tmp_path / "d.jsonl"), tokenizer, data)
    assert tokenizer.decode(ds[0]["input_ids"]) == "Q: abgh\nA: "  # 5 from the start, 6 from the end


def test_filtering_drops_overlong_prompts_and_counts_them(tmp_path, tokenizer, caplog):
    path = write_jsonl([row("abc"), row("abcdefgh"), row("xy"), row("123456")], tmp_path / "d.jsonl")
    with caplog.at_level(logging.WARNING, logger="verl.data.dataset"):
        ds = RLDataset(path, tokenizer, max_prompt_length=12, filter_overlong_prompts=True)
    assert ds.num_filtered == 2 and len(ds) == 2
    assert [ds[i]["index"] for i in range(2)] == [0, 2]
    assert "data.train_files: filtered 2 of 4 prompts longer than data.max_prompt_length=12 tokens" in caplog.text


def test_collate_left_pads_and_numbers_positions(tmp_path, tokenizer):
    path = write_jsonl([row("abc", answer="1"), row("x", answer="2")], tmp_path / "d.jsonl")
    ds = RLDataset(path, tokenizer, apply_chat_template=False)  # plain text: "abc" is 3 tokens, "x" 1
    b = collate_prompts([ds[0], ds[1]], pad_token_id=tokenizer.pad_token_id)
    pad = tokenizer.pad_token_id
    x_id = ds[1]["input_ids"][0]
    assert b["input_ids"][1].tolist() == [pad, pad, x_id]
    assert b["input_ids"][0].tolist() == ds[0]["input_ids"]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert b["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]
    assert list(b["ground_truth"]) == ["1", "2"] and list(b["index"]) == [0, 1]
    assert b["extra_info"][0] == {"tag": "abc"} and b["raw_prompt"][1][0]["content"] == "x"
    assert len(set(b["uid"])) == 2 and all(len(u) == 32 for u in b["uid"])
    assert b["input_ids"].dtype == torch.long


def test_collating_with_the_pad_id_of_a_tokenizer_without_a_pad_token_names_the_fix(tmp_path, tokenizer):
    """Before: TypeError "full(): argument 'fill_value' must be Number, not NoneType"."""
    from verl.data.offline import collate_sft

    ds = RLDataset(write_jsonl([row("abc"), row("x")], tmp_path / "d.jsonl"), tokenizer, max_prompt_length=64)
    sft_items = [{"input_ids": [1, 2], "loss_mask": [0, 1]}]
    for collate, items in ((collate_prompts, [ds[0], ds[1]]), (collate_sft, sft_items)):
        with pytest.raises(DataError, match=r"^no pad token id to pad the batch with \(None: the tokenizer has no pad "
                                            r"token.*set tokenizer.pad_token = tokenizer.eos_token first"):
            collate(items, None)


def test_a_dataset_with_images_is_refused_rather_than_trained_on_without_them(tmp_path, tokenizer):
    from verl.data import write_parquet

    rows = [{"prompt": [{"role": "user", "content": "<image>What is the angle?"}], "data_source": "geo3k",
             "images": [{"path": "a.png"}], "reward_model": {"ground_truth": "30"}}]
    path = write_parquet(rows, tmp_path / "geo.parquet")
    with pytest.raises(DataError, match=r"row 0 of `data.train_files` has images .*the policy is a text model.*vision-language policy"):
        RLDataset(str(path), tokenizer)
    rows[0]["images"] = []  # an empty column (a text dataset written by a VL pipeline) is fine
    RLDataset(str(write_parquet(rows, tmp_path / "text.parquet")), tokenizer)


@pytest.mark.parametrize("bad, problem", [
    ([], r"holds no messages: give at least one \{role: user"),
    ([{"role": "user"}], r"message 0 has no content .*every message needs both"),
    ([{"role": "user", "content": "hi"}, {"from": "human", "value": "hi"}],
     r"message 1 is in ShareGPT's \{from, value\} turns: rename from -> role, value -> content"),
    ([{"role": "human", "content": "hi"}], r"message 0 has role 'human': chat templates know 'user'; rename the role"),
    ([{"role": "System", "content": "be brief"}, {"role": "User", "content": "hi"}],
     r"message 0 has role 'System': chat templates compare roles in lower case, so it would not render as 'system'; "
     r"write it as 'system'"),
    ([{"role": "usr", "content": "hi"}], r"message 0 has role 'usr': a chat template renders it as a role of its own, "
                                         r"or not at all; did you mean 'user'\?"),
    ([{"role": "user", "content": "hi"}, {"role": "assitant", "content": "5"}, {"role": "user", "content": "and?"}],
     r"message 1 has role 'assitant': .*did you mean 'assistant'\?"),
])
def test_a_prompt_that_is_not_chat_messages_is_named_with_its_file_row_and_fix(tmp_path, tokenizer, bad, problem):
    """Parquet stores one struct type for a column, so a row whose messages lack a key (or use ShareGPT's
    keys) reads back with None there: the template failed on it deep in Jinja, or rendered role 'human'."""
    rows = [row("1+1="), {**row("2+2="), "prompt": bad}]
    path = write_parquet(rows, tmp_path / "d.parquet")
    with pytest.raises(DataError, match=r"^data\.val_files: row 1: the prompt .*" + problem):
        RLDataset(path, tokenizer, config_key="data.val_files")
    jsonl = write_jsonl(rows, tmp_path / "d.jsonl")  # JSON lines keep each row's own keys: the same answer
    with pytest.raises(DataError, match=r"^data\.train_files: row 1: .*" + problem):
        RLDataset(jsonl, tokenizer)


def test_an_assistant_turn_with_tool_calls_and_no_content_is_a_message():
    from verl.data.prompt_rows import message_problem

    call = {"role": "assistant", "content": None, "tool_calls": [{"type": "function",
                                                                  "function": {"name": "f", "arguments": "{}"}}]}
    assert message_problem([{"role": "user", "content": "hi"}, call, {"role": "tool", "content": "1"}]) is None
    assert "message 1 has no content" in message_problem([{"role": "user", "content": "hi"}, {**call, "tool_calls": None}])


def test_row_errors_name_the_setting_of_their_file(tmp_path, tokenizer):
    path = write_jsonl([row("abc"), row("abcdefgh")], tmp_path / "d.jsonl")
    with pytest.raises(DataError, match=r"^data\.val_files: prompt of row 1 is 15 tokens"):
        RLDataset(path, tokenizer, max_prompt_length=12, config_key="data.val_files")
    with pytest.raises(DataError, match=r"^data\.val_files: row 0: no prompt column 'question'"):
        RLDataset(path, tokenizer, prompt_key="question", config_key="data.val_files")


def test_a_reward_model_column_of_json_text_gives_its_ground_truth(tmp_path, tokenizer):
    """A CSV cannot nest: its reward_model cell is JSON text (so is a column json.dumps'd before writing).
    Before, such rows had no ground truth and the run stopped saying so, with the answer right there."""
    path = tmp_path / "d.csv"
    path.write_text('prompt,data_source,reward_model\n1+1=,exact_match,"{""ground_truth"": ""2""}"\n'
                    '2+2=,exact_match,\n')
    ds = RLDataset(str(path), tokenizer)
    assert [ds[0]["ground_truth"], ds[1]["ground_truth"]] == ["2", None]


@pytest.mark.parametrize("reward_model, named", [
    ("4", "its reward_model is '4' (a str), not a dict, and verl reads the answer from reward_model.ground_truth: "
          "write reward_model={'ground_truth': '4'}, or give the answer as a ground_truth column"),
    ({"groundtruth": "4"}, "its reward_model holds 'groundtruth' and no 'ground_truth', and verl reads the answer "
                           "from reward_model.ground_truth: rename the key to ground_truth"),
    ({"style": "rule", "answer": "4"}, "its reward_model holds 'answer' and no 'ground_truth'")])
def test_an_answer_in_the_reward_model_column_where_verl_does_not_read_it_is_named_by_row(tmp_path, tokenizer,
                                                                                         reward_model, named):
    """Before: such rows had no ground truth, and a custom reward function got ground_truth=None for every row
    without a word."""
    rows = [{"prompt": "2+2=", "data_source": "mine", "reward_model": reward_model}] * 2
    with pytest.raises(DataError, match=r"^data\.train_files: row 0: " + re.escape(named)):
        RLDataset(write_jsonl(rows, tmp_path / "d.jsonl"), tokenizer)
    # Where the row has its answer elsewhere, or no answer at all, nothing is said.
    for kept in ([{**rows[0], "ground_truth": "4"}], [{"prompt": "2+2=", "reward_model": {"style": "model"}}]):
        assert len(RLDataset(write_jsonl(kept, tmp_path / "k.jsonl"), tokenizer)) == 1


def test_the_reward_fn_key_column_reaches_the_batch_and_a_row_without_it_is_named(tmp_path, tokenizer):
    """data.reward_fn_key names the column passed to the reward function as data_source (verl's key).
    Before, no batch carried that column: every function got data_source=None without a word."""
    from types import SimpleNamespace

    from verl.data.dataset import SETTING_DEFAULTS

    config = SimpleNamespace(**{**SETTING_DEFAULTS, "reward_fn_key": "source"})
    path = write_jsonl([row("1+1=", source="math"), row("2+2=", source="code")], tmp_path / "d.jsonl")
    ds = RLDataset(path, tokenizer, config)
    batch = collate_prompts([ds[0], ds[1]], tokenizer.pad_token_id, extra_keys=("source",))
    assert list(batch.non_tensors["source"]) == ["math", "code"]
    assert list(batch.non_tensors["data_source"]) == ["arith"] * 2
    bad = write_jsonl([row("1+1=", source="math"), row("2+2=")], tmp_path / "bad.jsonl")
    with pytest.raises(DataError, match=r"^data\.val_files: row 1 has no 'source' \(data\.reward_fn_key=source: .*"
                                        r"columns found: \['data_source', 'extra_info', 'prompt', 'reward_model'\]"):
        RLDataset(bad, tokenizer, config, config_key="data.val_files")


@pytest.mark.parametrize("given", ["Qwen/Qwen2-0.5B-Instruct", None])
def test_a_model_name_or_nothing_in_place_of_the_tokenizer_names_how_to_load_one(tmp_path, given):
    path = write_jsonl([row("1+1=")], tmp_path / "d.jsonl")
    with pytest.raises(DataError, match=r"RLDataset needs a loaded tokenizer as its second argument, got "
                                        rf"{given!r}; load it first: tokenizer = verl\.models\.loading\.load_tokenizer"):
        RLDataset(path, given)  # before: AttributeError: 'str' object has no attribute 'chat_template'


def test_an_extra_info_column_of_json_text_reaches_the_reward_function_as_a_dict(tmp_path, tokenizer):
    """Before, the reward function got the text, and its extra_info.get(...) raised AttributeError at the
    first step, after the models had loaded."""
    path = tmp_path / "d.csv"
    path.write_text('prompt,data_source,ground_truth,extra_info\n1+1=,arith,2,"{""split"": ""train"", ""index"": 0}"\n'
                    '2+2=,arith,4,plain text\n')
    ds = RLDataset(str(path), tokenizer)
    assert [ds[0]["extra_info"], ds[1]["extra_info"]] == [{"split": "train", "index": 0}, "plain text"]


def test_a_prompt_of_chat_messages_written_as_json_text_is_read_as_the_messages(tmp_path, tokenizer):
    """A CSV cell, or a column json.dumps'd before writing to parquet. Before, the model was prompted with the
    JSON text itself ('[{"role": "user", ...}]' as one user message), without a word."""
    import json

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1="}]
    path = write_parquet([{"prompt": json.dumps(messages), "data_source": "arith", "ground_truth": "2"},
                          {"prompt": "[{not json", "data_source": "arith", "ground_truth": "2"}], tmp_path / "d.parquet")
    ds = RLDataset(str(path), tokenizer)
    assert ds[0]["raw_prompt"] == messages
    assert ds[0]["input_ids"] == RLDataset(write_parquet([{"prompt": messages}], tmp_path / "m.parquet"),
                                           tokenizer)[0]["input_ids"]
    assert ds[1]["raw_prompt"] == "[{not json"  # text that only looks like it stays text
    sharegpt = write_parquet([{"prompt": json.dumps([{"from": "human", "value": "1+1="}])}], tmp_path / "s.parquet")
    with pytest.raises(DataError, match=r"ShareGPT's \{from, value\} turns"):
        RLDataset(str(sharegpt), tokenizer)


def test_a_max_samples_subset_with_data_seed_null_is_drawn_with_the_seed_the_trainer_passes(tmp_path, tokenizer):
    """data.seed=null means trainer.seed (as for the shuffling): the subset was drawn unseeded, so two runs of
    one command trained on different prompts."""
    import numpy as np

    from verl.config import TrainerConfig
    from verl.data import create_rl_dataset

    path = write_jsonl([row(f"q{i}") for i in range(40)], tmp_path / "d.jsonl")
    data = TrainerConfig.from_overrides(["data.train_max_samples=5", "data.seed=null"]).data
    picks = [[d[i]["index"] for i in range(len(d))] for d in (create_rl_dataset(path, tokenizer, data, seed=11)
                                                               for _ in range(3))]
    assert picks == [sorted(np.random.default_rng(11).choice(40, size=5, replace=False).tolist())] * 3
    data.seed = 4  # data.seed, when set, wins
    again = create_rl_dataset(path, tokenizer, data, seed=11)
    assert [again[i]["index"] for i in range(5)] == sorted(np.random.default_rng(4).choice(40, size=5,
                                                                                          replace=False).tolist())


def test_verls_max_samples_keys_pick_a_seeded_subset_or_the_first_rows(tmp_path, tokenizer):
    import numpy as np

    from verl.config import TrainerConfig
    from verl.data import create_rl_dataset

    path = write_jsonl([row(f"q{i}") for i in range(6)], tmp_path / "d.jsonl")
    data = TrainerConfig.from_overrides(["data.train_max_samples=3", "data.val_max_samples=2", "data.seed=3"]).data
    train = create_rl_dataset(path, tokenizer, data)
    expected = sorted(np.random.default_rng(3).choice(6, size=3, replace=False).tolist())  # verl's draw, data.shuffle
    assert [train[i]["index"] for i in range(len(train))] == expected
    assert [train[i]["extra_info"]["tag"] for i in range(3)] == [f"q{k}" for k in expected]
    assert len(create_rl_dataset(path, tokenizer, data, config_key="data.val_files")) == 2
    data.shuffle = False
    first = create_rl_dataset(path, tokenizer, data)
    assert [first[i]["index"] for i in range(len(first))] == [0, 1, 2]


@pytest.mark.parametrize("prompt, problem", [
    ("", r"row 1: the prompt \(column 'prompt'\) is empty: ''; fill it in or drop the row"),
    ("  \n", r"row 1: the prompt \(column 'prompt'\) is empty"),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": " "}], r"row 1: the prompt .* is empty"),
    ([{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}],
     r"row 1: the prompt's chat messages end with an assistant turn, so the model is shown the answer .*drop that turn "
     r"from the prompt \(put the answer in reward_model\.ground_truth\), or give the conversation as a `messages` column"),
    ("Q: 2+3?\nA: ", r"row 1: the prompt text was already rendered with a chat template \('Q: 2\+3\?\\nA: '\), and "
                    r"data\.apply_chat_template=true renders it again around itself; .*data\.apply_chat_template=false"),
])
def test_a_prompt_with_nothing_to_answer_the_answer_in_it_or_its_template_applied_is_refused_by_row(tmp_path, prompt,
                                                                                                    problem):
    """Before, each was trained on without a word: an empty prompt; a conversation ending with its answer (SFT data
    put in the prompt column); text already rendered by the chat template (rendered again: 'Q: Q: 2+3?\\nA: \\nA: ')."""
    tokenizer = build_char_tokenizer()
    path = write_jsonl([{"prompt": "1+1?", "answer": "2"}, {"prompt": prompt, "answer": "5"}], tmp_path / "d.jsonl")
    with pytest.raises(DataError, match=problem):
        RLDataset(path, tokenizer)


def test_a_prompt_rendered_by_a_template_with_special_tokens_is_found_by_them_and_plain_text_passes(tmp_path):
    template = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}[assistant] {% endif %}")
    tokenizer = build_char_tokenizer(chat_template=template)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "2+3?"}], tokenize=False,
                                             add_generation_prompt=True)
    path = write_jsonl([{"prompt": rendered, "answer": "5"}], tmp_path / "rendered.jsonl")
    with pytest.raises(DataError, match=r"already rendered with a chat template \('<s>\[user\] 2\+3\?"):
        RLDataset(path, tokenizer)
    assert len(RLDataset(path, tokenizer, apply_chat_template=False)) == 1  # as written: the fix it names
    plain = write_jsonl([{"prompt": "[user] asked: what is 2+3?", "answer": "5"}], tmp_path / "plain.jsonl")
    assert len(RLDataset(plain, tokenizer)) == 1  # the template's words alone are not its rendering


def test_a_question_that_names_a_special_token_of_the_generation_prompt_is_not_taken_for_a_rendered_one(tmp_path):
    # A reasoning template writes <think> after the question (a special token in some tokenizers); a question
    # may name it ("answer inside <think> tags"). Only the tokens written before the message mark a rendering.
    template = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}[assistant] <think>{% endif %}")
    tokenizer = build_char_tokenizer(chat_template=template)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<think>"]})
    path = write_jsonl([{"prompt": "Reason inside <think> tags: 2+3?", "answer": "5"}], tmp_path / "think.jsonl")
    assert len(RLDataset(path, tokenizer)) == 1
    rendered = write_jsonl([{"prompt": "<s>[user] 2+3?\n[assistant] <think>", "answer": "5"}], tmp_path / "r.jsonl")
    with pytest.raises(DataError, match="already rendered with a chat template"):
        RLDataset(rendered, tokenizer)


def test_a_nan_ground_truth_is_no_ground_truth(tmp_path, tokenizer):
    """A gap in a number column reaches the rows as NaN (a JSON NaN, a pandas row dict): before, it was an
    answer, 'nan', that no response matches, and the checks for rows without an answer let it pass."""
    rows = [{"prompt": "a", "reward_model": {"ground_truth": float("nan")}, "answer": "7"},
            {"prompt": "b", "answer": float("nan")}, {"prompt": "c", "answer": 3.0}]
    ds = RLDataset(write_jsonl(rows, tmp_path / "d.jsonl"), tokenizer)
    assert [ds[i]["ground_truth"] for i in range(3)] == ["7", None, 3.0]


def test_an_item_changed_in_place_leaves_the_row_as_read(tmp_path, tokenizer):
    """verl's dataset reads each item afresh. Before, the item held the row's own objects: a reward function that
    popped a key of extra_info (or code that appended to the prompt's messages) changed the row for every later
    epoch."""
    path = write_parquet([row("1+1=", answer=["2", "two"])], tmp_path / "d.parquet")
    ds = RLDataset(path, tokenizer)
    item = ds[0]
    item["extra_info"].pop("tag")
    item["raw_prompt"].append({"role": "assistant", "content": "2"})
    item["ground_truth"].pop()
    again = ds[0]
    assert again["extra_info"] == {"tag": "1+1="} and again["ground_truth"] == ["2", "two"]
    assert again["raw_prompt"] == [{"role": "user", "content": "1+1="}]


def test_settings_of_another_type_are_named_not_compared_as_text_or_read_as_truthy(tmp_path):
    """Before: max_prompt_length="16" failed with "'<' not supported between instances of 'str' and 'int'",
    filter_overlong_prompts="false" (truthy text) silently dropped the long prompts, and max_prompt_length=True
    was a limit of 1 token. A setting is checked as the data section types it; numpy's ints are ints."""
    import numpy as np

    path = write_jsonl([{"prompt": "x" * n, "data_source": "echo"} for n in (4, 40)], tmp_path / "d.jsonl")
    tok = build_char_tokenizer()
    assert len(RLDataset(path, tok, max_prompt_length=np.int64(16), filter_overlong_prompts=True)) == 1
    for kw, said in [(dict(max_prompt_length="16"), r"RLDataset: max_prompt_length expects int, got '16' \(str\)"),
                     (dict(max_prompt_length=True), r"max_prompt_length expects int, got True \(bool\)"),
                     (dict(max_prompt_length=16.0), r"max_prompt_length expects int, got 16.0"),
                     (dict(filter_overlong_prompts="false"), r"filter_overlong_prompts expects bool, got 'false'"),
                     (dict(truncation="lft"), r"truncation='lft' is not allowed.*did you mean truncation=left"),
                     (dict(max_samples=1.0), r"max_samples expects int, got 1.0"),
                     (dict(config={"max_prompt_length": 16, "filter_overlong_prompts": "false"}),
                      r"data\.filter_overlong_prompts expects bool, got 'false'")]:
        with pytest.raises(DataError, match=said):
            RLDataset(path, tok, **kw)
