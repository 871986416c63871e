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
    _OPEN, _CLOSE = "<tool_call>", "</tool_call>"

    def _bodies(self, text: str) -> list[tuple[str, object, tuple[int, int]]]:
        """Each call's text, its JSON (or the error that kept it from parsing) and where it stands, tags
        included. A call ends at the first ``</tool_call>`` before which its text is JSON, so one that quotes
        the tags in a string ends where the model closed it; with none such, at the first (with its error)."""
        found, at = [], 0
        while (opened := text.find(self._OPEN, at)) >= 0:
            start = opened + len(self._OPEN)
            end = text.find(self._CLOSE, start)
            if end < 0:
                break
            first, parsed = end, None
            while end >= 0:
                parsed = _loads(text[start:end].strip())
                if not isinstance(parsed, Exception):
                    break
                end = text.find(self._CLOSE, end + len(self._CLOSE))
            if end < 0:  # no end makes it JSON: the first end, and its error
                end, parsed = first, _loads(text[start:first].strip())
            at = end + len(self._CLOSE)
            found.append((text[start:end].strip(), parsed, (opened, at)))
        return found

    def parse(self, text: str) -> ParsedTurn:
        calls, errors, spans = [], [], []
        for body, call, span in self._bodies(text):
            spans.append(span)
            if isinstance(call, Exception):
                reason = call.msg if isinstance(call, json.JSONDecodeError) else "nested too deeply"
                errors.append(f"the tool call is not JSON ({reason}): {body[:200]}")
                continue
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                errors.append(f"a tool call needs a \"name\": {body.strip()[:200]}")
                continue
            arguments = call.get("arguments", {})
            calls.append(OpenAIFunctionParsedSchema(
                name=call["name"], arguments=arguments if isinstance(arguments, str) else json.dumps(arguments)))
        content, at = "", 0
        for opened, closed in spans:
            content, at = content + text[at:opened], closed
        return ParsedTurn(content=(content + text[at:]).strip(), calls=calls, errors=errors)


def _loads(text: str):
    """``json.loads(text)``, or the error: a JSONDecodeError, or a RecursionError for brackets nested past
    Python's recursion limit (a model stuck repeating "[" writes them)."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        return e


TOOL_PARSERS = {"hermes": HermesToolParser}


def tool_parser(name: str):
    if name not in TOOL_PARSERS:
        from verl.errors import VerlError

        raise VerlError(f"actor_rollout_ref.rollout.multi_turn.format={name!r}: no such tool-call format; "
                        f"formats: {', '.join(TOOL_PARSERS)}")
    return TOOL_PARSERS[name]()
