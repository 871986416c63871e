"""Multi-turn rollouts on a real model: a tiny Qwen2 taught one tool-use trace calls the tool, reads
the result the loop splices in, and answers. The trajectory holds the exact ids the model drew,
the tool result is in the sequence but out of the loss, and the log-probs the engine reported for
the model's tokens equal the actor's recomputation over the whole trajectory."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.agent.loop import AgentLoop, AgentSettings
from verl.data import collate_prompts
from verl.models.logprob import compute_response_logprobs
from verl.models.tiny import make_tiny_model_folder
from verl.rollout import HFRollout, SamplingParams
from verl.tools.function_tool import tools_from_functions

CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>'


def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    """The tiny model, trained until it reproduces one conversation: question, tool call, tool
    result (not trained on), answer."""
    torch.manual_seed(0)
    path = make_tiny_model_folder(tmp_path_factory.mktemp("tool-model"), num_layers=2, hidden_size=64,
                                  intermediate_size=128)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    chat = [{"role": "user", "content": "12*34="}, {"role": "assistant", "content": CALL},
            {"role": "tool", "content": "408"}, {"role": "assistant", "content": "408"}]
    text = tok.apply_chat_template(chat, tokenize=False)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(300):
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.01:
            break
    model.eval()
    return model, tok


def _prompts(tok, n_rows=2):
    rows = []
    for _ in range(n_rows):
        text = tok.apply_chat_template([{"role": "user", "content": "12*34="}], tokenize=False,
                                       add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        rows.append({"input_ids": torch.tensor(ids), "raw_prompt": None, "data_source": "test", "ground_truth": "408",
                     "extra_info": {}, "index": len(rows)})
    return collate_prompts(rows, tok.pad_token_id)


def test_the_model_calls_the_tool_reads_the_result_and_answers(tool_model):
    model, tok = tool_model
    calls = []

    def multiply_logged(a: int, b: int) -> int:
        """Multiply two whole numbers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        calls.append((a, b))
        return a * b
    multiply_logged.__name__ = "multiply"
    loop = AgentLoop(HFRollout(model, tok), tok, {t.name: t for t in tools_from_functions([multiply_logged])},
                     AgentSettings(max_assistant_turns=4))
    out = loop.generate(_prompts(tok), SamplingParams(max_new_tokens=120, do_sample=False, logprobs=True))

    assert calls == [(12, 34), (12, 34)]  # one call per trajectory, run by the loop
    for i in range(2):
        seen = out["attention_mask"][i, out["prompts"].shape[1]:].bool()
        trained = out["response_mask"][i].bool()
        text = tok.decode(out["responses"][i][seen])
        assert text == f"{CALL}</s>408\nA: 408</s>"  # the whole trajectory, the result spliced in
        # Only the model's own tokens are trained on: both assistant turns, each with its eos.
        assert tok.decode(out["responses"][i][trained]) == f"{CALL}</s>408</s>"
        assert tok.decode(out["responses"][i][seen & ~trained]) == "408\nA: "
    assert out["agent_turns"].tolist() == [2.0, 2.0] and out["agent_tool_calls"].tolist() == [1.0, 1.0]
    assert out["agent_tool_errors"].tolist() == [0.0, 0.0]

    # The engine's log-probs of the model's tokens are the actor's over the whole trajectory.
    mask = out["response_mask"].bool()
    for packed in (False, True):  # padded and packed forward passes (use_remove_padding)
        with torch.no_grad():
            actor = compute_response_logprobs(model, out["input_ids"], out["attention_mask"], out["position_ids"],
                                              out["responses"], remove_padding=packed)
        actor = actor[0] if isinstance(actor, tuple) else actor
        torch.testing.assert_close(out["rollout_log_probs"][mask], actor[mask], atol=1e-4, rtol=0)
    assert (out["rollout_log_probs"][~mask] == 0).all()


def test_a_call_to_an_unknown_tool_and_the_turn_limit_end_the_trajectory_with_feedback(tool_model):
    model, tok = tool_model
    loop = AgentLoop(HFRollout(model, tok), tok, {}, AgentSettings(max_assistant_turns=1))
    out = loop.generate(_prompts(tok, 1), SamplingParams(max_new_tokens=120, do_sample=False))
    seen = out["attention_mask"][0, out["prompts"].shape[1]:].bool()
    # One assistant turn allowed: the call is made, and the trajectory stops before any tool result.
    assert tok.decode(out["responses"][0][seen]) == f"{CALL}</s>"
    assert out["agent_turns"].tolist() == [1.0]

    loop = AgentLoop(HFRollout(model, tok), tok, {}, AgentSettings(max_assistant_turns=2))
    out = loop.generate(_prompts(tok, 1), SamplingParams(max_new_tokens=160, do_sample=False))
    seen = out["attention_mask"][0, out["prompts"].shape[1]:].bool()
    text = tok.decode(out["responses"][0][seen])
    assert "Error: no tool named 'multiply'; tools: " in text and out["agent_tool_errors"].tolist() == [1.0]
    assert json.loads(CALL[len("<tool_call>"):-len("</tool_call>")])["name"] == "multiply"
