"""Prompt datasets for RL: rows in verl's layout, tokenized once at construction.

A row looks like::

    {"prompt": [{"role": "user", "content": "What is 2+3?"}],   # or a plain string
     "data_source": "arith_add",
     "reward_model": {"ground_truth": "5", "style": "rule"},     # or a ground_truth / answer / solution column
     "extra_info": {"split": "train", ...}}

TRL's layouts work too: ``prompt`` as plain text or messages, or a ``messages`` conversation whose
final assistant turn is the reference answer (the prompt is the conversation before it). Files may
be Hugging Face dataset folders or hub names (see :mod:`verl.data.hf`).

All prompts are tokenized when the dataset is built, so an over-long prompt (or a missing column,
or a tokenizer without a chat template) fails before training starts, not hours into it.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Mapping
from typing import Any, Sequence

from torch.utils.data import Dataset

from verl.data.io import DataError, is_messages, read_rows, subset_positions
from verl.data.prompt_rows import (TRUNCATION_MODES, conversation_prompt, cut_prompt, ground_truth_of, json_messages,
                                   json_object, message_problem, reward_model_problem)

logger = logging.getLogger(__name__)

SETTING_DEFAULTS = {"prompt_key": "prompt", "max_prompt_length": 512, "truncation": "error",
                    "filter_overlong_prompts": False, "apply_chat_template": True, "chat_template_kwargs": None,
                    "image_key": "images", "video_key": "videos", "mm_processor_kwargs": None,
                    "reward_fn_key": "data_source", "shuffle": False, "seed": None}


# verl's columns of images and videos (data.image_key / data.video_key): read with a vision-language
# processor (verl.data.vision), refused without one.
MEDIA_COLUMNS = ("images", "videos", "image", "video")


def _refuse_media(rows: list[dict], config_key: str) -> None:
    """A dataset with images or videos is for a vision-language model; training a text model on its
    prompts without the pictures would run, and learn the wrong task, so it is refused."""
    for i, row in enumerate(rows):
        for column in MEDIA_COLUMNS:
            value = row.get(column)
            if value is not None and (not hasattr(value, "__len__") or len(value) > 0):
                raise DataError(f"row {i} of `{config_key}` has {column} (column {column!r}), and the policy is a text "
                                f"model: the prompts would reach it without them. Images are read with a "
                                f"vision-language policy (Qwen2-VL, Qwen2.5-VL: docs/vision.md); use one, or drop "
                                f"the {column!r} column if the prompts stand on their own")


def _setting(config: Any, name: str) -> Any:
    if config is None:
        return SETTING_DEFAULTS[name]
    if isinstance(config, Mapping):  # a plain dict, or an OmegaConf DictConfig: typed as the data section types it
        key = "apply_chat_template_kwargs" if name == "chat_template_kwargs" and name not in config else name
        return _typed(name, config.get(key, SETTING_DEFAULTS.get(name)), f"data.{key}")
    return getattr(config, name)  # this project's DataConfig (checked when it was set)


def _typed(name: str, value: Any, key: str, prefix: str = "") -> Any:
    """``value`` for the data section's setting ``name``, checked against its type there (``key`` names it in
    the error). Before, ``max_prompt_length="512"`` failed with "'<' not supported between instances of 'str'
    and 'int'", and ``filter_overlong_prompts="false"`` (text: true) silently dropped the long prompts."""
    if value is None and SETTING_DEFAULTS.get(name) is None:
        return None
    import typing

    from verl.config.coerce import coerce
    from verl.config.schema import DataConfig

    try:
        return coerce(value, typing.get_type_hints(DataConfig)[name], key)
    except ValueError as e:
        raise DataError(f"{prefix}{e}") from None


