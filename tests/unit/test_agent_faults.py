"""The multi-turn loop when the model, a tool, an environment or an interaction misbehaves: each case
either is answered to the model (an error message, out of the loss) and the rollout goes on, or stops
the run with one line naming the tool, row and turn. The model's turns come from a scripted engine
(the token-id interface every engine implements, replaying fixed texts: a model that writes a given
malformed call on demand), so each case runs in milliseconds."""

import asyncio
import threading

import pytest
import torch

from verl.agent.agent_loop import AgentLoop, AgentSettings
from verl.data import collate_prompts
from verl.errors import VerlError
from verl.models.tiny import build_char_tokenizer
from verl.rollout.base import RolloutEngine, SamplingParams
from verl.tools.base_tool import BaseTool
from verl.tools.function_tool import tools_from_functions
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

torch.set_num_threads(1)
TOK = build_char_tokenizer()
CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>'


class ScriptedRollout(RolloutEngine):
    """Writes ``turns[k]`` (then eos) as every row's k-th assistant turn, with log-prob -0.5 per token."""

    name = "scripted"

    def __init__(self, turns: list[str]):
        super().__init__(TOK.eos_token_id, TOK.pad_token_id)
        self.turns = turns

    def generate_responses(self, input_ids, attention_mask, params, seeds):
        rows = []
        for prompt, mask in zip(input_ids, attention_mask):
            turn = TOK.decode(prompt[mask.bool()]).count("</s>")  # earlier assistant turns each end with eos
            ids = (TOK(self.turns[min(turn, len(self.turns) - 1)], add_special_tokens=False)["input_ids"]
                   + [TOK.eos_token_id])[:params.max_new_tokens]
            rows.append(ids + [TOK.pad_token_id] * (params.max_new_tokens - len(ids)))
        responses = torch.tensor(rows)
        return responses, torch.full(responses.shape, -0.5) if params.logprobs else None


def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def class_tool(execute, name="multiply"):
    """A BaseTool named ``name`` whose execute is ``execute(parameters)`` (a coroutine function)."""
    schema = OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {"name": name}})

    class Tool(BaseTool):
        async def execute(self, instance_id, parameters, **kwargs):
            return await execute(parameters)
    return {name: Tool({}, schema)}


def agent_loop(turns, tools, **settings):
    return AgentLoop(ScriptedRollout(turns), TOK, tools, AgentSettings(**{"max_assistant_turns": 3, **settings}))


