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

from verl.data.chat_rows import blank_turn, is_chat, parting
from verl.data.collate import left_pad, position_ids_from_mask
from verl.data.prompt_rows import json_object
from verl.data.io import DataError
from verl.errors import first_few
from verl.data.loader import PromptLoader
from verl.data.offline_checks import keep_trained
from verl.data.offline_encoder import Encoded, Encoder
from verl.protocol import Batch

logger = logging.getLogger(__name__)

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
    return is_chat(value) and all(blank_turn(m) for m in value)


def _say_empty_responses(empty: list[int], total: int, response_key: str, source: str,
                         setting: str = "data.response_key", what: str = "an empty response",
                         refuse_all: bool = True) -> None:
    """Empty responses train the model to end its answer at once: all of them is a wrong column (refused), some
    are said once, with the rows."""
    if empty and len(empty) == total and refuse_all:
        raise DataError(f"every row of {source} has {what} (column {response_key!r}): the run would train the "
                        f"model to answer nothing; set {setting} to the column that holds the answers")
    if empty:
        logger.warning("%s: %d of %d rows have %s (row %s): they train the model to answer nothing; "
                       "fill them in or drop them", source, len(empty), total, what,
                       first_few(empty))


def _say_repeated_prompts(rows: list[tuple[Any, tuple]], columns: str, source: str) -> None:
    """Responses that begin with their own prompt's text (prompt + answer written in one column, as Anthropic HH's
    text is) show the model its prompt twice, the second time as the answer to learn. Every row so is refused,
    some are said once with the rows. Short prompts ("2=") are left alone: an answer may begin with them."""
    def text(value: Any) -> str:
        return (value if isinstance(value, str) else str(value[-1].get("content") or "") if is_chat(value) and value
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
                       first_few(repeated), fix)


class SFTDataset:
    """Supervised examples: prompt/response columns, or whole conversations (``messages_key``)."""

    def __init__(self, rows: list[dict], encoder: Encoder, *, prompt_key: str = "prompt",
                 response_key: str = "response", messages_key: str | None = None, source: str = "data.train_files",
                 prompt_dict_keys: Sequence[str] | None = None, response_dict_keys: Sequence[str] | None = None,
                 tools_key: str | None = None):
        if messages_key is not None:
            check_columns(rows, {messages_key: "data.messages_key"}, source)
            turns = [[m for m in row[messages_key] if m.get("role") == "assistant"] if is_chat(row[messages_key])
                     else [] for row in rows]
            if all(answers and all(map(blank_turn, answers)) for answers in turns):  # a wrong column: refused
                _say_empty_responses(list(range(len(rows))), len(rows), messages_key, source, "data.messages_key",
                                     "only empty assistant turns")
            _say_empty_responses([i for i, answers in enumerate(turns) if any(map(blank_turn, answers))], len(rows),
                                 messages_key, source, what="an empty assistant turn", refuse_all=False)
            self.items = [encoder.fit(*encoder.conversation(row[messages_key], f"row {i} of {source}",
                                                            row_tools(row, tools_key, f"row {i} of {source}")),
                                      f"row {i} of {source}") for i, row in enumerate(rows)]
            self.items = keep_trained(self.items, [(mask,) for _, mask in self.items], source, encoder.max_length,
                                      encoder.truncation)
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
        items = encoder.examples(examples)
        self.items = keep_trained(items, [(mask,) for _, mask in items], source, encoder.max_length, encoder.truncation)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        ids, mask = self.items[i]
        return {"input_ids": ids, "loss_mask": mask}


def _opening(chosen: Any, rejected: Any) -> int:
    """How many turns two whole conversations share before their answers differ; 0 unless both are messages
    that begin with the prompt's turns and go on with an assistant turn each."""
    if not (is_chat(chosen) and is_chat(rejected)) or not chosen or chosen[0].get("role") == "assistant":
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
        for i, row in enumerate(rows):
            why = parting(row.get(chosen_key), row.get(rejected_key))
            if why:
                raise DataError(f"row {i} of {source}: {why}; give both the same prompt turns followed by their "
                                f"answers, or the prompt in column {prompt_key!r} and the answers alone")
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
        items = [{"chosen": chosen, "rejected": rejected} for chosen, rejected in zip(encoded[::2], encoded[1::2])]
        self.items = keep_trained(items, [(it["chosen"][1], it["rejected"][1]) for it in items], source,
                                  encoder.max_length, encoder.truncation)
        same = [i for i, row in enumerate(rows) if row[chosen_key] == row[rejected_key]]
        if same and len(same) == len(rows):
            raise DataError(f"every row of {source} has the same chosen and rejected response (columns "
                            f"{chosen_key!r} and {rejected_key!r}): there is no preference to learn; set "
                            f"data.rejected_key to the column of the dispreferred responses")
        for side, key in ((0, chosen_key), (1, rejected_key)):
            _say_empty_responses([i for i, triple in enumerate(triples) if _blank(triple[1 + side])], len(rows),
                                 key, source, f"data.{('chosen', 'rejected')[side]}_key",
                                 f"an empty {('chosen', 'rejected')[side]} response")
        if same:  # their loss is constant: no gradient, yet they count in every average
            logger.warning("%s: %d of %d rows have the same chosen and rejected response (row %s): they carry no "
                           "preference, so DPO learns nothing from them; drop them or fix the rejected column",
                           source, len(same), len(rows), first_few(same))

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
        self.items = keep_trained(self.items, [(it["loss_mask"],) for it in self.items], source, encoder.max_length,
                                  encoder.truncation)

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