class RLDataset(Dataset):
    """Prompts (with ground truth and data source) read from parquet / jsonl files.

    Built two ways: with the settings as keywords (``RLDataset(data_files, tokenizer, max_prompt_length=64)``),
    or the way verl builds its ``RLHFDataset`` and a ``data.custom_cls`` class,
    ``RLDataset(data_files=..., tokenizer=..., processor=None, config=<the data section>)``, which reads
    the settings from ``config`` (a keyword given as well wins). To change how prompts are made,
    subclass it and override :meth:`prompt_of` (the prompt of a row, tokenized at construction) or
    ``__getitem__`` (the item handed to the trainer); see docs/data.md.

    Args:
        data_files: one path or a list of paths (.parquet, .jsonl, .json); lists are concatenated.
        tokenizer: a Hugging Face tokenizer.
        config: the data section (``TrainerConfig.data``, or a dict with its keys) to read the
            settings below from; None = their defaults.
        processor: a vision-language model's processor (:func:`verl.models.vision.load_processor`): rows
            with images (``data.image_key``, ``<image>`` in the prompt) are rendered with them and their
            items carry ``multi_modal_inputs`` / ``multi_modal_data`` (:mod:`verl.data.vision`); None: a
            dataset with images is refused.
        max_samples: keep at most this many rows (``data.train_max_samples`` / ``val_max_samples``), as verl
            picks them: a random subset drawn with ``config.seed`` when ``config.shuffle``, else the first
            ones (kept in file order either way); -1 or 0 = all. ``sample_seed`` draws it when
            ``config.seed`` is null (the trainer passes trainer.seed, as for the shuffling).

    Keyword-only settings; each left out (None) takes ``config``'s value, else ``SETTING_DEFAULTS``'s:
        prompt_key: the column that holds the prompt (chat messages or a plain string).
        max_prompt_length: the longest prompt allowed, in tokens (after the chat template).
        truncation: what to do with a longer prompt: "error", or cut tokens on the "left" / "right", or
            out of the "middle" (its first and last halves of max_prompt_length kept, as verl does).
        filter_overlong_prompts: drop longer prompts instead (``num_filtered`` counts them).
        apply_chat_template: render message lists with the tokenizer's chat template (with the
            generation prompt). When false, the text is tokenized as is (message contents are
            joined with newlines) and the tokenizer's usual special tokens are added.
        chat_template_kwargs: passed to ``apply_chat_template`` (e.g. ``{"enable_thinking": False}``).
        config_key: the setting the files came from, named in errors (``data.val_files`` for validation).
    """

    def __init__(self, data_files: str | os.PathLike | Sequence[str | os.PathLike], tokenizer, config: Any = None,
                 processor: Any = None, max_samples: int = -1, *, prompt_key: str | None = None,
                 max_prompt_length: int | None = None, truncation: str | None = None,
                 filter_overlong_prompts: bool | None = None, apply_chat_template: bool | None = None,
                 chat_template_kwargs: dict | None = None, config_key: str = "data.train_files",
                 sample_seed: int | None = None):
        # A keyword given here wins over config, which wins over the default.
        def setting(name: str, given: Any) -> Any:
            return _setting(config, name) if given is None else _typed(name, given, name, "RLDataset: ")

        prompt_key = setting("prompt_key", prompt_key)
        max_prompt_length = setting("max_prompt_length", max_prompt_length)
        truncation = setting("truncation", truncation)
        filter_overlong_prompts = setting("filter_overlong_prompts", filter_overlong_prompts)
        apply_chat_template = setting("apply_chat_template", apply_chat_template)
        chat_template_kwargs = setting("chat_template_kwargs", chat_template_kwargs)
        max_samples = _typed("train_max_samples", max_samples, "max_samples", "RLDataset: ")
        sample_seed = _typed("seed", sample_seed, "sample_seed", "RLDataset: ")
        self.config = config
        self.processor = processor
        self.vision = None
        if processor is not None:
            from verl.data.vision import VisionPrompts

            self.vision = VisionPrompts(processor, image_key=_setting(config, "image_key"),
                                        video_key=_setting(config, "video_key"),
                                        processor_kwargs=_setting(config, "mm_processor_kwargs"))
        if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
            raise DataError(f"RLDataset needs a loaded tokenizer as its second argument, got {tokenizer!r}; load it "
                            f"first: tokenizer = verl.models.loading.load_tokenizer(model_path) (or transformers' "
                            f"AutoTokenizer.from_pretrained(model_path)), then RLDataset(files, tokenizer)")
        if truncation not in TRUNCATION_MODES:
            raise DataError(f"data.truncation={truncation!r} is not one of {TRUNCATION_MODES}")
        if max_prompt_length < 1:
            raise DataError(f"data.max_prompt_length must be >= 1, got {max_prompt_length}")
        self.tokenizer = tokenizer
        self.prompt_key = prompt_key
        self.max_prompt_length = max_prompt_length
        self.apply_chat_template = apply_chat_template
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        # data.reward_fn_key: the column whose value the reward function gets as data_source (verl's key).
        self.reward_fn_key = _setting(config, "reward_fn_key")

        rows = read_rows(data_files, config_key=config_key)
        if not rows:
            raise DataError(f"the files in `{config_key}` hold no rows: {data_files}")
        seed = _setting(config, "seed")
        self._positions = subset_positions(len(rows), max_samples, _setting(config, "shuffle"),
                                           sample_seed if seed is None else seed)
        if len(self._positions) < len(rows):
            rows = [rows[k] for k in self._positions]
        if self.vision is None:
            _refuse_media(rows, config_key)
        try:
            self._build(rows, config_key, max_prompt_length, truncation, filter_overlong_prompts)
        except DataError as e:  # a row's problem names the setting its file came from (train or val)
            raise DataError(f"{config_key}: {e}") from e

    def _build(self, rows: list[dict], config_key: str, max_prompt_length: int, truncation: str,
               filter_overlong_prompts: bool) -> None:
        prompt_key = self.prompt_key
        if self.reward_fn_key != "data_source":
            for i, row in enumerate(rows):
                if row.get(self.reward_fn_key) is None:
                    raise DataError(f"row {i} has no {self.reward_fn_key!r} (data.reward_fn_key={self.reward_fn_key}: "
                                    f"the column whose value the reward function gets as data_source); columns found: "
                                    f"{sorted(row)}; fill it in, or set data.reward_fn_key to the column that holds it")
        for i, row in enumerate(rows):
            problem = reward_model_problem(row.get("reward_model")) if ground_truth_of(row) is None else None
            if problem:
                raise DataError(f"row {i}: {problem}")
        for i, row in enumerate(rows):
            if prompt_key not in row and isinstance(row.get("messages"), list):
                # TRL's conversational layout: the prompt is the conversation up to the answer.
                row[prompt_key] = conversation_prompt(row["messages"])
                if not row[prompt_key]:
                    raise DataError(f"row {i}: its `messages` hold only assistant turns; a prompt needs a "
                                    f"user (or system) message before the answer")
        prompts = []
        for i, row in enumerate(rows):
            try:
                prompts.append(json_messages(self.prompt_of(row)))
            except DataError as e:
                raise DataError(f"row {i}: {e}") from e
        all_ids = self._tokenize(prompts)
        media = [self.vision is not None and self.vision.has_media(row) for row in rows]
        for i, (row, prompt) in enumerate(zip(rows, prompts)):
            if media[i]:
                messages = prompt if is_messages(prompt) else [{"role": "user", "content": str(prompt)}]
                all_ids[i] = self.vision.tokens_of(i, row, list(messages), self.chat_template_kwargs)

        self._rows: list[dict] = []
        self._prompts: list[Any] = []
        self._ids: list[list[int]] = []
        self._index: list[int] = []
        self.num_filtered = 0
        for i, (row, prompt, ids) in enumerate(zip(rows, prompts, all_ids)):
            if len(ids) > max_prompt_length:
                if filter_overlong_prompts:
                    self.num_filtered += 1
                    continue
                if media[i]:
                    raise DataError(
                        f"prompt of row {i} with its images is {len(ids)} tokens long (each image counts its "
                        f"tokens), over data.max_prompt_length={max_prompt_length}; raise data.max_prompt_length, "
                        f"make the images smaller (data.mm_processor_kwargs: max_pixels), or set "
                        f"data.filter_overlong_prompts=true to drop such prompts (truncation cannot cut images)")
                if truncation == "error":
                    raise DataError(
                        f"prompt of row {i} is {len(ids)} tokens long, over data.max_prompt_length="
                        f"{max_prompt_length}; raise data.max_prompt_length, set "
                        f"data.filter_overlong_prompts=true to drop such prompts, or set "
                        f"data.truncation=left|right|middle to cut them")
                ids = cut_prompt(ids, max_prompt_length, truncation)
            self._rows.append(row)
            self._prompts.append(prompt)
            self._ids.append(ids)
            self._index.append(self._positions[i])
        if self.num_filtered:
            logger.warning("%s: filtered %d of %d prompts longer than data.max_prompt_length=%d tokens "
                           "(data.filter_overlong_prompts=true); raise data.max_prompt_length to keep them",
                           config_key, self.num_filtered, len(rows), max_prompt_length)
        if not self._rows:
            raise DataError(f"all {len(rows)} prompts are longer than data.max_prompt_length="
                            f"{max_prompt_length} and were filtered; raise data.max_prompt_length")

    def prompt_of(self, row: dict) -> str | list[dict]:
        """The prompt of one row: a plain string or a list of ``{role, content}`` messages.

        This is the ``data.prompt_key`` column; override it to build prompts another way (add a
        system message, an instruction, ...). It runs once per row, before tokenization, so the
        length checks and ``raw_prompt`` see the prompt it returns.
        """
        if self.prompt_key not in row:
            raise DataError(f"no prompt column {self.prompt_key!r}; columns found: {sorted(row)}; "
                            f"set `data.prompt_key` to the column that holds the prompt")
        return row[self.prompt_key]

    def _tokenize(self, prompts: list[Any]) -> list[list[int]]:
        texts: list[str] = []
        for i, prompt in enumerate(prompts):
            problem = message_problem(prompt)  # None for text, or for well-formed messages
            if isinstance(prompt, str):
                messages = None
            elif is_messages(prompt) and problem is None:
                messages = prompt
            else:
                raise DataError(f"row {i}: the prompt (column {self.prompt_key!r}, or what prompt_of returns) must "
                                f"be a string or a list of {{role, content}} messages, got {type(prompt).__name__}: "
                                f"{prompt!r:.200}" + (f"; {problem}" if problem else ""))
            problem = self._content_problem(prompt, messages)
            if problem:
                raise DataError(f"row {i}: {problem}")
            texts.append(self._render(i, prompt, messages))
        # A rendered chat template already holds its special tokens; raw text gets the usual ones.
        add_special = not (self.apply_chat_template and self.tokenizer.chat_template is not None)
        return list(self.tokenizer(texts, add_special_tokens=add_special)["input_ids"])

    def _content_problem(self, prompt: Any, messages: list[dict] | None) -> str | None:
        """What makes a well-formed prompt the wrong prompt to train on (None when it is fine): nothing to
        answer, the answer already in it (a conversation ending with its assistant turn), or text that the
        chat template already rendered, which would be rendered a second time around itself."""
        texts = [prompt] if messages is None else [str(m.get("content") or "") for m in messages
                                                   if m.get("role") != "system"]  # an instruction alone asks nothing
        if not any(t.strip() for t in texts):
            return (f"the prompt (column {self.prompt_key!r}) is empty: {prompt!r:.100}; fill it in or drop the row "
                    f"(or set data.prompt_key to the column that holds the question)")
        if messages is not None and messages[-1].get("role") == "assistant":
            return ("the prompt's chat messages end with an assistant turn, so the model is shown the answer and "
                    "asked for another turn after it; drop that turn from the prompt (put the answer in "
                    "reward_model.ground_truth), or give the conversation as a `messages` column, whose final "
                    "assistant turn is taken as the answer")
        if messages is None and self.apply_chat_template and self._rendered_already(prompt):
            return (f"the prompt text was already rendered with a chat template ({prompt!r:.80}), and "
                    f"data.apply_chat_template=true renders it again around itself; store the question itself (or "
                    f"its chat messages), or set data.apply_chat_template=false to use the text as written")
        return None

    def _rendered_already(self, text: str) -> bool:
        """Whether ``text`` holds what the tokenizer's chat template writes around a message: one of the
        special tokens it writes before the message (``<|im_start|>``; not those of the generation prompt,
        where a template may write ``<think>``, which a question may name), or, for a template of plain
        words, both the words it writes before a user message and those of the generation prompt after it."""
        if self.tokenizer.chat_template is None:
            return False
        if not hasattr(self, "_template_marks"):
            mark = "\x00verl-prompt\x00"
            try:
                rendered = self.tokenizer.apply_chat_template([{"role": "user", "content": mark}], tokenize=False,
                                                              add_generation_prompt=True, **self.chat_template_kwargs)
            except Exception:  # a template that needs more than one user message: its own error comes later
                rendered = ""
            before, _, after = rendered.partition(mark)
            specials = {str(t) for t in self.tokenizer.all_special_tokens}
            specials |= {t.content for t in getattr(self.tokenizer, "added_tokens_decoder", {}).values() if t.special}
            self._template_marks = ([t for t in specials if len(t) > 1 and t in before],
                                    before.strip(), after.strip())
        specials, before, after = self._template_marks
        if any(t in text for t in specials):
            return True
        return bool(before and after) and text.lstrip().startswith(before) and text.rstrip().endswith(after)

    def _render(self, i: int, prompt: Any, messages: list[dict] | None) -> str:
        if not self.apply_chat_template:
            return prompt if messages is None else "\n".join(str(m["content"]) for m in messages)
        if self.tokenizer.chat_template is None:
            if messages is None:
                return prompt  # a plain-text prompt for a base model: nothing to template
            raise DataError(
                f"row {i}: the prompt is a list of chat messages and data.apply_chat_template=true, but "
                f"the tokenizer has no chat template; use a tokenizer (model) with a chat template, give one "
                f"with actor_rollout_ref.model.custom_chat_template=<Jinja text or .jinja file>, or "
                f"set data.apply_chat_template=false to feed the message contents as plain text")
        if messages is None:
            messages = [{"role": "user", "content": prompt}]
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                      **self.chat_template_kwargs)
        except Exception as e:
            raise DataError(f"row {i}: the chat template failed on this prompt: {type(e).__name__}: {e}") from e

    def _other_columns(self, row: dict) -> dict:
        # Rows without verl's extra_info (TRL-style data): the remaining columns take its place,
        # so reward functions see them (TRL passes every dataset column to a reward function).
        media = (self.vision.image_key, self.vision.video_key) if self.vision is not None else ()
        return {k: v for k, v in row.items()
                if k not in (self.prompt_key, "messages", "data_source", "reward_model", *media)}

    def __len__(self) -> int:
        return len(self._rows)

    def raw_row(self, i: int) -> dict:
        """Item ``i``'s row as read from the files (not a copy: read it, do not change it)."""
        return self._rows[i]

    def __getitem__(self, i: int) -> dict:
        """One prompt: unpadded ``input_ids`` and the columns the reward function needs.

        ``index`` is the row's position in the (concatenated) files, before any filtering.
        """
        return self.item(i)

    def item(self, i: int, *, media: bool = True) -> dict:
        """Item ``i``; with ``media=False`` without its images processed (checks of the ids and answers at start)."""
        row = self._rows[i]
        # Copies, as verl's dataset reads each item afresh: a reward function (or agent code) that changes
        # its extra_info, ground truth or prompt in place (pops a key, appends a message) changed the rows
        # themselves before, so every later epoch of the row saw the change.
        item = copy.deepcopy({
            "raw_prompt": self._prompts[i],
            "data_source": row.get("data_source"),
            "ground_truth": ground_truth_of(row),
            "extra_info": json_object(row["extra_info"]) if "extra_info" in row else self._other_columns(row),
        })
        item = {"input_ids": list(self._ids[i]), **item, "index": self._index[i]}
        if self.reward_fn_key != "data_source":
            item[self.reward_fn_key] = row[self.reward_fn_key]
        if media and self.vision is not None and self.vision.has_media(row):
            item.update(self.vision.media_of(self._index[i], row))
        return item
