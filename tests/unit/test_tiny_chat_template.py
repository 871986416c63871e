"""The built-in tokenizer's chat template, string by string, and the caches keyed by it.

Expected texts are written by hand: a user turn is ``Q: <content>\\n``, an assistant turn
``A: <content></s>``, a system turn ``<content>\\n``; the generation prompt is ``A: ``.
"""

import pytest
from transformers import AutoTokenizer

from verl.models import tiny
from verl.models.tiny import build_char_tokenizer

TOK = build_char_tokenizer()
USER = [{"role": "user", "content": "37+48="}]


def render(messages, generation_prompt):
    return TOK.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def test_the_generation_prompt_ends_with_the_answer_marker_and_only_when_asked():
    assert render(USER, True) == "Q: 37+48=\nA: "
    assert render(USER, False) == "Q: 37+48=\n"


def test_the_answer_follows_the_marker_and_ends_with_eos():
    conversation = USER + [{"role": "assistant", "content": "85"}]
    assert render(conversation, False) == "Q: 37+48=\nA: 85</s>"
    # The training text is the prompt as the model sees it, then the answer: nothing is glued on.
    assert render(conversation, False) == render(USER, True) + "85" + TOK.eos_token
    ids = TOK(render(conversation, False), add_special_tokens=False)["input_ids"]
    assert ids[-1] == TOK.eos_token_id and len(ids) == 16  # one token per character, eos one token


def test_a_multi_turn_conversation_with_a_system_message():
    messages = [{"role": "system", "content": "Add."}, {"role": "user", "content": "1+1="},
                {"role": "assistant", "content": "2"}, {"role": "user", "content": "2+2="}]
    assert render(messages, True) == "Add.\nQ: 1+1=\nA: 2</s>Q: 2+2=\nA: "
    assert render(messages, False) == "Add.\nQ: 1+1=\nA: 2</s>Q: 2+2=\n"
    assert render(messages + [{"role": "assistant", "content": "4"}], False) == \
        "Add.\nQ: 1+1=\nA: 2</s>Q: 2+2=\nA: 4</s>"


def test_the_template_survives_save_and_load(tiny_model_dir):
    loaded = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert loaded.chat_template == tiny.CHAR_CHAT_TEMPLATE
    assert loaded.apply_chat_template(USER, tokenize=False, add_generation_prompt=True) == "Q: 37+48=\nA: "


def test_the_builtin_model_folder_and_the_warm_start_are_keyed_by_the_template(tmp_path, monkeypatch):
    from verl.config.schema import TrainerConfig
    from verl.trainer import warmstart

    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path))
    stale = tmp_path / "models" / tiny.BUILTIN_MODEL_NAME  # a folder written before the key existed
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    path = tiny.builtin_model_path()
    assert path.name == f"{tiny.BUILTIN_MODEL_NAME}-{tiny.builtin_model_key()}" and path != stale
    assert AutoTokenizer.from_pretrained(path).chat_template == tiny.CHAR_CHAT_TEMPLATE
    assert tiny.builtin_model_path() == path  # written once, then found

    config = TrainerConfig()
    key, warm_key = tiny.builtin_model_key(), warmstart._cache_key(config)
    monkeypatch.setattr(warmstart, "CHAR_CHAT_TEMPLATE", "{{ messages[0]['content'] }}")
    assert warmstart._cache_key(config) != warm_key
    monkeypatch.setattr(tiny, "CHAR_CHAT_TEMPLATE", "{{ messages[0]['content'] }}")
    assert tiny.builtin_model_key() != key


@pytest.mark.parametrize("task", ["addition", "countdown", "spell", "word_problems"])
def test_builtin_task_prompts_end_with_the_marker(task):
    from verl.data.tasks import TASKS

    row = TASKS[task].make_rows("test", n=1)[0]
    text = render(row["prompt"], True)
    assert text == "Q: " + row["prompt"][0]["content"] + "\nA: "
