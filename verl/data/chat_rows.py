"""Chat messages as the offline trainers' rows hold them, made into what a chat template renders.

Real datasets hold more than ``{"role", "content": str}``: OpenAI's content as a list of parts
(``[{"type": "text", "text": ...}]``), an assistant turn of tool calls with ``content`` null or
absent, ``tool`` turns. :func:`text_messages` gives each turn its content as one string, and refuses,
naming the row and the turn, what would otherwise crash inside the template or be trained as the
repr of a Python object: a null content (outside a turn of tool calls), a part that is not text.
"""

from __future__ import annotations

from typing import Any

from verl.data.io import DataError


def is_chat(value: Any) -> bool:
    """A conversation: a list of message dicts, each with a ``content`` (an assistant turn of tool calls
    may lack it, as OpenAI's format allows)."""
    return isinstance(value, list) and all(isinstance(m, dict) and ("content" in m or "tool_calls" in m)
                                           for m in value)


def _text(content: Any, message: dict, where: str, turn: int) -> str:
    role = message.get("role", "?")
    if isinstance(content, str):
        return content
    if content is None:
        if message.get("tool_calls"):  # an assistant turn that only calls tools: the template renders the calls
            return ""
        raise DataError(f"{where}: turn {turn} ({role}) has no content (null), so there is nothing to render or "
                        f"train for it; fill it in, or drop the turn or the row")
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise DataError(f"{where}: turn {turn} ({role}) has a content part of type {kind!r}; the offline "
                                f"trainers train on text: give text parts ({{type: text, text: ...}}) or a string")
        return "".join(texts)
    raise DataError(f"{where}: turn {turn} ({role}) has content of type {type(content).__name__} ({content!r:.60}); "
                    f"give a string or a list of text parts")


def text_messages(messages: list[dict], where: str) -> list[dict]:
    """``messages`` with each content one string (a list of text parts joined, a tool-call turn's null
    content ''); a copy, the rows are left as read."""
    return [{**m, "content": _text(m.get("content"), m, where, k)} for k, m in enumerate(messages)]



def blank_turn(message: dict) -> bool:
    """A turn with nothing in it to learn: no text (or only spaces) and no tool call."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p if isinstance(p, str) else str(p.get("text") or "") if isinstance(p, dict) else "x"
                          for p in content)
    text = "" if content is None else content if isinstance(content, str) else "x"
    return not text.strip() and not message.get("tool_calls")


def parting(chosen: Any, rejected: Any) -> str | None:
    """Why a chosen and a rejected conversation are not two answers to one prompt: they part before their
    assistant turns (different prompts), or one ends before it answers. None for a pair of answers, texts,
    or conversations that share their prompt turns."""
    if not (is_chat(chosen) and is_chat(rejected) and chosen and rejected) or chosen == rejected:
        return None
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    roles = [side[n].get("role") if n < len(side) else None for side in (chosen, rejected)]
    if roles == ["assistant", "assistant"]:
        return None
    if None in roles:
        short = "chosen" if roles[0] is None else "rejected"
        return f"the {short} conversation ends at turn {n}, before an answer of its own"
    return (f"the chosen and rejected conversations part at turn {n} ({roles[0]} against {roles[1]}), before their "
            f"answers, so they answer different prompts")
