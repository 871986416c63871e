"""Tools for multi-turn rollouts: schemas from plain functions, verl's tool YAML and class interface,
the Hermes tool-call parser."""

import asyncio
import re
import textwrap

import pytest

from verl.agent.parsers import HermesToolParser, tool_parser
from verl.errors import VerlError
from verl.tools.base_tool import BaseTool
from verl.tools.function_tool import load_function_tools, normalize_tool_result, schema_of, tools_from_functions
from verl.tools.registry import load_tool_config, load_tools
from verl.tools.schemas import OpenAIFunctionCallSchema, OpenAIFunctionParsedSchema, ToolResponse


def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def test_a_function_with_hints_and_a_docstring_becomes_an_openai_schema():
    schema = schema_of(multiply).model_dump(exclude_none=True)
    assert schema == {"type": "function", "function": {
        "name": "multiply", "description": "Multiply two whole numbers.", "strict": False,
        "parameters": {"type": "object", "required": ["a", "b"], "properties": {
            "a": {"type": "integer", "description": "The first factor."},
            "b": {"type": "integer", "description": "The second factor."}}}}}
    (tool,) = tools_from_functions([multiply])
    response, reward, metrics = asyncio.run(tool.call({"a": 12, "b": 34}))
    assert (response.text, reward, metrics) == ("408", 0.0, {})


def test_a_function_without_a_docstring_is_refused_naming_what_it_lacks():
    def add(a: int, b: int) -> int:
        return a + b

    with pytest.raises(VerlError, match=r"add in .*test_tools.py: .*needs a type hint on every parameter and a docstring"):
        schema_of(add)


def test_a_tool_of_a_file_is_named_with_its_file_not_the_generated_module(tmp_path):
    (tmp_path / "my_tools.py").write_text("def add(a, b):\n    return a + b\n")
    with pytest.raises(VerlError, match=rf"^tool add in {re.escape(str(tmp_path / 'my_tools.py'))}: .*no docstring"):
        load_tools(None, tmp_path / "my_tools.py")


def test_a_file_of_functions_gives_its_public_functions_or_only_the_decorated_ones(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text(textwrap.dedent('''
        from math import sqrt  # imported: not a tool

        def square_root(x: float) -> float:
            """Square root.

            Args:
                x: A non-negative number.
            """
            return sqrt(x)

        async def echo(text: str) -> str:
            """Repeat the text.

            Args:
                text: What to repeat.
            """
            return text

        def _helper(x: int) -> int:
            return x
    '''))
    tools = {t.name: t for t in load_function_tools(plain)}
    assert sorted(tools) == ["echo", "square_root"]
    assert asyncio.run(tools["echo"].call({"text": "hi"}))[0].text == "hi"
    decorated = tmp_path / "decorated.py"
    decorated.write_text(textwrap.dedent('''
        from verl.tools.function_tool import function_tool

        @function_tool("lookup")
        def find(key: str) -> str:
            """Look a key up.

            Args:
                key: The key.
            """
            return key.upper()

        def not_a_tool(x: int) -> int:
            """Undecorated.

            Args:
                x: A number.
            """
            return x
    '''))
    assert [t.name for t in load_function_tools(decorated)] == ["lookup"]
    with pytest.raises(VerlError, match=r"function_tool_path=.*nowhere.py: no such file"):
        load_function_tools(tmp_path / "nowhere.py")


TOOL_CLASS = '''
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse


class CounterTool(BaseTool):
    """A verl-style stateful tool: counts its calls per trajectory, rewards 0.5 per call."""

    def __init__(self, config, tool_schema):
        super().__init__(config, tool_schema)
        self.counts = {}

    async def create(self, instance_id=None, start=0, **kwargs):
        instance_id = instance_id or f"t{len(self.counts)}"
        self.counts[instance_id] = start
        return instance_id, ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        self.counts[instance_id] += parameters.get("by", 1)
        return ToolResponse(text=str(self.counts[instance_id])), 0.5, {"count": self.counts[instance_id]}

    async def release(self, instance_id, **kwargs):
        del self.counts[instance_id]
'''

TOOL_YAML = '''
tools:
  - class_name: user_counter_tool.CounterTool
    config: {type: native, note: kept}
    tool_schema:
      type: function
      function:
        name: count
        description: Add to the counter and show it.
        parameters:
          type: object
          properties:
            by: {type: integer, description: How much to add.}
          required: []
'''


def test_verl_tool_yaml_builds_the_tool_classes_with_config_and_schema(tmp_path, monkeypatch):
    (tmp_path / "user_counter_tool.py").write_text(TOOL_CLASS)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "tools.yaml").write_text(TOOL_YAML)
    (tool,) = load_tool_config(tmp_path / "tools.yaml")
    assert isinstance(tool, BaseTool) and tool.name == "count" and tool.config == {"type": "native", "note": "kept"}

    async def session():
        instance, _ = await tool.create(start=10)
        response, reward, metrics = await tool.execute(instance, {"by": 5})
        await tool.release(instance)
        return response.text, reward, metrics
    assert asyncio.run(session()) == ("15", 0.5, {"count": 15})
    both = load_tools(tmp_path / "tools.yaml", functions=[multiply])
    assert sorted(both) == ["count", "multiply"]