def generate(loop, rows=1, max_new_tokens=300, raw_prompt=None):
    prompt = TOK(TOK.apply_chat_template([{"role": "user", "content": "12*34="}], tokenize=False,
                                         add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    batch = collate_prompts([{"input_ids": torch.tensor(prompt), "raw_prompt": raw_prompt, "data_source": "t",
                              "ground_truth": "408", "extra_info": {}, "index": i} for i in range(rows)],
                            TOK.pad_token_id)
    return loop.generate(batch, SamplingParams(max_new_tokens=max_new_tokens, do_sample=False, logprobs=True))


def rollout(turns, tools, rows=1, max_new_tokens=300, **settings):
    return generate(agent_loop(turns, tools, **settings), rows, max_new_tokens)


def pieces(out, i=0):
    """Row ``i``'s whole response text, the text of its trained tokens, and of its untrained ones; and checks
    that the untrained tokens carry no log-prob."""
    seen = out["attention_mask"][i, out["prompts"].shape[1]:].bool()
    trained = out["response_mask"][i].bool()
    assert not trained[~seen].any() and (out["rollout_log_probs"][i][~trained] == 0).all()
    assert (out["rollout_log_probs"][i][trained] == -0.5).all()
    ids = out["responses"][i]
    return TOK.decode(ids[seen]), TOK.decode(ids[trained]), TOK.decode(ids[seen & ~trained])


def test_a_sync_tool_that_never_returns_times_out_without_holding_up_later_calls_or_the_exit():
    release = threading.Event()

    def multiply(a: int, b: int) -> int:
        """Multiply.

        Args:
            a: The first factor.
            b: The second factor.
        """
        if a == 12:
            release.wait()
        return a * b

    loop = agent_loop([CALL, "done"], {t.name: t for t in tools_from_functions([multiply])}, tool_timeout_s=0.2)
    try:
        out = generate(loop, rows=40)
        assert out["agent_tool_errors"].tolist() == [1.0] * 40
        whole, trained, spliced = pieces(out)
        assert spliced == "Error: multiply did not answer within 0.2 s\nA: " and trained == f"{CALL}</s>done</s>"
        # 32 or more calls hang (more than asyncio's shared executor has threads here: min(32, CPUs + 4)), and the
        # next ones still run; the hung threads do not hold up the interpreter's exit
        loop.engine.turns = [CALL.replace("12", "2"), "done"]
        out = generate(loop, rows=2)
        assert out["agent_tool_errors"].tolist() == [0.0, 0.0] and pieces(out)[2] == "68\nA: "
        hung = [t for t in threading.enumerate() if t.name == "verl-tool-multiply"]
        assert len(hung) >= 32 and all(t.daemon for t in hung)
    finally:
        release.set()


def test_an_async_tool_that_blocks_the_event_loop_stops_the_run_naming_it():
    release = threading.Event()

    async def blocks(parameters):
        release.wait()  # a blocking call in an async def: no timeout can fire while it runs
        return "never"

    try:
        with pytest.raises(VerlError, match=r"^tool multiply \(row 0, turn 1\) blocked the tools' event loop for over "
                                            r"0\.2 s .*an async def must not block"):
            rollout([CALL, "done"], class_tool(blocks), tool_timeout_s=0.2)
    finally:
        release.set()


@pytest.mark.parametrize("exit_with", [SystemExit(3), KeyboardInterrupt()])
def test_a_tool_that_exits_stops_the_run_naming_it(exit_with):
    async def exits(parameters):
        raise exit_with

    # before: the loop's thread died with it and the rollout waited forever
    with pytest.raises(VerlError, match=rf"^tool multiply \(row 0, turn 1\) raised {type(exit_with).__name__}\("):
        rollout([CALL, "done"], class_tool(exits))

    def multiply(a: int, b: int) -> int:
        """Multiply.

        Args:
            a: The first factor.
            b: The second factor.
        """
        raise exit_with
    with pytest.raises(VerlError, match=rf"^tool multiply \(row 0, turn 1\) raised {type(exit_with).__name__}\("):
        rollout([CALL, "done"], {t.name: t for t in tools_from_functions([multiply])})


def test_a_cancelled_operation_inside_a_tool_is_an_error_for_the_model():
    async def cancelled(parameters):
        raise asyncio.CancelledError()

    out = rollout([CALL, "done"], class_tool(cancelled))
    assert pieces(out)[1:] == (f"{CALL}</s>done</s>", "Error: multiply was cancelled\nA: ")
    assert out["agent_tool_errors"].tolist() == [1.0]


def returns(value):
    async def execute(parameters):
        return value
    return execute


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), "high", [1.0]])
def test_a_tool_reward_that_is_not_a_finite_number_stops_the_run_naming_the_tool(reward):
    # before: NaN/inf reached the trajectory's score; a string was answered to the model as its own error
    with pytest.raises(VerlError, match=r"^tool multiply \(row 0, turn 1\): execute returned reward .*: a tool's "
                                        r"reward must be a finite number"):
        rollout([CALL, "done"], class_tool(returns((ToolResponse(text="408"), reward, {}))))


def test_a_tool_reward_of_none_counts_zero_and_is_counted_as_defaulted():
    out = rollout([CALL, "done"], class_tool(returns((ToolResponse(text="408"), None, {}))))
    assert out["agent_reward"].tolist() == [0.0] and out["agent_defaulted"].tolist() == [1.0]
    assert out["extra_info"][0]["tool_rewards"] == [0.0]
    out = rollout([CALL, "done"], class_tool(returns((ToolResponse(text="408"), 0.5, {}))))
    assert out["agent_reward"].tolist() == [0.5] and out["agent_defaulted"].tolist() == [0.0]
    assert pieces(out)[1:] == (f"{CALL}</s>done</s>", "408\nA: ")


@pytest.mark.parametrize("value", [(ToolResponse(text="408"), 1.0), None, {"text": "408"}])
def test_a_tool_class_whose_execute_returns_another_shape_stops_the_run_naming_it(value):
    # before: the tuple's repr (or "null") was shown to the model and its reward dropped
    with pytest.raises(VerlError, match=r"^tool multiply \(row 0, turn 1\): execute returned .*; a tool's execute "
                                        r"returns \(ToolResponse, reward, metrics\)"):
        rollout([CALL, "done"], class_tool(returns(value)))


