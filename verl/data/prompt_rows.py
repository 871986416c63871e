"""What a row of RL prompt data holds, read without a tokenizer: its prompt (text, messages, or a conversation
whose last assistant turn is the answer), its ground truth wherever verl's and TRL's layouts put it, and what is
wrong with either (for :class:`verl.data.dataset.RLDataset`'s one-line errors); and how a prompt too long is cut."""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Mapping
from typing import Any


TRUNCATION_MODES = ("error", "left", "right", "middle")


def cut_prompt(ids: list[int], length: int, truncation: str) -> list[int]:
    """``ids`` cut to ``length`` tokens: its end kept ("left"), its start ("right"), or (``"middle"``, as
    verl cuts) its first ``length // 2`` tokens and its last ``length - length // 2``."""
    if len(ids) <= length:
        return ids
    if truncation == "left":
        return ids[-length:]
    if truncation == "middle":
        return ids[:length // 2] + ids[len(ids) - (length - length // 2):]
    return ids[:length]


def json_object(value: Any) -> Any:
    """A mapping written as JSON text (a CSV cell, a column json.dumps'd before writing) read as its
    object; any other value, and text that is not a JSON object, as it is."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def json_messages(prompt: Any) -> Any:
    """Chat messages written as JSON text (a CSV cell, a column json.dumps'd before writing) read as the
    messages: as text the model would be prompted with the JSON itself. Any other prompt as it is."""
    if isinstance(prompt, str) and prompt.lstrip().startswith("[{"):
        try:
            parsed = json.loads(prompt)
        except ValueError:
            return prompt
        if isinstance(parsed, list) and parsed and all(isinstance(m, dict) for m in parsed):
            return parsed
    return prompt


def _absent(value: Any) -> bool:
    """None, or NaN: how a gap in a number column reaches the rows (a JSON NaN, a pandas row dict)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def ground_truth_of(row: dict, reward_model_key: str = "reward_model") -> Any:
    """The reference answer: ``reward_model.ground_truth`` (the column ``reward_model_key`` names), else a
    ``ground_truth``, ``answer`` or ``solution`` column, else (conversational rows) the final assistant
    message. A ``reward_model`` written as JSON text (a CSV cell, a column json.dumps'd before writing) is
    read as its object. A NaN is no answer (None), as an empty cell is."""
    reward_model = json_object(row.get(reward_model_key))
    if isinstance(reward_model, dict) and not _absent(reward_model.get("ground_truth")):
        return reward_model["ground_truth"]
    for key in ("ground_truth", "answer", "solution"):
        if not _absent(row.get(key)):
            return row[key]
    messages = row.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict) \
            and messages[-1].get("role") == "assistant":
        return messages[-1].get("content")
    return None


# Keys a reward_model dict may hold the answer under by mistake: read nowhere, so the row had no ground truth.
ANSWER_KEYS = ("answer", "solution", "groundtruth", "ground_truths", "ground-truth", "gt", "target", "label")


def reward_model_problem(value: Any) -> str | None:
    """Why a row without a ground truth has none although its ``reward_model`` column holds one (None when it does
    not): the answer as the column's value itself, or under another key. A custom reward function got
    ground_truth=None for every such row, without a word."""
    value = json_object(value)
    if _absent(value):
        return None
    fix = "verl reads the answer from reward_model.ground_truth"
    if isinstance(value, Mapping):
        other = [k for k in value if str(k).lower() in ANSWER_KEYS and not _absent(value[k])]
        return (f"its reward_model holds {other[0]!r} and no 'ground_truth', and {fix}: rename the key to "
                f"ground_truth") if other else None
    return (f"its reward_model is {value!r:.60} (a {type(value).__name__}), not a dict, and {fix}: write "
            f"reward_model={{'ground_truth': {value!r:.30}}}, or give the answer as a ground_truth column")


def conversation_prompt(messages: list[dict]) -> list[dict]:
    """The prompt part of a ``messages`` conversation: everything before the final assistant turn(s)."""
    end = len(messages)
    while end > 0 and isinstance(messages[end - 1], dict) and messages[end - 1].get("role") == "assistant":
        end -= 1
    return list(messages[:end])


# Chat layouts other than {role, content}, by their keys, with the fix that makes them messages.
OTHER_MESSAGE_LAYOUTS = {("from", "value"): "ShareGPT's {from, value} turns: rename from -> role, value -> content "
                                           "(and the roles human -> user, gpt -> assistant)"}
OTHER_ROLE_NAMES = {"human": "user", "gpt": "assistant"}
CHAT_ROLES = ("system", "user", "assistant", "tool")


def message_problem(prompt: Any) -> str | None:
    """What keeps a list prompt from being chat messages (None when it is fine): no messages, a
    message without a text role or content (in parquet, a key some rows lack is null in the others),
    or ShareGPT's layout, which a chat template would fail on or render under a role the model never saw."""
    if not isinstance(prompt, list):
        return None
    if not prompt:
        return "the list holds no messages: give at least one {role: user, content: ...} message, or drop the row"
    for j, message in enumerate(prompt):
        if not isinstance(message, Mapping):
            return f"message {j} is a {type(message).__name__}, not a {{role, content}} dict"
        present = {k for k, v in message.items() if v is not None}
        for keys, fix in OTHER_MESSAGE_LAYOUTS.items():
            if set(keys) <= present and "content" not in present:
                return f"message {j} is in {fix}"
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or (content is None and not message.get("tool_calls")):
            missing = [k for k, v in (("role", role), ("content", content)) if v is None]
            return (f"message {j} has no {' or '.join(missing) or 'text role'} (its keys with values: "
                    f"{sorted(present)}); every message needs both")
        if role in OTHER_ROLE_NAMES:
            return f"message {j} has role {role!r}: chat templates know {OTHER_ROLE_NAMES[role]!r}; rename the role"
        if role != role.lower() and role.lower() in CHAT_ROLES:
            return (f"message {j} has role {role!r}: chat templates compare roles in lower case, so it would not "
                    f"render as {role.lower()!r}; write it as {role.lower()!r}")
        misspelt = role not in CHAT_ROLES and difflib.get_close_matches(role.lower(), CHAT_ROLES, n=1, cutoff=0.7)
        if misspelt:  # rendered under a role of its own, or dropped: a template's own roles (ipython) are not close
            return (f"message {j} has role {role!r}: a chat template renders it as a role of its own, or not at all; "
                    f"did you mean {misspelt[0]!r}?")
    return None


# The prompt settings RLDataset reads from a data config (``data.*``), with their defaults.
