"""Finding tool calls in what the model wrote. The parser is picked by name
(``actor_rollout_ref.rollout.multi_turn.format``); add one to :data:`TOOL_PARSERS`.

``hermes`` (Qwen2/2.5/3, Hermes, and most tool-tuned open models)::

    Let me compute it.
    <tool_call>
    {"name": "calculator", "arguments": {"expression": "123*45"}}
    </tool_call>
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from verl.tools.schemas import OpenAIFunctionParsedSchema


@dataclass
class ParsedTurn:
    """An assistant turn: its text outside the calls, the calls, and the calls that did not parse."""

    content: str
    calls: list[OpenAIFunctionParsedSchema] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class HermesToolParser:
    name = "hermes"
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text: str) -> ParsedTurn:
        calls, errors = [], []
        for body in self._CALL.findall(text):
            try:
                call = json.loads(body.strip())
            except json.JSONDecodeError as e:
                errors.append(f"the tool call is not JSON ({e.msg}): {body.strip()[:200]}")
                continue
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                errors.append(f"a tool call needs a \"name\": {body.strip()[:200]}")
                continue
            arguments = call.get("arguments", {})
            calls.append(OpenAIFunctionParsedSchema(
                name=call["name"], arguments=arguments if isinstance(arguments, str) else json.dumps(arguments)))
        content = self._CALL.sub("", text).strip()
        return ParsedTurn(content=content, calls=calls, errors=errors)


TOOL_PARSERS = {"hermes": HermesToolParser}


def tool_parser(name: str):
    if name not in TOOL_PARSERS:
        from verl.errors import VerlError

        raise VerlError(f"actor_rollout_ref.rollout.multi_turn.format={name!r}: no such tool-call format; "
                        f"formats: {', '.join(TOOL_PARSERS)}")
    return TOOL_PARSERS[name]()