@pytest.mark.parametrize("method", ["create", "calc_reward", "release"])
def test_a_tool_whose_create_calc_reward_or_release_raises_or_hangs_stops_the_run_naming_it(method):
    schema = OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {"name": "counter"}})
    released = []

    class Broken(BaseTool):
        mode = "raise"

        async def create(self, instance_id=None, **kwargs):
            if method == "create":
                await self.fail()
            return "i", ToolResponse()

        async def calc_reward(self, instance_id, **kwargs):
            if method == "calc_reward":
                await self.fail()
            return 0.0

        async def release(self, instance_id, **kwargs):
            released.append(instance_id)
            if method == "release":
                await self.fail()

        async def fail(self):
            if self.mode == "hang":
                await asyncio.sleep(3600)
            raise KeyError("no such thing")

    tool = Broken({}, schema)
    # before: a bare KeyError traceback (and a hung rollout for a create that never returns)
    with pytest.raises(VerlError, match=rf"^tool counter's {method} \(row 0\) raised KeyError: 'no such thing'$"):
        rollout(["done"], {"counter": tool})
    tool.mode = "hang"
    with pytest.raises(VerlError, match=rf"^tool counter's {method} \(row 0\) did not return within 0.1 s"):
        rollout(["done"], {"counter": tool}, tool_timeout_s=0.1)
    if method == "calc_reward":  # a failed rollout still releases what it created
        assert released == ["i", "i"]


def test_a_tool_calc_reward_that_is_nan_stops_the_run():
    schema = OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {"name": "counter"}})

    class NaNReward(BaseTool):
        async def calc_reward(self, instance_id, **kwargs):
            return float("nan")

    with pytest.raises(VerlError, match=r"^tool counter's calc_reward \(row 0\) returned reward nan"):
        rollout(["done"], {"counter": NaNReward({}, schema)})


class Judge:
    """An environment that replies "Again." (reward 0) until the model's turn is "done"; ``fault`` makes its
    step raise, hang or return another shape."""

    fault = None

    def reset(self, sample):
        return None

    async def step(self, message):
        if self.fault == "raise":
            raise RuntimeError("judge offline")
        if self.fault == "hang":
            await asyncio.sleep(3600)
        if self.fault == "shape":
            return "Again.", 0.0
        return ("Again.", 0.0, False) if message != "done" else (None, 1.0, True)


@pytest.mark.parametrize("fault, message", [
    ("raise", r"Judge\.step \(row 0, turn 1\) raised RuntimeError: judge offline$"),
    ("hang", r"Judge\.step \(row 0, turn 1\) did not return within 0\.1 s \(multi_turn\.tool_timeout_s bounds"),
    ("shape", r"Judge\.step returned \('Again\.', 0\.0\) for row 0 \(turn 1\): step returns \(reply, reward, done\)")])
def test_an_environment_step_that_raises_hangs_or_returns_another_shape_stops_the_run_naming_it(fault, message):
    class Faulty(Judge):
        pass
    Faulty.fault, Faulty.__name__ = fault, "Judge"
    loop = AgentLoop(ScriptedRollout(["guess", "done"]), TOK, {}, AgentSettings(tool_timeout_s=0.1),
                     environment=Faulty)
    # before: a bare traceback, or (an async step that never returns) a rollout that waited forever
    with pytest.raises(VerlError, match="^" + message):
        generate(loop)
    out = generate(AgentLoop(ScriptedRollout(["guess", "done"]), TOK, {}, AgentSettings(), environment=Judge))
    assert pieces(out)[1:] == ("guess</s>done</s>", "Q: Again.\nA: ") and out["agent_reward"].tolist() == [1.0]


