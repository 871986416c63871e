"""Offline datasets with the rows and tokenizers users bring: OpenAI-format messages (text parts, tool-call
turns), templates with a default system prompt, a bos or a closing eos, rows truncated to no response token,
empty answers and pairs that answer different prompts. The tests decode the loss-masked tokens. The
character tokenizer and its template are those of ``test_offline_data.py``."""

import pytest

from verl.data.io import DataError
from verl.data.offline import Encoder, KTODataset, PreferenceDataset, SFTDataset
from verl.models.tiny import build_char_tokenizer

from test_offline_data import TOK, encoder


# A template in the shape of Qwen2.5's for tools: an assistant turn renders its tool calls after its text, a tool
# result is a turn of its own (not trained), the generation prompt is "A: ".
TOOL_CHAT = build_char_tokenizer(chat_template=(
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ 'Q: ' + m['content'] + '\\n' }}"
    "{% elif m['role'] == 'tool' %}{{ 'R: ' + m['content'] + '\\n' }}"
    "{% elif m['role'] == 'assistant' %}{{ 'A: ' + m['content'] }}{% for c in m.get('tool_calls') or [] %}"
    "{{ '<' + c['function']['name'] + c['function']['arguments'] + '>' }}{% endfor %}{{ eos_token }}"
    "{% else %}{{ m['content'] + '\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'A: ' }}{% endif %}"))


def trained(tok, ids, mask):
    """The text of the loss-masked tokens, turn after turn."""
    return tok.decode([i for i, m in zip(ids, mask) if m])


