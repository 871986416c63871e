"""Multi-turn rollouts on a real model: a tiny Qwen2 taught one tool-use trace calls the tool, reads
the result the loop splices in, and answers. The trajectory holds the exact ids the model drew,
the tool result is in the sequence but out of the loss, and the log-probs the engine reported for
the model's tokens equal the actor's recomputation over the whole trajectory."""

import copy
import json

import pytest
import torch

from agent_models import CALL, TOOL_CONVERSATION, memorize, tool_task_args, write_tool_task
from verl.agent.agent_loop import AgentLoop, AgentSettings
from verl.data import collate_prompts
from verl.models.logprob import compute_response_logprobs
from verl.rollout import HFRollout, SamplingParams
from verl.tools.function_tool import tools_from_functions


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    """Question, tool call, tool result (not trained on at RL time), answer."""
    return memorize(tmp_path_factory, "tool-model", [TOOL_CONVERSATION])


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
    model, tok, _ = tool_model
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
    model, tok, _ = tool_model
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


@pytest.mark.parametrize("engine", ["hf", "native"])
def test_main_ppo_trains_on_multi_turn_rollouts_with_a_file_of_tool_functions(tool_model, tmp_path, engine):
    from verl.trainer.main_ppo import main

    write_tool_task(tmp_path)
    out = tmp_path / "out"
    assert main(tool_task_args(tool_model[2], tmp_path, out, "actor_rollout_ref.actor.optim.lr=1e-4",
                               "actor_rollout_ref.rollout.temperature=0.5", "trainer.total_training_steps=2",
                               f"actor_rollout_ref.rollout.name={engine}")) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "agent/num_turns/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:  # every trajectory called the tool once and answered: two assistant turns
        assert r["agent/num_turns/mean"] == 2 and r["agent/tool_calls/mean"] == 1 and r["agent/tool_errors"] == 0
        assert r["critic/score/mean"] == 1.0
        assert "actor/pg_loss" in r
    assert rows[0]["val-core/calc/reward/mean@1"] == 1.0  # greedy validation runs the loop too


PYTHON_CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(12*34)"}}</tool_call>'


def test_the_built_in_python_tool_runs_the_models_code_in_the_sandbox(tmp_path_factory, tmp_path):
    from verl.tools.registry import load_tools

    model, tok, _ = memorize(tmp_path_factory, "python-model", [[
        {"role": "user", "content": "12*34="}, {"role": "assistant", "content": PYTHON_CALL},
        {"role": "tool", "content": "408"}, {"role": "assistant", "content": "408"}]])
    (tmp_path / "tools.yaml").write_text("tools:\n  - class_name: verl.tools.python_tool.PythonTool\n")
    loop = AgentLoop(HFRollout(model, tok), tok, load_tools(tmp_path / "tools.yaml"), AgentSettings())
    out = loop.generate(_prompts(tok, 1), SamplingParams(max_new_tokens=120, do_sample=False))
    seen = out["attention_mask"][0, out["prompts"].shape[1]:].bool()
    # the program ran in the sandbox and its output is the spliced tool message; the model answers
    assert tok.decode(out["responses"][0][seen]) == f"{PYTHON_CALL}</s>408\nA: 408</s>"
    assert out["agent_tool_calls"].tolist() == [1.0] and out["agent_tool_errors"].tolist() == [0.0]


# Every estimator but gdpo (which needs a reward function with named components) on multi-turn
# trajectories: tool results are out of the loss, so every estimator sees the model's tokens only.
ESTIMATORS = ["gae", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "gpg",
              "optimal_token_baseline"]


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_every_estimator_trains_on_multi_turn_rollouts(tool_model, tmp_path, estimator):
    from verl.trainer.main_ppo import main

    write_tool_task(tmp_path)
    out = tmp_path / "out"
    critic = ["critic.ppo_micro_batch_size_per_gpu=1"] if estimator == "gae" else []
    assert main(tool_task_args(tool_model[2], tmp_path, out, f"algorithm.adv_estimator={estimator}", *critic,
                               "actor_rollout_ref.rollout.temperature=1.0", "trainer.total_training_steps=1",
                               "trainer.val_before_train=false", "actor_rollout_ref.actor.optim.lr=1e-3")) == 0
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert 0 < row["agent/tool_calls/mean"] < 1  # some trajectories called the tool, some did not
    # a learning signal: rewards differ (remax's greedy baseline, itself a multi-turn rollout, earns 1)
    assert row["critic/advantages/max"] > row["critic/advantages/min"]
    assert row["actor/grad_norm"] > 0
    assert ("critic/vf_loss" in row) == (estimator == "gae")  # the estimator asked for is the one that ran


COUNTER_TOOL = '''
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse


class Multiply(BaseTool):
    """A stateful verl tool named like the trained call: it multiplies, starting from a per-row offset."""

    def __init__(self, config, tool_schema):
        super().__init__(config, tool_schema)
        self.offsets, self.released = {}, []

    async def create(self, instance_id=None, offset=0, **kwargs):
        instance_id = instance_id or f"i{len(self.offsets)}"
        self.offsets[instance_id] = offset
        return instance_id, ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=str(parameters["a"] * parameters["b"] + self.offsets[instance_id])), 0.5, {}

    async def calc_reward(self, instance_id, **kwargs):
        return 0.25

    async def release(self, instance_id, **kwargs):
        self.released.append(instance_id)
'''


