"""The built-in ``python`` tool and verl's SandboxFusionTool: the model's code runs in the sandbox of
the code rewards, and the tool answers with what it printed or why it failed."""

import asyncio

import pytest

from verl.errors import VerlError
from verl.tools.registry import load_tools


def _run(tool, parameters):
    response, reward, metrics = asyncio.run(tool.execute("i", parameters))
    return response.text, metrics


def _yaml(tmp_path, text):
    (tmp_path / "tools.yaml").write_text(text)
    return tmp_path / "tools.yaml"


def test_the_python_tool_from_a_tool_yaml_runs_code_and_reports_failures(tmp_path):
    tools = load_tools(_yaml(tmp_path, "tools:\n  - class_name: verl.tools.python_tool.PythonTool\n"
                                       "    config: {timeout: 1}\n"))
    tool = tools["python"]  # the built-in schema: a tool named python with a code argument
    assert tool.tool_schema.function.parameters.required == ["code"]
    assert _run(tool, {"code": "print(123*45)"}) == ("5535", {"status": "ok"})
    assert _run(tool, {"code": "x = 1"})[0].startswith("(the program printed nothing")
    text, metrics = _run(tool, {"code": "print('partial')\n1/0"})
    # what it printed, then the traceback of the program (not of the sandbox), for the model to read
    assert text == ('partial\nTraceback (most recent call last):\n  File "<solution>", line 2, in <module>\n'
                    'ZeroDivisionError: division by zero') and metrics == {"status": "error"}
    assert _run(tool, {"code": "while True: pass"}) == ("Error: the program ran past its 1 s limit",
                                                        {"status": "timeout"})
    text, metrics = _run(tool, {"code": "import socket\nsocket.create_connection(('10.0.0.1', 80))"})
    assert metrics == {"status": "blocked"} and text.endswith("(files, network and processes are not allowed)")
    assert _run(tool, {"code": ""})[0] == "Error: give the program as a non-empty string argument 'code'"


def test_calls_across_the_batch_run_concurrently_and_all_answer():
    from verl.tools.python_tool import PythonTool

    tool = PythonTool({"num_workers": 2})

    async def many():
        return await asyncio.gather(*(tool.execute(str(i), {"code": f"print({i}**2)"}) for i in range(6)))
    assert [r[0].text for r in asyncio.run(many())] == [str(i * i) for i in range(6)]


def test_a_flood_of_short_error_lines_costs_the_trainer_only_the_tail_the_model_reads():
    """4 MiB of 'ab' lines on stderr were split whole into ~1.4 million strings (~90 MiB) per call."""
    import tracemalloc

    from verl.tools.python_tool import ERROR_TAIL_CHARS, PythonTool, describe

    code = "import sys\nfor _ in range(64):\n    sys.stderr.write('ab\\n' * 21000)\nraise SystemExit('the end')"
    result = PythonTool({}).run(code)
    assert result.status == "error" and len(result.stderr) > 4_000_000, (result.status, len(result.stderr))
    tracemalloc.start()
    try:
        text = describe(result, 5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert text.endswith("ab\nab\nthe end") and len(text) <= ERROR_TAIL_CHARS
    assert peak < 1 << 20, peak  # the old split: ~90 MiB


def test_bad_settings_are_refused_with_the_key():
    from verl.tools.python_tool import PythonTool

    with pytest.raises(VerlError, match=r"config.timeout=-1 must be a positive number"):
        PythonTool({"timeout": -1})
    with pytest.raises(VerlError, match=r"config.num_workers='many'"):
        PythonTool({"num_workers": "many"})


RETOOL_YAML = """
tools:
  - class_name: "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
    config:
      sandbox_fusion_url: "https://example.invalid/run_code"
      num_workers: 4
      enable_global_rate_limit: true
      rate_limit: 4
      default_timeout: 30
      default_language: "{language}"
      memory_limit_mb: 1024
      type: native
    tool_schema:
      type: "function"
      function:
        name: "code_interpreter"
        description: "A tool for executing code."
        parameters:
          type: "object"
          properties:
            code:
              type: "string"
              description: "The code to execute."
          required: ["code"]
"""


def test_verls_sandbox_fusion_tool_yaml_runs_unchanged_in_the_local_sandbox(tmp_path, caplog):
    tools = load_tools(_yaml(tmp_path, RETOOL_YAML.replace("{language}", "python")))
    tool = tools["code_interpreter"]
    assert tool.timeout == 30 and tool.memory_mb == 1024
    assert "not contacted" in caplog.text  # the url is named, not silently dropped
    assert _run(tool, {"code": "print(sum(range(10)))"})[0] == "45"
    assert _run(tool, {"code": "int main() {}", "language": "cpp"})[0] == (
        "Error: language 'cpp' is not available; only python runs here")
    with pytest.raises(VerlError, match="default_language='java'.*Python only"):
        load_tools(_yaml(tmp_path, RETOOL_YAML.replace("{language}", "java")))
