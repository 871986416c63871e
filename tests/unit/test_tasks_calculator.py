"""The built-in calculator task (multiplication with a tool) and its calculator tool, checked by hand."""

import pytest

from verl.data.offline import Encoder, SFTDataset
from verl.data.tasks import TASKS, calculator
from verl.models.tiny import build_char_tokenizer
from verl.rewards.scorers import default_compute_score
from verl.tools.builtin import calculator as calc
from verl.trainer.warmstart import example_rows


def test_the_tool_evaluates_arithmetic_exactly_and_nothing_else():
    assert calc("123*45") == "5535"
    assert calc(" (7 + 5) / 4 ") == "3"
    assert calc("7/2") == "3.5" and calc("-3*-3") == "9"
    assert calc("1/0") == "Error: division by zero"
    assert calc("__import__('os').system('true')").startswith("Error: only numbers")
    assert calc("2**100") .startswith("Error: only numbers")  # no powers: nothing can blow up
    assert calc("12*") == "Error: not an arithmetic expression"


def test_rows_split_train_and_held_out_pairs_apart():
    train, test = calculator.make_rows("train"), calculator.make_rows("test")
    assert len(train) == calculator.TRAIN_ROWS and len(test) == calculator.TEST_ROWS
    train_pairs = {(r["extra_info"]["a"], r["extra_info"]["b"]) for r in train}
    assert not train_pairs & {(r["extra_info"]["a"], r["extra_info"]["b"]) for r in test}
    row = train[0]
    a, b = row["extra_info"]["a"], row["extra_info"]["b"]
    assert 100 <= a <= 999 and 10 <= b <= 99
    assert row["prompt"] == [{"role": "user", "content": f"{a}*{b}="}] and row["reward_model"]["ground_truth"] == str(a * b)
    assert TASKS["calculator"] is calculator


@pytest.mark.parametrize("response, score", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "123*45"}}</tool_call>5535\nA: 5535', 1.0),
    ("5535", 1.0),                   # no tool needed, if the model can do it
    ("A: 5535\n", 1.0),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "123*45"}}</tool_call>5535', 0.0),  # no answer
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "123*45"}}</tool_call>5535\nA: 5536', 0.0),
    ("55350", 0.0),
    ("", 0.0),
])
def test_only_the_final_answer_counts(response, score):
    assert calculator.compute_score(calculator.DATA_SOURCE, response, "5535") == score
    assert default_compute_score(calculator.DATA_SOURCE, response, "5535") == score  # the built-in scorer table


def test_the_warm_start_trains_on_the_models_turns_only():
    tok = build_char_tokenizer()
    row = {"data_source": calculator.DATA_SOURCE, "prompt": [{"role": "user", "content": "123*45="}],
           "reward_model": {"ground_truth": "5535"}, "extra_info": {"a": 123, "b": 45}}
    # The warm start's SFT row (the worked conversation) as the SFT trainer's dataset encodes it.
    (example,) = SFTDataset(example_rows([row], calculator), Encoder(tok, max_length=1024), messages_key="messages")
    ids, trained = example["input_ids"], example["loss_mask"]
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "123*45"}}</tool_call>'
    assert tok.decode(ids) == f"Q: 123*45=\nA: {call}</s>5535\nA: 5535</s>"
    # Trained: what the model writes in a rollout (the call and the answer, each with its eos); not
    # the prompt, the tool's result and the marker before the answer, which the loop splices in.
    assert tok.decode([t for t, m in zip(ids, trained) if m]) == f"{call}</s>5535</s>"
    assert tok.decode([t for t, m in zip(ids, trained) if not m]) == "Q: 123*45=\nA: 5535\nA: "

def test_a_direct_answer_trains_the_product_alone():
    # The warm start's second phase (sft_warmstart.direct_steps): the product answered at once, no call.
    tok = build_char_tokenizer()
    row = {"data_source": calculator.DATA_SOURCE, "prompt": [{"role": "user", "content": "123*45="}],
           "reward_model": {"ground_truth": "5535"}, "extra_info": {"a": 123, "b": 45}}
    rows = [{"messages": row["prompt"] + calculator.direct_messages(row)}]
    (example,) = SFTDataset(rows, Encoder(tok, max_length=1024), messages_key="messages")
    assert tok.decode(example["input_ids"]) == "Q: 123*45=\nA: 5535</s>"
    assert tok.decode([t for t, m in zip(example["input_ids"], example["loss_mask"]) if m]) == "5535</s>"
    assert calculator.compute_score(calculator.DATA_SOURCE, "5535", "5535") == 1.0  # right without the tool counts
