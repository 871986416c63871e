"""Vision-language inputs (Qwen2-VL family): the processor, chat messages and images rendered together,
and the multimodal RoPE (M-RoPE) positions of the model.

* :func:`load_processor`: the model folder's ``AutoProcessor``; where transformers cannot build it
  because torchvision is missing (its Qwen2-VL processor builds a video processor that needs it),
  :class:`QwenVLProcessor`, the same rendering from the folder's image processor (PIL backend) and
  tokenizer, for images (videos are refused with one line).
* :func:`image_parts`: verl's data layout, ``<image>`` placeholders in a message's text, turned into
  the typed parts a chat template renders (``{"type": "image"}``, ``{"type": "text", ...}``).
* :func:`rope_positions`: the ``[3, B, T]`` (time, height, width) positions of a left-padded batch,
  computed by the model's own ``get_rope_index``: an image's tokens share a time step and count
  rows and columns, the text after it resumes past the image's largest extent.
* :func:`packed_forward_inputs`: the same for packed rows (``use_remove_padding``): the text positions
  ride ahead of the M-RoPE rows (``[4, 1, N]``), which is how these models tell packed sequences apart.
"""

from __future__ import annotations

import logging
import re

import torch

logger = logging.getLogger(__name__)

PLACEHOLDERS = {"<image>": "image", "<video>": "video"}
_PLACEHOLDER = re.compile("(<image>|<video>)")
TEXT, IMAGE, VIDEO = 0, 1, 2
"""``mm_token_type_ids`` values: what each token of a sequence is."""


def image_parts(messages: list[dict]) -> list[dict]:
    """``messages`` with every ``<image>`` / ``<video>`` in a string content split out as a typed part,
    in order (verl's RLHFDataset does the same before rendering)."""
    out = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str) or not _PLACEHOLDER.search(content):
            out.append(message)
            continue
        parts = []
        for piece in _PLACEHOLDER.split(content):
            if piece in PLACEHOLDERS:
                parts.append({"type": PLACEHOLDERS[piece]})
            elif piece:
                parts.append({"type": "text", "text": piece})
        out.append({**message, "content": parts})
    return out