def test_a_verl_interaction_that_raises_or_returns_three_values_stops_the_run_naming_it(tmp_path, monkeypatch):
    from verl.agent.interactions import interaction_environment

    (tmp_path / "faulty_interaction.py").write_text(
        "class FaultyInteraction:\n"
        "    def __init__(self, config):\n        pass\n"
        "    async def start_interaction(self, instance_id=None, **kwargs):\n        return instance_id\n"
        "    async def generate_response(self, instance_id, messages, **kwargs):\n"
        "        if messages[-1]['content'] == 'guess':\n            raise KeyError('target')\n"
        "        return False, 'Again.', 0.0\n")
    (tmp_path / "interaction.yaml").write_text("interaction:\n  - class_name: faulty_interaction.FaultyInteraction\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = interaction_environment(tmp_path / "interaction.yaml")
    prompt = [{"role": "user", "content": "12*34="}]
    with pytest.raises(VerlError, match=r"^FaultyInteraction\.generate_response \(row 0, turn 1\) raised KeyError: "
                                        r"'target'$"):
        generate(AgentLoop(ScriptedRollout(["guess"]), TOK, {}, AgentSettings(), environment=env), raw_prompt=prompt)
    with pytest.raises(VerlError, match=r"FaultyInteraction\.generate_response returned \(False, 'Again\.', 0\.0\); "
                                        r"it returns \(should_terminate, reply, turn_score, extra\)"):
        generate(AgentLoop(ScriptedRollout(["other"]), TOK, {}, AgentSettings(), environment=env), raw_prompt=prompt)


@pytest.mark.parametrize("turn, spliced", [
    # a call whose string argument quotes the tags: before, cut at the quoted </tool_call> (not JSON)
    ('<tool_call>{"name": "echo", "arguments": {"text": "say <tool_call>x</tool_call>"}}</tool_call>',
     "say <tool_call>x</tool_call>"),
    # brackets nested past Python's recursion limit: before, a RecursionError ended the run
    ("<tool_call>" + "[" * 5000 + "]" * 5000 + "</tool_call>", "Error: the tool call is not JSON (nested too deeply)"),
    ('<tool_call>{"name": "echo", "arguments": "' + "[" * 5000 + "]" * 5000 + '"}</tool_call>',
     "Error: the arguments of echo are not a JSON object"),
    ('<tool_call>{"name": "echo", "arguments": {"text": "h\\u00e9llo \\"\\u2603\\""}}</tool_call>', 'héllo "☃"'),
    ('<tool_call>{"name": "echo", "arguments": {"text": 5}}</tool_call>', "5"),
    # arguments the function cannot take, said in the schema's terms (before: Python's own "...echo() got an
    # unexpected keyword argument 'txt'")
    ('<tool_call>{"name": "echo", "arguments": {"txt": "a"}}</tool_call>',
     "Error: TypeError: echo got no argument 'txt'; 'text' missing; its arguments: text (required), times"),
    ('<tool_call>{"name": "echo", "arguments": {"times": 2}}</tool_call>',
     "Error: TypeError: echo got 'text' missing; its arguments: text (required), times"),
    ('<tool_call>{"name": "echo", "arguments": {"text": "a"</tool_call>', "Error: the tool call is not JSON"),
    ('<tool_call>{"name": "ech", "arguments": {"text": "a"}}</tool_call>', "Error: no tool named 'ech'; tools: echo"),
])
def test_malformed_calls_are_answered_to_the_model_out_of_the_loss(turn, spliced):
    def echo(text: str, times: int = 1) -> str:
        """Repeat the text.

        Args:
            text: What to repeat.
            times: How many times.
        """
        return str(text) * times

    out = rollout([turn, "done"], {t.name: t for t in tools_from_functions([echo])}, max_new_tokens=25000)
    whole, trained, tool_text = pieces(out)
    assert trained == f"{turn}</s>done</s>"  # the model's two turns, each with its eos: all that is trained on
    assert tool_text.startswith(spliced) and tool_text.endswith("\nA: ")
    assert out["agent_tool_calls"].tolist() == [1.0]
    assert out["agent_tool_errors"].tolist() == [1.0 if spliced.startswith("Error") else 0.0]


def test_a_turn_cut_by_the_response_budget_inside_a_call_ends_the_trajectory_uncalled():
    out = rollout([CALL, "done"], {t.name: t for t in tools_from_functions([multiply])}, max_new_tokens=30)
    assert pieces(out) == (CALL[:30], CALL[:30], "")
    assert out["agent_tool_calls"].tolist() == [0.0] and out["agent_turns"].tolist() == [1.0]