@pytest.mark.parametrize("text, message", [
    ("tools: []", r"expected a top-level 'tools:' list"),
    ("tools:\n  - class_name: nowhere_module.Tool\n    config: {type: native}", r"cannot import nowhere_module"),
    ("tools:\n  - class_name: json.JSONDecoder\n    config: {type: mcp}", r"only native tools"),
    # A ':' forgotten after class_name makes the entry a string: shown as given.
    ("tools:\n  - class_name json.JSONDecoder", r"tools\[0\]: each entry needs a class_name \(a mapping such as "
                                                  r"class_name: pkg.module.MyTool\), got 'class_name json.JSONDecoder'"),
])
def test_a_broken_tool_yaml_is_one_error_naming_the_entry(tmp_path, text, message):
    (tmp_path / "tools.yaml").write_text(text)
    with pytest.raises(VerlError, match=message):
        load_tool_config(tmp_path / "tools.yaml")


def test_hermes_parser_finds_every_call_and_reports_the_broken_ones():
    text = ('Let me compute.\n<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call>\n'
            '<tool_call>{"name": "multiply", "arguments": {"a": 1</tool_call><tool_call>{"arguments": {}}</tool_call>')
    turn = HermesToolParser().parse(text)
    assert turn.content == "Let me compute."
    assert [(c.name, c.arguments) for c in turn.calls] == [("multiply", '{"a": 12, "b": 34}')]
    assert len(turn.errors) == 2 and "not JSON" in turn.errors[0] and "needs a \"name\"" in turn.errors[1]
    assert HermesToolParser().parse("The answer is 408.").calls == []
    with pytest.raises(VerlError, match=r"multi_turn.format='xml': no such tool-call format; formats: hermes"):
        tool_parser("xml")


def test_decoded_arguments_and_tool_results_normalise():
    call, bad = OpenAIFunctionCallSchema.from_openai_function_parsed_schema(
        OpenAIFunctionParsedSchema(name="f", arguments="[1, 2]"))
    assert bad and call.arguments == {}
    assert normalize_tool_result("x")[0] == ToolResponse(text="x")
    assert normalize_tool_result({"a": 1})[0].text == '{"a": 1}'
    assert normalize_tool_result((ToolResponse(text="y"), 1, {"m": 2})) == (ToolResponse(text="y"), 1.0, {"m": 2})
    with pytest.raises(ValueError, match="must be a list"):
        ToolResponse(image="not a list")


GSM8K_TOOL_YAML = """tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "A tool for calculating the reward of gsm8k."
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The model's answer"
          required: ["answer"]
"""


def test_verls_gsm8k_tool_config_grades_answers_against_the_rows_ground_truth(tmp_path):
    # verl's examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml names this class
    (tmp_path / "gsm8k_tool_config.yaml").write_text(GSM8K_TOOL_YAML)
    (tool,) = load_tool_config(tmp_path / "gsm8k_tool_config.yaml")
    assert tool.name == "calc_gsm8k_reward"

    async def session(**create_kwargs):
        instance, _ = await tool.create(**create_kwargs)
        calls = [await tool.execute(instance, {"answer": a}) for a in ("12", "72", "#### 72", 72.0)]
        final = await tool.calc_reward(instance)
        await tool.release(instance)
        return [(r.text, step) for r, step, _ in calls], final

    calls, final = asyncio.run(session(ground_truth="72"))  # extra_info.tools_kwargs...create_kwargs
    assert [step for _, step in calls] == [-0.05, 0.0, -0.05, -0.05] and final == 1.0
    assert calls[0][0] == "Current parsed answer='12' reward=0.0" and calls[1][0].endswith("reward=1.0")
    assert asyncio.run(session(create_kwargs={"ground_truth": "5"}))[1] == 0.0  # verl's nested form