class QwenVLProcessor:
    """Qwen2-VL / Qwen2.5-VL rendering without torchvision: images through the folder's image processor,
    each image pad of the text widened to ``grid_t x grid_h x grid_w / merge_size**2`` pads (what
    transformers' ``Qwen2VLProcessor`` does), tokenised, and ``mm_token_type_ids`` marking them."""

    def __init__(self, image_processor, tokenizer):
        self.image_processor, self.tokenizer = image_processor, tokenizer
        self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
        self.chat_template = tokenizer.chat_template

    def apply_chat_template(self, messages, **kwargs):
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def save_pretrained(self, folder) -> None:
        """The tokenizer and the image processor, as the hub folder holds them."""
        self.tokenizer.save_pretrained(folder)
        self.image_processor.save_pretrained(folder)

    def __call__(self, text, images=None, videos=None, return_tensors="pt", padding=True, **kwargs):
        from transformers import BatchFeature

        if videos:
            raise ValueError("videos need transformers' own processor, which needs torchvision: install the "
                             "torchvision build that matches your torch (the CPU one on a CPU machine)")
        texts = [text] if isinstance(text, str) else list(text)
        wanted = sum(t.count(self.image_token) for t in texts)
        images = list(images or [])
        if wanted != len(images):
            raise ValueError(f"the text holds {wanted} image placeholder(s) ({self.image_token}) and "
                             f"{len(images)} image(s) were given")
        data = {}
        if images:
            data = dict(self.image_processor(images=images, return_tensors="pt"))
            merge = self.image_processor.merge_size ** 2
            counts = iter((data["image_grid_thw"].prod(-1) // merge).tolist())
            marker = "\0"  # the pads, widened, must not be widened again
            texts = [re.sub(re.escape(self.image_token), lambda _: marker * next(counts), t) for t in texts]
            texts = [t.replace(marker, self.image_token) for t in texts]
        encoded = self.tokenizer(texts, padding=padding, return_tensors=return_tensors, **kwargs)
        data.update(encoded)
        data["mm_token_type_ids"] = token_types(data["input_ids"], self.image_token_id)
        return BatchFeature(data, tensor_type=return_tensors)


def token_types(input_ids: torch.Tensor, image_token_id: int, video_token_id: int | None = None) -> torch.Tensor:
    """``mm_token_type_ids``: 1 on image tokens, 2 on video tokens, 0 elsewhere."""
    types = (input_ids == image_token_id).int() * IMAGE
    if video_token_id is not None:
        types += (input_ids == video_token_id).int() * VIDEO
    return types


_said_fallback = False


def load_processor(path: str):
    """The processor of the model folder (or hub id) ``path`` (module docstring)."""
    global _said_fallback
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    try:
        return AutoProcessor.from_pretrained(path)
    except ImportError as e:
        if "torchvision" not in str(e).lower():
            raise
    if not _said_fallback:
        _said_fallback = True
        logger.warning("torchvision is not installed: %s renders images with its image processor and tokenizer "
                       "(verl.models.vision.QwenVLProcessor); videos need torchvision", path)
    return QwenVLProcessor(AutoImageProcessor.from_pretrained(path), AutoTokenizer.from_pretrained(path))


def rope_positions(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, image_grid_thw=None,
                   mm_token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
    """``[3, B, T]`` M-RoPE positions of a (left-padded) batch, from the model's ``get_rope_index``
    (padding gets 0): the positions the model's own forward computes when given none."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # under LoRA: peft's base
    for _ in range(3):  # the module that owns get_rope_index (Qwen2-VL: the ForConditionalGeneration's .model)
        if hasattr(type(inner), "get_rope_index") or not hasattr(inner, "model"):
            break
        inner = inner.model
    if mm_token_type_ids is None:
        mm_token_type_ids = token_types(input_ids, model.config.image_token_id, model.config.video_token_id)
    positions, _ = inner.get_rope_index(input_ids, mm_token_type_ids=mm_token_type_ids,
                                        image_grid_thw=image_grid_thw, attention_mask=attention_mask)
    return positions


MEDIA_COLUMN = "multi_modal_inputs"


def is_vision_model(model) -> bool:
    """Whether ``model`` (or its config) is a vision-language model of the Qwen-VL kind (it takes
    ``pixel_values`` and ``image_grid_thw``)."""
    config = getattr(model, "config", model)
    return getattr(config, "vision_config", None) is not None and hasattr(config, "image_token_id")


def multimodal_kwargs(media, input_ids: torch.Tensor, model) -> dict:
    """The keyword arguments a forward (or ``generate``) of ``model`` needs for rows ``media`` (each
    row's ``multi_modal_inputs``, None for a row without images): the rows' pixels and grids
    concatenated in row order and ``mm_token_type_ids`` of ``input_ids``; {} when no row has images.
    Every image pad token is an image, in the prompt or in a response (an image a tool returned): the
    policy never draws one (:func:`placeholder_ids`)."""
    if media is None:
        return {}
    present = [m for m in media if m is not None]
    if not present:
        return {}
    device = input_ids.device
    config = getattr(model, "config", model)
    types = token_types(input_ids, config.image_token_id, getattr(config, "video_token_id", None))
    return {"pixel_values": torch.cat([m["pixel_values"] for m in present]).to(device),
            "image_grid_thw": torch.cat([m["image_grid_thw"] for m in present]).to(device),
            "mm_token_type_ids": types.to(device)}


def forward_inputs(media, input_ids: torch.Tensor, attention_mask: torch.Tensor, model) -> dict:
    """:func:`multimodal_kwargs` and the rows' M-RoPE ``position_ids`` (:func:`rope_positions`): all that a
    padded forward of ``model`` over rows with images takes besides the ids and the mask ({} without)."""
    extra = multimodal_kwargs(media, input_ids, model)
    if extra:
        extra["position_ids"] = rope_positions(model, input_ids, attention_mask, extra["image_grid_thw"],
                                               extra["mm_token_type_ids"])
    return extra


def packed_position_ids(model, positions: torch.Tensor) -> torch.Tensor:
    """A packed row's text positions ``[1, N]`` (each sequence counting 0, 1, ...) as ``model`` takes them.
    A vision-language model of the Qwen-VL kind reads the sequences' boundaries only from a first row of
    text positions ahead of its three M-RoPE rows (``[4, 1, N]``); given ``[1, N]`` it builds no
    per-sequence mask and packed sequences attend to each other. Text models take ``positions`` as is."""
    if not is_vision_model(model):
        return positions
    return positions.unsqueeze(0).expand(4, -1, -1)


def packed_forward_inputs(media, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor,
                          model) -> dict:
    """What a packed forward of ``model`` takes besides the packed ids: ``position_ids`` (see
    :func:`packed_position_ids`) and, for rows with images, the images' inputs. ``input_ids`` /
    ``attention_mask``: the padded batch ``[B, T]``; ``positions``: its valid tokens' text positions
    ``[1, N]`` in the packed row. The M-RoPE rows and token types are the padded batch's at its valid
    tokens; the images stay in row order, which is the order of their tokens in the packed row."""
    extra = forward_inputs(media, input_ids, attention_mask, model)
    if not extra:
        return {"position_ids": packed_position_ids(model, positions)}
    valid = attention_mask.bool()
    rope = extra["position_ids"][:, valid].unsqueeze(1)  # [3, 1, N]
    extra["position_ids"] = torch.cat([positions.unsqueeze(0), rope.to(positions.dtype)])
    extra["mm_token_type_ids"] = extra["mm_token_type_ids"][valid].unsqueeze(0)
    return extra


def media_of(batch) -> list | None:
    """The rows' ``multi_modal_inputs`` of a :class:`~verl.protocol.Batch` (None: it has no such column)."""
    return list(batch[MEDIA_COLUMN]) if MEDIA_COLUMN in batch else None


def images_of(batch) -> list | None:
    """:func:`media_of`, or None where no row has images."""
    media = media_of(batch)
    return media if media is not None and any(m is not None for m in media) else None


NEVER = -1e9
"""The logit of a token the policy may not emit (finite: an entropy over it stays a number)."""


def placeholder_ids(model) -> list[int]:
    """The image and video placeholder tokens of a vision-language model ([] for a text model). The
    policy never emits them: a response holding one would read as an image without pixels in every
    later forward, so the rollout forbids them and the actor's log-probs leave them out alike."""
    if not is_vision_model(model):
        return []
    config = getattr(model, "config", model)
    return [i for i in (config.image_token_id, getattr(config, "video_token_id", None)) if i is not None]


def forbid_placeholders(logits: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """``logits [..., V]`` with the ``ids`` columns set to :data:`NEVER` (a copy; unchanged without ids)."""
    if not ids:
        return logits
    logits = logits.clone()
    logits[..., ids] = NEVER
    return logits
