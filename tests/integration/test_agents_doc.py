"""Every code block of docs/agents.md runs as written (tools from a file and a YAML, the built-in python tool, the parser, a
multi-turn run with an environment through main_ppo)."""

import json

import pytest

from helpers import REPO, run_document

DOC = REPO / "docs" / "agents.md"
pytestmark = pytest.mark.slow


def test_every_code_block_of_the_agents_guide_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = run_document(DOC, tmp_path, min_blocks=5)
    assert sorted(namespace["tools"]) == ["calculator", "count"]
    assert namespace["turn"].calls[0].name == "calculator"
    assert namespace["response"].text.endswith("ZeroDivisionError: division by zero")  # the python tool's answer
    assert sorted(namespace["interactions"]) == ["echo"]  # verl's interaction YAML
    rows = [json.loads(line) for line in (tmp_path / "outputs/guess/metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "agent/num_turns/mean" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["agent/num_turns/mean"] >= 1 for r in steps)
