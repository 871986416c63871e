"""Datasets of the offline trainers: supervised examples, preference pairs, KTO examples.

Every row becomes token ids and a ``loss_mask`` of the same length: ``loss_mask[t] = 1`` when
token t is a target of the loss (a response token, or a token of an assistant turn). Rows are
tokenized when the dataset is built, so a missing column or an over-long row fails before training.

Row formats (TRL's column names; every key can be renamed in the config)::

    SFT         {"prompt": [{"role": "user", "content": "2+3="}] or "2+3=", "response": "5"}
    SFT chat    {"messages": [{"role": "user", ...}, {"role": "assistant", ...}, ...]}
    DPO         {"prompt": ..., "chosen": "5", "rejected": "6"}
    KTO         {"prompt": ..., "completion": "5", "label": true}

With a chat template the prompt is rendered with ``add_generation_prompt=True`` and the response
is the rest of the rendered conversation (so it ends with the template's end-of-turn tokens).
Without one (``apply_chat_template=false`` or a tokenizer without a template) the ids are
``tokenize(prompt)`` then ``tokenize(response) + [eos]``.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from verl.data.chat import turn_end_ids
from verl.data.collate import left_pad, position_ids_from_mask
from verl.data.dataset import json_object
from verl.data.io import DataError, is_messages
from verl.data.loader import PromptLoader
from verl.protocol import Batch

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

    def _render(self, messages: list[dict], generation_prompt: bool, tools: list | None = None) -> str:
        extra = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                  **extra, **self.chat_template_kwargs)

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
                            f"tokenizer (model) with a chat template, or set data.apply_chat_template=false to "
                            f"use the message contents as plain text")
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
            rendered[key] = self._render(prompt_msgs, True)
        prompt_text = rendered[key]
        full_text = self._render(prompt_msgs + response_msgs, False)
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
        prompts = self._ids_many([p for p, _ in texts], special=not self.templated)
        responses = self._ids_many([r for _, r in texts])
        eos = [] if self.templated else [self.tokenizer.eos_token_id]
        return [(p, r + eos) for p, r in zip(prompts, responses)]

    def conversation(self, messages: Any, where: str, tools: list | None = None) -> Encoded:
        """A whole conversation; the loss mask covers the assistant turns (with their end-of-turn tokens).
        ``tools``: tool schemas the chat template renders (into the system turn, as the rollout does)."""
        if not is_messages(messages):
            raise DataError(f"{where}: expected a list of {{role, content}} messages, got "
                            f"{type(messages).__name__}: {messages!r:.200}")
        if not self.templated:
            raise DataError(f"{where}: chat conversations need the tokenizer's chat template (data.apply_chat_template"
                            f"=true and a tokenizer that has one)")
        if not any(message.get("role") == "assistant" for message in messages):
            raise DataError(f"{where}: the conversation has no assistant turn, and the loss covers assistant turns "
                            f"only, so nothing in it would be trained on; end it with the answer as a "
                            f"{{role: assistant}} message, or drop the row")
        full = self._render(messages, False, tools)
        ids, mask, done = [], [], 0
        for k, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            start_text = self._render(messages[:k], True, tools) if k else ""
            end_text = self._render(messages[:k + 1], False, tools)
            start = len(start_text)
            end = len(end_text) if full.startswith(end_text) and end_text.startswith(start_text) else \
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
    if isinstance(value, str) or is_messages(value):
        return value
    raise DataError(f"{where}: the {what} must be a string or a list of {{role, content}} messages, got "
                    f"{type(value).__name__}: {value!r:.200}")


def check_columns(rows: list[dict], needed: dict[str, str], source: str, extra_hint: str = "") -> None:
    """Every row has the columns ``needed`` maps to their config keys; else one error naming them all."""
    if not rows:
        raise DataError(f"{source} holds no rows")
    for i, row in enumerate(rows):
        empty = [col for col in needed if col in row and row[col] is None]
        if empty:  # the column is there, this row has no value in it: say so, not "lacks the column"
            raise DataError(f"row {i} of {source} has no value (null) in {', '.join(repr(c) for c in empty)}; fill "
                            f"it in or drop the row{extra_hint}")
        missing = [(col, key) for col, key in needed.items() if row.get(col) is None]
        if missing:
            found = ", ".join(row) or "none"
            if len(missing) == 1:
                (col, key), = missing
                what = f"the column {col!r} (columns found: {found}); set {key} to the column that holds it"
            else:
                cols = ", ".join(repr(c) for c, _ in missing)
                keys = " / ".join(key for _, key in missing)
                what = f"the columns {cols} (columns found: {found}); set {keys} to the columns that hold them"
            raise DataError(f"row {i} of {source} lacks {what}{extra_hint}")


def inside(value: Any, keys: Sequence[str] | None, where: str, what: str) -> Any:
    """``value[k1][k2]...`` for verl's ``data.{prompt,response}_dict_keys`` (a column holding a dict, such as
    the extra_info of verl's gsm8k parquet); ``value`` itself without keys."""
    for depth, key in enumerate(keys or ()):
        value = json_object(value)
        if not isinstance(value, Mapping) or key not in value:
            setting = f"data.{what}_dict_keys={list(keys)}"
            found = f"its keys: {sorted(value)}" if isinstance(value, Mapping) else f"a {type(value).__name__}"
            raise DataError(f"{where}: {setting} reads {key!r} at depth {depth + 1} of the {what} column, which holds "
                            f"{found}; name keys the column's dict has, or leave {setting.split('=')[0]} null")
        value = value[key]
    return value