def test_a_verl_tool_module_this_project_lacks_is_named_as_verls_with_the_fix(tmp_path):
    (tmp_path / "t.yaml").write_text(GSM8K_TOOL_YAML.replace("gsm8k_tool.Gsm8kTool", "geo3k_tool.Geo3kTool"))
    with pytest.raises(VerlError, match=r"verl.s verl.tools.geo3k_tool is not part of this project .*Gsm8kTool.*"
                                        r"BaseTool \(or .*BaseInteraction\) subclass"):
        load_tool_config(tmp_path / "t.yaml")


def test_verls_gsm8k_interaction_config_grades_each_answer_and_ends_on_the_right_one(tmp_path):
    from verl.agent.interactions import load_interactions

    (tmp_path / "gsm8k_interaction_config.yaml").write_text(
        'interaction:\n  - name: "gsm8k"\n    class_name: "verl.interactions.gsm8k_interaction.Gsm8kInteraction"\n'
        '    config: {}\n')
    gsm8k = load_interactions(tmp_path / "gsm8k_interaction_config.yaml")["gsm8k"]

    async def session():
        # extra_info.interaction_kwargs of verl's gsm8k_multiturn_w_interaction.py rows
        instance = await gsm8k.start_interaction(name="gsm8k", query="6*12?", ground_truth="72")
        turns = [await gsm8k.generate_response(instance, [{"role": "user", "content": "6*12?"},
                                                          {"role": "assistant", "content": answer}])
                 for answer in ("It is 72", "#### 71", "so #### 72")]
        await gsm8k.finalize_interaction(instance)
        return [(done, score) for done, _, score, _ in turns], turns[-1][1]

    turns, reply = asyncio.run(session())
    assert turns == [(False, 0.0), (False, 0.0), (True, 1.0)] and reply == "Your response is correct!"


@pytest.mark.parametrize("entry, message", [
    ("class_name: verl.tools.base_tool.BaseTool\n    config: [1, 2]", r"tools\[0\]: config must be a mapping"),
    # a class that takes only config: before, a bare TypeError without the file or the entry
    ("class_name: old_style_tool.OldStyleTool\n    tool_schema: {type: function, function: {name: g}}",
     r"tools\[0\]: old_style_tool.OldStyleTool\(config=..., tool_schema=...\) raised TypeError"),
    ("class_name: verl.tools.base_tool.BaseTool", r"tools\[0\]: verl.tools.base_tool.BaseTool\(config=..., "
                                                  r"tool_schema=...\) raised ValueError: BaseTool: no tool_schema"),
    ("class_name: verl.tools.base_tool.BaseTool\n    tool_schema: {type: function, function: {name: g, parameters: "
     "{type: object, properties: {a: {type: string}}, required: [b]}}}",
     r"tools\[0\]: tool_schema of g requires b, which its parameters.properties do not declare \(a\)"),
])
def test_a_tool_yaml_entry_that_cannot_build_its_tool_is_one_line_naming_the_entry(tmp_path, monkeypatch, entry,
                                                                                   message):
    (tmp_path / "old_style_tool.py").write_text("from verl.tools.base_tool import BaseTool\n\n\n"
                                                "class OldStyleTool(BaseTool):\n"
                                                "    def __init__(self, config):\n        self.config = config\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "t.yaml").write_text(f"tools:\n  - {entry}\n")
    with pytest.raises(VerlError, match=rf"^actor_rollout_ref.rollout.multi_turn.tool_config_path=.*t.yaml, {message}"):
        load_tools(tmp_path / "t.yaml")


def test_a_decorated_function_whose_given_schema_does_not_fit_it_is_refused(tmp_path):
    (tmp_path / "tools.py").write_text(textwrap.dedent('''
        from verl.tools.function_tool import function_tool

        @function_tool(schema={"type": "function", "function": {"name": "add", "parameters": {
            "type": "object", "properties": {"x": {"type": "integer"}, "b": {"type": "integer"}}}}})
        def add(a, b, c=0):
            return a + b + c
    '''))
    # before: loaded, and every call the model wrote from the schema failed with a TypeError
    with pytest.raises(VerlError, match=r"failed to run: VerlError: tool add: its schema does not fit add\(a, b, c=0\): "
                                        r"the schema's x is no parameter of the function; the function's a is not "
                                        r"in the schema"):
        load_function_tools(tmp_path / "tools.py")
