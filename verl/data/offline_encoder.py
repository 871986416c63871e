"""Rows of the offline trainers as token ids and a loss mask: :class:`Encoder` renders prompts, responses
and conversations with the tokenizer's chat template (or without one) and marks the tokens the loss
trains on (see :mod:`verl.data.offline` for the row formats and the datasets built on it)."""

from __future__ import annotations

import logging
from typing import Any

from verl.data.chat import TURN_MARK, turn_end_ids
from verl.data.chat_rows import is_chat, text_messages
from verl.data.io import DataError

logger = logging.getLogger(__name__)


Encoded = tuple[list[int], list[int]]  # (token ids, loss mask)


# ------------------------------------------------------------------------------ tokenization
class Encoder:
    """Turns prompts, responses and conversations into ``(ids, loss_mask)`` for one tokenizer."""

    def __init__(self, tokenizer, *, max_length: int, truncation: str = "error", apply_chat_template: bool = True,
                 chat_template_kwargs: dict | None = None):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.truncation = truncation
        self.templated = apply_chat_template and tokenizer.chat_template is not None
        self.apply_chat_template = apply_chat_template
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._turn_tokens = None  # the texts that close an assistant turn (_turn_end), found on first use

    def _render(self, messages: list[dict], generation_prompt: bool, where: str, tools: list | None = None) -> str:
        extra = {"tools": tools} if tools else {}
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                      **extra, **self.chat_template_kwargs)
        except Exception as err:  # the template's own check (roles must alternate, ...) or a field it lacks
            raise DataError(f"{where}: the chat template cannot render this conversation ({type(err).__name__}: "
                            f"{err}); give the turns this template expects, or set model.custom_chat_template "
                            f"to a template that takes them") from None

    def _ids(self, text: str, special: bool = False) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def _ids_many(self, texts: list[str], special: bool = False) -> list[list[int]]:
        # One call for all texts: the fast tokenizer's per-call overhead dominates short rows.
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=special)["input_ids"]] if texts else []

    def _plain(self, value: Any, where: str) -> str:
        if isinstance(value, str):
            return value
        if self.apply_chat_template:  # messages, and the tokenizer has no template to render them
            raise DataError(f"{where}: chat messages need a chat template, and the tokenizer has none; use a "
                            f"tokenizer (model) with a chat template, set model.custom_chat_template, or set "
                            f"data.apply_chat_template=false to use the message contents as plain text")
        return "\n".join(str(m["content"]) for m in value)

    def _texts(self, prompt: Any, response: Any, where: str, rendered: dict) -> tuple[str, str]:
        """(prompt text, response text) as they will be tokenized; ``rendered`` caches prompt renderings."""
        prompt, response = _messages_or_text(prompt, where, "prompt"), _messages_or_text(response, where, "response")
        if isinstance(response, list) and response and response[0].get("role") in ("system", "user"):
            raise DataError(f"{where}: the response begins with a {response[0]['role']} turn, so it holds the "
                            f"conversation, prompt included, and the prompt would be rendered twice; give the "
                            f"assistant's answer alone (or, for SFT, the whole conversation with "
                            f"data.messages_key=<its column>)")
        if not self.templated:
            return self._plain(prompt, where), self._plain(response, where)
        prompt_msgs = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        response_msgs = response if isinstance(response, list) else [{"role": "assistant", "content": response}]
        key = repr(prompt_msgs)
        if key not in rendered:
            rendered[key] = self._render(prompt_msgs, True, where)
        prompt_text = rendered[key]
        full_text = self._render(prompt_msgs + response_msgs, False, where)
        if not full_text.startswith(prompt_text):
            raise DataError(f"{where}: the chat template does not render the prompt as the start of the whole "
                            f"conversation, so the response tokens cannot be told apart; set "
                            f"data.apply_chat_template=false or use a template without this behaviour")
        return prompt_text, full_text[len(prompt_text):]

    def prompt_response_many(self, rows: list[tuple[Any, Any, str]]) -> list[tuple[list[int], list[int]]]:
        """``(prompt ids, response ids)`` of each ``(prompt, response, where)``, before truncation. A
        prompt or response may be text or chat messages; ``where`` names the row in errors."""
        rendered: dict[str, str] = {}
        texts = [self._texts(prompt, response, where, rendered) for prompt, response, where in rows]
        _say_other_turns_in_responses(rows)
        prompts = self._ids_many([p for p, _ in texts], special=not self.templated)
        responses = self._ids_many([r for _, r in texts])
        eos = [] if self.templated else [self.tokenizer.eos_token_id]
        return [(p, r + eos) for p, r in zip(prompts, responses)]

    def conversation(self, messages: Any, where: str, tools: list | None = None) -> Encoded:
        """A whole conversation; the loss mask covers the assistant turns (with their end-of-turn tokens).
        ``tools``: tool schemas the chat template renders (into the system turn, as the rollout does)."""
        if not is_chat(messages):
            raise DataError(f"{where}: expected a list of {{role, content}} messages, got "
                            f"{type(messages).__name__}: {messages!r:.200}")
        if not self.templated:
            raise DataError(f"{where}: chat conversations need the tokenizer's chat template (data.apply_chat_template"
                            f"=true and a tokenizer that has one, or model.custom_chat_template)")
        messages = text_messages(messages, where)
        if not any(message.get("role") == "assistant" for message in messages):
            raise DataError(f"{where}: the conversation has no assistant turn, and the loss covers assistant turns "
                            f"only, so nothing in it would be trained on; end it with the answer as a "
                            f"{{role: assistant}} message, or drop the row")
        full = self._render(messages, False, where, tools)
        ids, mask, done = [], [], 0
        for k, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            start_text = self._render(messages[:k], True, where, tools) if k else \
                self._opening_header(messages, full, where, tools)
            end_text = self._render(messages[:k + 1], False, where, tools)
            start = len(start_text or "")
            end = None if start_text is None else len(end_text) if full.startswith(end_text) and \
                end_text.startswith(start_text) else \
                self._turn_end(full, start) if full.startswith(start_text) else None
            # A template that renders the last assistant turn otherwise than earlier ones (Qwen3's empty think
            # block): an earlier turn ends at the first end-of-turn token after its start in the whole text.
            if end is None or start < done:
                raise DataError(f"{where}: the chat template renders earlier turns differently once later turns "
                                f"follow, so assistant turn {k} cannot be located; use prompt/response columns "
                                f"(data.prompt_key / data.response_key) instead")
            for text, target in ((full[done:start], 0), (full[start:end], 1)):
                piece = self._ids(text) if text else []
                ids += piece
                mask += [target] * len(piece)
            done = end
        rest = self._ids(full[done:]) if done < len(full) else []
        return ids + rest, mask + [0] * len(rest)

    def _opening_header(self, messages: list[dict], full: str, where: str, tools: list | None) -> str | None:
        """What the whole text holds before the content of a conversation's first turn, an assistant's (a greeting):
        the template's bos, default system prompt and assistant header, none of them the assistant's to learn.
        Found by rendering the conversation with a marker for that content; None where the marker is not found."""
        marked = self._render([{**messages[0], "content": TURN_MARK}, *messages[1:]], False, where, tools)
        cut = marked.find(TURN_MARK)
        return marked[:cut] if cut >= 0 and full.startswith(marked[:cut]) else None

    def _turn_end(self, full: str, start: int) -> int | None:
        """Where the assistant turn starting at ``start`` of ``full`` ends: just after the first end-of-turn token
        (the chat template's, or the tokenizer's eos) that follows it, or None."""
        if self._turn_tokens is None:
            self._turn_tokens = {self.tokenizer.decode([i]) for i in turn_end_ids(self.tokenizer)} - {""}
        ends = [full.find(token, start) + len(token) for token in self._turn_tokens if full.find(token, start) >= 0]
        return min(ends, default=None)

    def fit(self, ids: list[int], mask: list[int], where: str, truncation: str | None = None) -> Encoded:
        """``(ids, mask)`` cut to ``max_length`` as ``truncation`` (default: the configured mode) says."""
        mode = truncation or self.truncation
        if len(ids) <= self.max_length:
            return ids, mask
        if mode == "error":
            raise DataError(f"{where} is {len(ids)} tokens long, over data.max_length={self.max_length}; raise "
                            f"data.max_length, or set data.truncation=left (cut the start of the prompt) or "
                            f"right (cut the end of the response)")
        if mode == "left":
            return ids[-self.max_length:], mask[-self.max_length:]
        return ids[:self.max_length], mask[:self.max_length]

    def join(self, prompt_ids: list[int], response_ids: list[int], where: str,
             truncation: str | None = None) -> Encoded:
        """Prompt then response, the loss mask on the response, cut to max_length (see :meth:`fit`)."""
        return self.fit(prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids), where, truncation)

    def examples(self, rows: list[tuple[Any, Any, str]]) -> list[Encoded]:
        """``(ids, loss_mask)`` of each ``(prompt, response, where)``."""
        return [self.join(p, r, where) for (p, r), (_, _, where) in zip(self.prompt_response_many(rows), rows)]

    def example(self, prompt: Any, response: Any, where: str) -> Encoded:
        return self.examples([(prompt, response, where)])[0]


def _messages_or_text(value: Any, where: str, what: str) -> str | list[dict]:
    if isinstance(value, str):
        return value
    if is_chat(value):
        return text_messages(value, where)
    raise DataError(f"{where}: the {what} must be a string or a list of {{role, content}} messages, got "
                    f"{type(value).__name__}: {value!r:.200}")


def _say_other_turns_in_responses(rows: list[tuple[Any, Any, str]]) -> None:
    """One warning for responses (messages) that hold turns other than the assistant's (a tool's result, a
    user's follow-up): every token of a response is trained on, theirs too, as TRL trains a completion; the
    messages format (data.messages_key: the whole conversation) trains the assistant's turns alone."""
    mixed = [where for _, response, where in rows
             if is_chat(response) and any(m.get("role") != "assistant" for m in response)]
    if mixed:
        logger.warning("%d response(s) hold turns other than the assistant's (first: %s): their tokens are trained "
                       "on as part of the response, as TRL trains a completion. For SFT, give each row as one "
                       "conversation (data.messages_key) to train the assistant's turns alone", len(mixed), mixed[0])