# ------------------------------------------------------------------------------ datasets
def row_tools(row: dict, tools_key: str | None, where: str) -> list | None:
    """The tool schemas of a conversation row (``tools_key``'s column: a list of schemas, or that
    list as JSON text, as verl's multi-turn SFT files hold them); None where the row has none."""
    value = row.get(tools_key) if tools_key else None
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else None
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: column {tools_key!r} is not a JSON list of tool schemas ({err})") from None
    if value is None or value == []:
        return None
    if not isinstance(value, list) or not all(isinstance(tool, dict) for tool in value):
        raise DataError(f"{where}: column {tools_key!r} should hold a list of tool schemas (dicts), got "
                        f"{type(value).__name__}: {value!r:.200}")
    return value


def _blank(value: Any) -> bool:
    """A response with no text: '' (or spaces), or messages whose contents are all empty."""
    if isinstance(value, str):
        return not value.strip()
    return is_messages(value) and not any(str(m.get("content") or "").strip() for m in value)


def _say_empty_responses(empty: list[int], total: int, response_key: str, source: str) -> None:
    """Empty responses train the model to end its answer at once: all of them is a wrong column (refused), some
    are said once, with the rows."""
    if empty and len(empty) == total:
        raise DataError(f"every response of {source} is empty (column {response_key!r}): the run would train the "
                        f"model to answer nothing; set data.response_key to the column that holds the answers")
    if empty:
        logger.warning("%s: %d of %d rows have an empty response (row %s): they train the model to answer nothing; "
                       "fill them in or drop them", source, len(empty), total,
                       ", ".join(map(str, empty[:5])) + (", ..." if len(empty) > 5 else ""))


def _say_repeated_prompts(rows: list[tuple[Any, tuple]], columns: str, source: str) -> None:
    """Responses that begin with their own prompt's text (prompt + answer written in one column, as Anthropic HH's
    text is) show the model its prompt twice, the second time as the answer to learn. Every row so is refused,
    some are said once with the rows. Short prompts ("2=") are left alone: an answer may begin with them."""
    def text(value: Any) -> str:
        return (value if isinstance(value, str) else str(value[-1].get("content") or "") if is_messages(value) and value
                else "").strip()
    repeated = [i for i, (prompt, responses) in enumerate(rows) if len(text(prompt)) >= 4
                and all(isinstance(r, str) and r.strip().startswith(text(prompt)) for r in responses)]
    fix = f"give {columns} without the prompt (the text after it)"
    if repeated and len(repeated) == len(rows):
        raise DataError(f"every row of {source} repeats its prompt at the start of {columns} (row 0: "
                        f"{rows[0][1][0]!r:.60}): the model would be shown the prompt twice and trained to answer "
                        f"with it; {fix}")
    if repeated:
        logger.warning("%s: %d of %d rows repeat their prompt at the start of %s (row %s): the prompt is trained on "
                       "as part of the answer; %s", source, len(repeated), len(rows), columns,
                       ", ".join(map(str, repeated[:5])) + (", ..." if len(repeated) > 5 else ""), fix)