def test_content_parts_and_tool_call_turns_render_as_text_and_train_the_assistant_tokens_only():
    """OpenAI's format: content as a list of text parts, an assistant turn of tool calls with content null or
    absent, tool results in turns of their own. Before: the first crashed inside the template (TypeError) or was
    trained as the repr of the list, the second stopped the run as "expected a list of {role, content} messages"
    (absent) or crashed (null)."""
    call = {"type": "function", "function": {"name": "add", "arguments": '{"a":1}'}}
    messages = [{"role": "system", "content": [{"type": "text", "text": "S"}]},
                {"role": "user", "content": [{"type": "text", "text": "1+"}, {"type": "text", "text": "2="}]},
                {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "content": "3"},
                {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": "3"},
                {"role": "assistant", "content": [{"type": "text", "text": "3"}]}]
    ids, mask = Encoder(TOOL_CHAT, max_length=128).conversation(messages, "row 0")
    assert TOOL_CHAT.decode(ids) == 'S\nQ: 1+2=\nA: <add{"a":1}></s>R: 3\nA: <add{"a":1}></s>R: 3\nA: 3</s>'
    assert trained(TOOL_CHAT, ids, mask) == '<add{"a":1}></s><add{"a":1}></s>3</s>'
    ids, mask = Encoder(TOOL_CHAT, max_length=128).example(messages[:2], messages[6:], "row 0")
    assert TOOL_CHAT.decode(ids) == "S\nQ: 1+2=\nA: 3</s>" and trained(TOOL_CHAT, ids, mask) == "3</s>"
    plain = Encoder(build_char_tokenizer(chat_template=None), max_length=64, apply_chat_template=False)
    assert TOK.decode(plain.example(messages[1:2], "3", "row 0")[0]) == "1+2=3</s>"


def test_a_null_content_a_non_text_part_and_a_template_error_name_the_row_and_turn():
    """Before: a jinja TypeError / UndefinedError from inside the template, with no row, or the text 'None'."""
    null = [{"role": "user", "content": None}, {"role": "assistant", "content": "b"}]
    with pytest.raises(DataError, match=r"^row 4 of data.train_files: turn 0 \(user\) has no content \(null\)"):
        SFTDataset([{"messages": null[1:]}] * 4 + [{"messages": null}], encoder(), messages_key="messages")
    with pytest.raises(DataError, match=r"^row 0 of data.train_files: turn 0 \(user\) has no content \(null\)"):
        SFTDataset([{"prompt": null[:1], "response": "b"}], Encoder(TOK, max_length=64, apply_chat_template=False))
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}}]}]
    with pytest.raises(DataError, match=r"^row 0 \(chosen\): turn 0 \(user\) has a content part of type 'image_url'"):
        encoder().example(image, "b", "row 0 (chosen)")
    strict = build_char_tokenizer(chat_template="{% for m in messages %}{% if m['role'] == 'tool' %}"
                                                 "{{ raise_exception('roles must alternate') }}{% endif %}"
                                                 "{{ m['content'] }}{% endfor %}")
    tool = [{"role": "user", "content": "a"}, {"role": "tool", "content": "r"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(DataError, match=r"^row 0: the chat template cannot render this conversation \(.*roles must "
                                        r"alternate\); .*model.custom_chat_template"):
        Encoder(strict, max_length=64).conversation(tool, "row 0")


QWEN2_LIKE = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}{{ '<|im_start|>system\\nBe kind."
              "<|im_end|>\\n' }}{% endif %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3_LIKE = ("{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
               "'<|end_header_id|>\\n\\n' + "
               "m['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
               "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
PHI3_LIKE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}")


def special_tokenizer(template, *specials):
    tok = build_char_tokenizer(chat_template=template)
    tok.add_special_tokens({"additional_special_tokens": list(specials)})
    return tok


@pytest.mark.parametrize("template, specials, turns", [
    (QWEN2_LIKE, ["<|im_start|>", "<|im_end|>"], ["hi<|im_end|>\n", "b<|im_end|>\n", "d<|im_end|>\n"]),
    (LLAMA3_LIKE, ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], ["hi<|eot_id|>", "b<|eot_id|>",
                                                                               "d<|eot_id|>"]),
    (PHI3_LIKE, ["<|user|>", "<|assistant|>", "<|end|>"], ["hi<|end|>", "b<|end|>", "d<|end|>\n</s>"])])
def test_templates_with_a_default_system_prompt_a_bos_or_a_closing_eos_train_exactly_the_assistant_turns(
        template, specials, turns):
    """Qwen2's default system prompt, Llama 3's bos, Phi-3's eos after the last turn. A conversation that opens with
    an assistant turn (a greeting) trained everything before its content too: the bos, the default system prompt
    and the assistant header ('<|im_start|>system\\nBe kind.<|im_end|>\\n<|im_start|>assistant\\nhi<|im_end|>\\n')."""
    tok = special_tokenizer(template, *specials)
    chat = [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
            {"role": "assistant", "content": "d"}]
    encoder_ = Encoder(tok, max_length=256)
    ids, mask = encoder_.conversation(chat, "row 0")
    assert tok.decode(ids) == tok.apply_chat_template(chat, tokenize=False)
    assert trained(tok, ids, mask) == "".join(turns)
    ids, mask = encoder_.conversation(chat[1:], "row 0")
    assert trained(tok, ids, mask) == "".join(turns[1:])


def test_rows_cut_to_no_response_token_are_left_out_and_every_row_so_stops_the_run(caplog):
    """data.truncation=right with a prompt over data.max_length left a row with an all-zero loss mask. Before: SFT
    trained steps of 0 tokens (loss 0.0, nothing said) and DPO compared the other side with nothing (log-prob 0)."""
    right = encoder(max_length=12, truncation="right")
    sft = [{"prompt": "1=", "response": "2"}, {"prompt": "x" * 20, "response": "2"}]
    with caplog.at_level("WARNING", logger="verl.data.offline"):
        items = SFTDataset(sft, right).items
        pairs = PreferenceDataset([{"prompt": "1=", "chosen": "1", "rejected": "2"},
                                   {"prompt": "1=" * 4, "chosen": "1", "rejected": "2" * 20}], right).items
        kto = KTODataset([{"prompt": "a", "completion": "b", "label": True},
                          {"prompt": "a" * 20, "completion": "b", "label": False}], right).items
    assert [trained(TOK, ids, mask) for ids, mask in items] == ["2</s>"]
    assert [(trained(TOK, *p["chosen"]), trained(TOK, *p["rejected"])) for p in pairs] == [("1</s>", "2</s>")]
    assert [trained(TOK, it["input_ids"], it["loss_mask"]) for it in kto] == ["b</s>"]
    assert [r.getMessage() for r in caplog.records][0] == (
        "data.train_files: 1 of 2 rows have no response token left to train on (data.truncation=right cut them to "
        "data.max_length=12; row 1): they are left out; raise data.max_length, or set data.truncation=left (it keeps "
        "the end of a row, where the response is)")
    with pytest.raises(DataError, match=r"^no row of data.val_files has a response token left to train on "
                                        r"\(data.truncation=right cut them to data.max_length=12; row 0, 1\)"):
        SFTDataset([sft[1]] * 2, right, source="data.val_files")
    chat = [{"role": "user", "content": "x" * 20}, {"role": "assistant", "content": "b"}]
    with pytest.raises(DataError, match=r"^no row of data.train_files has a response token left"):
        SFTDataset([{"messages": chat}], right, messages_key="messages")
    left = SFTDataset([{"messages": chat}], encoder(max_length=12, truncation="left"), messages_key="messages").items
    assert trained(TOK, *left[0]) == "b</s>"


def test_empty_assistant_turns_and_empty_chosen_or_rejected_are_counted_and_refused_when_every_row(caplog):
    """Before: a blank assistant turn of a conversation ('  ', or text parts of spaces) and an empty chosen or
    rejected response were trained on (the model learns to answer nothing) without a word, even in every row."""
    def chat(answer):
        return [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}, {"role": "assistant", "content": answer}]
    with caplog.at_level("WARNING", logger="verl.data.offline"):
        SFTDataset([{"messages": chat("d")}, {"messages": chat([{"type": "text", "text": " "}])}], encoder(),
                   messages_key="messages")
        PreferenceDataset([{"prompt": "p", "chosen": c, "rejected": r} for c, r in (("a", "b"), (" ", "b"), ("a", ""))],
                          encoder())
    assert [r.getMessage() for r in caplog.records] == [
        "data.train_files: 1 of 2 rows have an empty assistant turn (row 1): they train the model to answer nothing; "
        "fill them in or drop them",
        "data.train_files: 1 of 3 rows have an empty chosen response (row 1): they train the model to answer "
        "nothing; fill them in or drop them",
        "data.train_files: 1 of 3 rows have an empty rejected response (row 2): they train the model to answer "
        "nothing; fill them in or drop them"]
    blank = [{"role": "user", "content": "a"}, {"role": "assistant", "content": " "}]
    with pytest.raises(DataError, match=r"^every row of data.train_files has only empty assistant turns \(column "
                                        r"'messages'\): .*set data.messages_key"):
        SFTDataset([{"messages": blank}] * 2, encoder(), messages_key="messages")
    with pytest.raises(DataError, match=r"^every row of data.train_files has an empty chosen response \(column "
                                        r"'chosen'\): .*set data.chosen_key"):
        PreferenceDataset([{"prompt": "p", "chosen": "", "rejected": "b"}] * 2, encoder())
    with pytest.raises(DataError, match=r"^every row of data.train_files has the same chosen and rejected response "
                                        r"\(columns 'chosen' and 'rejected'\): .*set data.rejected_key"):
        PreferenceDataset([{"prompt": "p", "chosen": "a", "rejected": "a"}] * 2, encoder())


def test_chosen_and_rejected_conversations_with_different_prompts_name_the_row_and_the_turn():
    """Before: 'lacks the column prompt' (no prompt column) or 'the response begins with a user turn, so it holds
    the conversation' (with one): neither said that the two sides answer different prompts."""
    def chat(question, answer):
        return [{"role": "system", "content": "S"}, {"role": "user", "content": question},
                {"role": "assistant", "content": answer}]
    good = {"chosen": chat("1+1=", "2"), "rejected": chat("1+1=", "3")}
    for row in ({"chosen": chat("1+1=", "2"), "rejected": chat("1+2=", "3")},
                {"prompt": "1+1=", "chosen": chat("1+1=", "2"), "rejected": chat("1+2=", "3")}):
        with pytest.raises(DataError, match=r"^row 1 of data.train_files: the chosen and rejected conversations part "
                                            r"at turn 1 \(user against user\), before their answers, so they answer "
                                            r"different prompts; give both the same prompt turns"):
            PreferenceDataset([good, row], encoder())
    with pytest.raises(DataError, match=r"^row 0 of data.train_files: the rejected conversation ends at turn 2, "
                                        r"before an answer of its own"):
        PreferenceDataset([{"chosen": chat("1+1=", "2"), "rejected": chat("1+1=", "2")[:2]}], encoder())
    pair = PreferenceDataset([good], encoder())[0]
    assert (trained(TOK, *pair["chosen"]), trained(TOK, *pair["rejected"])) == ("2</s>", "3</s>")