def _counter_tool_yaml(folder, module: str, monkeypatch):
    """A tool YAML declaring COUNTER_TOOL's Multiply, written as ``module`` (importable from ``folder``)."""
    (folder / f"{module}.py").write_text(COUNTER_TOOL)
    (folder / "tools.yaml").write_text(
        f"tools:\n  - class_name: {module}.Multiply\n    config: {{type: native}}\n    tool_schema:\n"
        "      type: function\n      function: {name: multiply, description: Multiply.}\n")
    monkeypatch.syspath_prepend(str(folder))
    return folder / "tools.yaml"


def test_a_verl_tool_class_gets_each_rows_create_kwargs_from_extra_info(tool_model, tmp_path, monkeypatch):
    from verl.tools.registry import load_tools

    model, tok, _ = tool_model
    tools = load_tools(_counter_tool_yaml(tmp_path, "row_tools", monkeypatch))
    prompts = _prompts(tok)
    prompts["extra_info"] = [{"tools_kwargs": {"multiply": {"create_kwargs": {"offset": k}}}} for k in (0, 1000)]
    out = AgentLoop(HFRollout(model, tok), tok, tools, AgentSettings(max_assistant_turns=2)).generate(
        prompts, SamplingParams(max_new_tokens=120, do_sample=False))
    results = []
    for i in range(2):
        seen = out["attention_mask"][i, out["prompts"].shape[1]:].bool()
        results.append(tok.decode(out["responses"][i][seen & ~out["response_mask"][i].bool()]))
    assert results == ["408\nA: ", "1408\nA: "]  # each row's own instance, created with its kwargs
    assert out["agent_reward"].tolist() == [0.75, 0.75]  # execute's 0.5 + calc_reward's 0.25
    assert sorted(tools["multiply"].released) == ["i0", "i1"]


def test_a_row_without_the_create_kwargs_a_tool_takes_is_warned_once_and_counted(tool_model, tmp_path, monkeypatch,
                                                                                 caplog):
    from verl.tools.registry import load_tools

    model, tok, _ = tool_model
    tools = load_tools(_counter_tool_yaml(tmp_path, "row_tools2", monkeypatch))
    prompts = _prompts(tok)
    prompts["extra_info"] = [{"tools_kwargs": {"multiply": {"create_kwargs": {"offset": 1000}}}}, {}]
    with caplog.at_level("WARNING", logger="verl.agent.agent_loop"):
        out = AgentLoop(HFRollout(model, tok), tok, tools, AgentSettings(max_assistant_turns=2)).generate(
            prompts, SamplingParams(max_new_tokens=120, do_sample=False))
    assert out["agent_defaulted"].tolist() == [0.0, 1.0]  # the second row created its instance with offset=0
    warned = [r.getMessage() for r in caplog.records if "tools_kwargs" in r.getMessage()]
    assert warned == ["tool multiply: rows without extra_info.tools_kwargs.multiply.create_kwargs.offset (first: row "
                      "1) create it with the default of offset; agent/defaulted_values counts them"]


class _SwapWhileToolsRun:
    """New weights (version 1) become pending when the tool is called: the partial rollout must take
    them before the next assistant turn (the weights change with tool calls in flight)."""

    def __init__(self, model, state):
        self.model, self.state = model, state
        self.version, self.ready, self.applied = 0, False, 0

    def pending(self) -> bool:
        return self.ready and self.version == 0

    def apply(self) -> None:
        self.model.load_state_dict(self.state)
        self.version, self.applied = 1, self.applied + 1


def test_a_partial_rollout_takes_new_weights_while_the_tool_runs_and_says_which_version_drew_what(tool_model):
    model, tok, _ = tool_model
    rollout_model, new = copy.deepcopy(model), copy.deepcopy(model)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.01 * torch.randn_like(p))
    swap = _SwapWhileToolsRun(rollout_model, new.state_dict())

    def multiply(a: int, b: int) -> int:
        """Multiply two whole numbers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        swap.ready = True
        return a * b
    loop = AgentLoop(HFRollout(rollout_model, tok), tok, {t.name: t for t in tools_from_functions([multiply])},
                     AgentSettings(max_assistant_turns=4))
    out = loop.generate(_prompts(tok), SamplingParams(max_new_tokens=120, do_sample=False, logprobs=True), swap=swap)
    assert swap.applied == 1 and out["policy_version_last"].tolist() == [1, 1]
    assert out["agent_tool_calls"].tolist() == [1.0, 1.0] and out["agent_turns"].tolist() == [2.0, 2.0]
    trained = out["response_mask"].bool()
    seen = out["attention_mask"][:, out["prompts"].shape[1]:].bool()
    tool_result = seen & ~trained
    # the first turn: the trained tokens before the tool's result; the second: those after it
    first_turn = trained & (tool_result.long().cumsum(1) == 0)
    second_turn = trained & ~first_turn
    assert first_turn.any() and second_turn.any()
    logprobs = {}
    for name, m in (("old", model), ("new", new)):
        with torch.no_grad():
            logprobs[name], _ = compute_response_logprobs(m, out["input_ids"], out["attention_mask"],
                                                          out["position_ids"], out["responses"])
    rollout = out["rollout_log_probs"]
    torch.testing.assert_close(rollout[first_turn], logprobs["old"][first_turn], atol=1e-4, rtol=0)
    torch.testing.assert_close(rollout[second_turn], logprobs["new"][second_turn], atol=1e-4, rtol=0)
    assert (logprobs["old"] - logprobs["new"])[second_turn].abs().max() > 1e-3