class SFTDataset:
    """Supervised examples: prompt/response columns, or whole conversations (``messages_key``)."""

    def __init__(self, rows: list[dict], encoder: Encoder, *, prompt_key: str = "prompt",
                 response_key: str = "response", messages_key: str | None = None, source: str = "data.train_files",
                 prompt_dict_keys: Sequence[str] | None = None, response_dict_keys: Sequence[str] | None = None,
                 tools_key: str | None = None):
        if messages_key is not None:
            check_columns(rows, {messages_key: "data.messages_key"}, source)
            self.items = [encoder.fit(*encoder.conversation(row[messages_key], f"row {i} of {source}",
                                                            row_tools(row, tools_key, f"row {i} of {source}")),
                                      f"row {i} of {source}") for i, row in enumerate(rows)]
            return
        hint = ", or data.messages_key=messages for chat conversations" if rows and "messages" in rows[0] else ""
        check_columns(rows, {prompt_key: "data.prompt_key", response_key: "data.response_key"}, source, hint)
        examples = [(inside(row[prompt_key], prompt_dict_keys, f"row {i} of {source}", "prompt"),
                     inside(row[response_key], response_dict_keys, f"row {i} of {source}", "response"),
                     f"row {i} of {source}") for i, row in enumerate(rows)]
        _say_empty_responses([i for i, (_, response, _) in enumerate(examples) if _blank(response)], len(rows),
                             response_key, source)
        _say_repeated_prompts([(prompt, (response,)) for prompt, response, _ in examples], f"column {response_key!r}",
                              source)
        self.items = encoder.examples(examples)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        ids, mask = self.items[i]
        return {"input_ids": ids, "loss_mask": mask}


def _opening(chosen: Any, rejected: Any) -> int:
    """How many turns two whole conversations share before their answers differ; 0 unless both are messages
    that begin with the prompt's turns and go on with an assistant turn each."""
    if not (is_messages(chosen) and is_messages(rejected)) or not chosen or chosen[0].get("role") == "assistant":
        return 0
    n = 0
    while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
        n += 1
    both_answer = chosen[n].get("role") == rejected[n].get("role") == "assistant"
    return n if n and both_answer and chosen[:n] == rejected[:n] else 0


def split_prompt(prompt: Any, chosen: Any, rejected: Any) -> tuple[Any, Any, Any]:
    """``(prompt, chosen, rejected)`` with the responses alone. TRL's layouts where the responses are whole
    conversations (HuggingFaceH4/ultrafeedback_binarized, whose prompt column is the question as text too;
    Anthropic HH, without one): the turns both begin with are the prompt, as TRL's ``maybe_extract_prompt``
    takes them. Before, the prompt was rendered twice and the row refused as a chat template problem."""
    n = _opening(chosen, rejected)
    return (chosen[:n], chosen[n:], rejected[n:]) if n else (prompt, chosen, rejected)


