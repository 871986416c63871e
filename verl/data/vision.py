"""Prompts with images, in verl's layout: chat messages with ``<image>`` placeholders and an ``images``
column (``data.image_key``) of PIL images, ``{"bytes": ...}`` / ``{"path": ...}`` dicts or file paths.

:class:`VisionPrompts` is the image side of :class:`verl.data.dataset.RLDataset` when it is given a
vision-language processor (:func:`verl.models.vision.load_processor`). At construction it reads every
row's images once (a missing, unreadable or corrupt image stops with one line naming the row, the column
and the image), checks that the placeholders and the images agree, renders the prompt with the chat
template and counts its tokens with each image widened to its tokens, so ``data.max_prompt_length``
holds before training starts. The pixels are processed when an item is taken (a dataset of large
images is not held in memory processed): ``multi_modal_inputs`` (``pixel_values``, ``image_grid_thw``)
for the model and ``multi_modal_data`` (the images) for the rollout, verl's names.
"""

from __future__ import annotations

import io
import os
from typing import Any

from verl.data.io import DataError
from verl.models.vision import image_parts


def load_image(value: Any, where: str):
    """``value`` (a PIL image, ``{"bytes": ...}`` or ``{"path": ...}``, a path) as an RGB PIL image, decoded
    in full (a truncated file fails here); ``where`` names it in errors."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        image = value
    else:
        source = value
        if isinstance(value, dict):
            source = value.get("bytes") or value.get("path") or value.get("image")
        if isinstance(source, (bytes, bytearray)):
            source = io.BytesIO(source)
        elif isinstance(source, (str, os.PathLike)):
            if not os.path.isfile(source):
                raise DataError(f"{where}: no image file at {str(source)!r} (a relative path is read from the "
                                f"current folder, {os.getcwd()})")
        else:
            raise DataError(f"{where}: {type(value).__name__} {value!r:.80} is not an image: give a PIL image, "
                            f"{{'bytes': ...}}, {{'path': ...}} or a file path")
        try:
            image = Image.open(source)
            image.load()
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
            raise DataError(f"{where}: not a readable image ({type(e).__name__}: {e})") from None
    return image.convert("RGB") if image.mode != "RGB" else image


def _values(row: dict, key: str) -> list:
    value = row.get(key)
    if value is None:
        return []
    if hasattr(value, "tolist") and not isinstance(value, (bytes, str)):
        value = value.tolist()
    return list(value) if isinstance(value, (list, tuple)) else [value]


class VisionPrompts:
    """What :class:`~verl.data.dataset.RLDataset` asks of a vision-language processor (module docstring)."""

    def __init__(self, processor, *, image_key: str = "images", video_key: str = "videos",
                 processor_kwargs: dict | None = None):
        if not hasattr(processor, "image_processor"):
            raise DataError(f"the processor {type(processor).__name__} has no image processor: give the "
                            f"vision-language model's (verl.models.vision.load_processor)")
        self.processor = processor
        self.image_processor = processor.image_processor
        self.tokenizer = processor.tokenizer
        self.image_key, self.video_key = image_key, video_key
        self.kwargs = dict(processor_kwargs or {})
        self.image_token = processor.image_token
        self.image_token_id = self.tokenizer.convert_tokens_to_ids(self.image_token)
        self.merge = self.image_processor.merge_size ** 2

    def has_media(self, row: dict) -> bool:
        return bool(_values(row, self.image_key) or _values(row, self.video_key))

    def tokens_of(self, i: int, row: dict, messages: list[dict], chat_template_kwargs: dict) -> list[int]:
        """The prompt's ids with every image widened to its tokens; the row's images checked."""
        if _values(row, self.video_key):
            raise DataError(f"row {i} has videos (column {self.video_key!r}): videos are not supported yet; drop "
                            f"the column or the rows that have them")
        images = [load_image(v, f"row {i}, column {self.image_key!r}, image {j}")
                  for j, v in enumerate(_values(row, self.image_key))]
        parts = image_parts(messages)
        wanted = sum(1 for m in parts if isinstance(m.get("content"), list)
                     for p in m["content"] if p.get("type") == "image")
        if wanted != len(images):
            raise DataError(f"row {i}: the prompt has {wanted} <image> placeholder(s) and column "
                            f"{self.image_key!r} holds {len(images)} image(s); each image needs its <image> in "
                            f"the prompt's text, in order")
        try:
            text = self.processor.apply_chat_template(parts, tokenize=False, add_generation_prompt=True,
                                                      **chat_template_kwargs)
        except Exception as e:
            raise DataError(f"row {i}: the chat template failed on this prompt: {type(e).__name__}: {e}") from e
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        counts = iter([self.image_tokens(image) for image in images])
        widened = []
        for token in ids:
            widened.extend([token] * next(counts) if token == self.image_token_id else [token])
        return widened

    def image_tokens(self, image) -> int:
        """Prompt tokens the image becomes: its patches after resizing, merged."""
        return self.image_processor.get_number_of_image_patches(image.height, image.width, self.kwargs) // self.merge

    def media_of(self, i: int, row: dict) -> dict:
        """An item's ``multi_modal_inputs`` and ``multi_modal_data`` (the row's images processed)."""
        images = [load_image(v, f"row {i}, column {self.image_key!r}, image {j}")
                  for j, v in enumerate(_values(row, self.image_key))]
        if not images:
            return {}
        inputs = self.image_processor(images=images, return_tensors="pt", **self.kwargs)
        return {"multi_modal_inputs": {"pixel_values": inputs["pixel_values"],
                                       "image_grid_thw": inputs["image_grid_thw"]},
                "multi_modal_data": {"image": images}}