class PreferenceDataset:
    """Preference pairs: one prompt, a chosen and a rejected response."""

    def __init__(self, rows: list[dict], encoder: Encoder, *, prompt_key: str = "prompt", chosen_key: str = "chosen",
                 rejected_key: str = "rejected", source: str = "data.train_files"):
        implicit = bool(rows) and prompt_key not in rows[0] and _opening(rows[0].get(chosen_key),
                                                                         rows[0].get(rejected_key)) > 0
        check_columns(rows, {**({} if implicit else {prompt_key: "data.prompt_key"}), chosen_key: "data.chosen_key",
                             rejected_key: "data.rejected_key"}, source)
        triples = [split_prompt(row.get(prompt_key), row[chosen_key], row[rejected_key]) for row in rows]
        _say_repeated_prompts([(prompt, (chosen, rejected)) for prompt, chosen, rejected in triples],
                              f"columns {chosen_key!r} and {rejected_key!r}", source)
        encoded = encoder.examples([(prompt, response, f"row {i} of {source} ({side})")
                                    for i, (prompt, *responses) in enumerate(triples)
                                    for response, side in zip(responses, ("chosen", "rejected"))])
        self.items = [{"chosen": chosen, "rejected": rejected} for chosen, rejected in zip(encoded[::2], encoded[1::2])]
        same = [i for i, row in enumerate(rows) if row[chosen_key] == row[rejected_key]]
        if same:  # their loss is constant: no gradient, yet they count in every average
            logger.warning("%s: %d of %d rows have the same chosen and rejected response (row %s): they carry no "
                           "preference, so DPO learns nothing from them; drop them or fix the rejected column",
                           source, len(same), len(rows), ", ".join(map(str, same[:5])) + (", ..." if len(same) > 5 else ""))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


# A label as text (a CSV cell is always text; JSON written by hand): read as the bool it spells.
TEXT_LABELS = {"true": True, "false": False, "1": True, "0": False}


def _label(value: Any, where: str, label_key: str) -> bool:
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TEXT_LABELS:
        return TEXT_LABELS[value.strip().lower()]
    raise DataError(f"{where}: label {value!r} in column {label_key!r} must be true (desirable) or false "
                    f"(undesirable): a bool, 1 / 0, or that text")


class KTODataset:
    """Unpaired examples with a desirable / undesirable label."""

    def __init__(self, rows: list[dict], encoder: Encoder, *, prompt_key: str = "prompt",
                 completion_key: str = "completion", label_key: str = "label", source: str = "data.train_files"):
        check_columns(rows, {prompt_key: "data.prompt_key", completion_key: "data.completion_key",
                             label_key: "data.label_key"}, source)
        labels = [_label(row[label_key], f"row {i} of {source}", label_key) for i, row in enumerate(rows)]
        _say_repeated_prompts([(row[prompt_key], (row[completion_key],)) for row in rows],
                              f"column {completion_key!r}", source)
        wheres = [f"row {i} of {source}" for i in range(len(rows))]
        split = encoder.prompt_response_many([(row[prompt_key], row[completion_key], where)
                                              for row, where in zip(rows, wheres)])
        self.items = []
        for label, where, (prompt_ids, completion_ids) in zip(labels, wheres, split):
            ids, mask = encoder.join(prompt_ids, completion_ids, where)
            self.items.append({"prompt_ids": prompt_ids, "completion_ids": completion_ids, "input_ids": ids,
                               "loss_mask": mask, "label": label})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


# ------------------------------------------------------------------------------ collation
def _sequences(encoded: list[Encoded], pad_token_id: int, prefix: str = "") -> dict[str, torch.Tensor]:
    """Left-padded ``input_ids``, ``attention_mask``, ``position_ids``, ``loss_mask`` ``[B, T]``."""
    input_ids, attention_mask = left_pad([ids for ids, _ in encoded], pad_token_id)
    loss_mask, _ = left_pad([mask for _, mask in encoded], 0)
    return {f"{prefix}input_ids": input_ids, f"{prefix}attention_mask": attention_mask,
            f"{prefix}position_ids": position_ids_from_mask(attention_mask), f"{prefix}loss_mask": loss_mask}


def collate_sft(items: list[dict], pad_token_id: int) -> Batch:
    """``input_ids``, ``attention_mask``, ``position_ids``, ``loss_mask``: ``[B, T]``, left-padded."""
    return Batch(_sequences([(it["input_ids"], it["loss_mask"]) for it in items], pad_token_id))


def collate_pairs(items: list[dict], pad_token_id: int) -> Batch:
    """``chosen_*`` and ``rejected_*`` (the four fields of :func:`collate_sft`), all ``[B, T]`` with
    one width T, so both halves can run through the model as one ``[2B, T]`` batch."""
    both = _sequences([it["chosen"] for it in items] + [it["rejected"] for it in items], pad_token_id)
    n = len(items)
    out = {f"chosen_{k}": v[:n] for k, v in both.items()}
    out.update({f"rejected_{k}": v[n:] for k, v in both.items()})
    return Batch(out)


def _mismatched_partner(items: list[dict], i: int) -> int:
    """The next row (cyclically) whose prompt differs from row i's; i + 1 when all prompts are equal."""
    n = len(items)
    for j in range(i + 1, i + n):
        if items[j % n]["prompt_ids"] != items[i]["prompt_ids"]:
            return j % n
    return (i + 1) % n


def collate_kto(items: list[dict], pad_token_id: int, encoder: Encoder) -> Batch:
    """The fields of :func:`collate_sft`, ``label`` ``[B]`` bool, and ``kl_*``: row i's prompt with the
    completion of the next row that has another prompt: the mismatched pairs KTO's reference point is
    estimated on. A KL pair longer than max_length is cut as data.truncation says (the end of the
    completion when it is error)."""
    batch = _sequences([(it["input_ids"], it["loss_mask"]) for it in items], pad_token_id)
    batch["label"] = torch.tensor([it["label"] for it in items], dtype=torch.bool)
    mode = "right" if encoder.truncation == "error" else encoder.truncation
    kl = []
    for i, item in enumerate(items):
        kl.append(encoder.join(item["prompt_ids"], items[_mismatched_partner(items, i)]["completion_ids"],
                               "KL pair", mode))
    batch.update(_sequences(kl, pad_token_id, prefix="kl_"))
    return Batch(batch)


def BatchLoader(dataset, batch_size: int, collate: Callable[[list[dict]], Batch], *, shuffle: bool = True,
                seed: int = 1, replacement: bool = False) -> PromptLoader:
    """The offline trainers' loader: :class:`~verl.data.loader.PromptLoader` over ``collate``'s batches
    (epoch e's order drawn from ``seed + e``, resumable, a last incomplete batch dropped; with
    ``replacement``, every batch drawn from all rows anew)."""
    return PromptLoader(dataset, batch_size, collate=collate, shuffle=shuffle, seed=seed, unit="rows",
                        size_key="data.train_batch_size", data_key="data.train_files", replacement=replacement)


# ------------------------------------------------------------------------------ built-in data
def wrong_sum(a: int, b: int, rng: random.Random) -> str:
    """A wrong answer to ``a+b=``: the sum with its digits reversed (``85`` -> ``58``), or, where that
    reads the same (``55``, ``121``), the sum off by 10 either way."""
    right = a + b
    swapped = int(str(right)[::-1])
    return str(swapped if swapped != right else right + rng.choice((10, -10)))


def addition_rows(kind: str, split: str = "train", n: int | None = None, seed: int = 0) -> list[dict]:
    """Rows of the built-in addition task for an offline trainer: ``kind`` is ``sft`` (prompt,
    response), ``preference`` (prompt, chosen = the sum, rejected = a wrong sum) or ``kto`` (two rows
    per prompt: the sum labelled true and a wrong sum labelled false)."""
    from verl.data.tasks import addition

    rng = random.Random(seed)
    rows = []
    for row in addition.make_rows(split, n, seed):
        a, b, prompt = row["extra_info"]["a"], row["extra_info"]["b"], row["prompt"]
        right = str(a + b)
        if kind == "sft":
            rows.append({"prompt": prompt, "response": right})
        elif kind == "preference":
            rows.append({"prompt": prompt, "chosen": right, "rejected": wrong_sum(a, b, rng)})
        elif kind == "kto":
            rows.append({"prompt": prompt, "completion": right, "label": True})
            rows.append({"prompt": prompt, "completion": wrong_sum(a, b, rng), "label": False})
        else:
            raise ValueError(f"unknown kind {kind!r}; choose sft, preference or kto")
    return rows
