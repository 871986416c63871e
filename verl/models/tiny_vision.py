"""Tiny vision-language models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) in their real Hugging Face layout, built from config.

The folder is what a hub checkpoint of the family holds: the model (``config.json`` with its
``vision_config``, safetensors), a tokenizer with the vision special tokens and a chat template that
renders image parts, and the image processor's ``preprocessor_config.json``. So
``AutoModelForImageTextToText.from_pretrained`` loads it, and so does ``AutoProcessor`` where
torchvision is installed (transformers' Qwen2-VL processor needs it for its video half);
:func:`verl.models.vision.load_processor` loads it either way.

The tokenizer is :mod:`verl.models.tiny`'s byte-level one (a token per byte) with four more specials;
images are cut in 14-pixel patches (Qwen3-VL: 16) merged 2 x 2, so a 56 x 56 image is 4 tokens of the prompt.
"""

from __future__ import annotations

from pathlib import Path

from verl.models.tiny import BOS, EOS, PAD, _byte_level_core

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
VISION_SPECIALS = [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]
VL_ARCHITECTURES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")

# The tiny chat template of verl.models.tiny (``Q: ...\n``, ``A: ...</s>``), where a user turn's content
# may also be a list of parts: ``{"type": "image"}`` renders as the vision markers around one image pad
# (the processor widens it to the image's tokens), ``{"type": "text", "text": ...}`` as its text.
_VL_CONTENT = (  # a message's content: a string, or typed parts (images and videos as their pads)
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '" + VISION_START + IMAGE_PAD + VISION_END + "' }}"
    "{% elif part['type'] == 'video' %}{{ '" + VISION_START + VIDEO_PAD + VISION_END + "' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '\\n' }}"
)
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ 'Q: ' }}" + _VL_CONTENT +
    "{% elif message['role'] == 'assistant' %}{{ 'A: ' + message['content'] + eos_token }}"
    "{% else %}" + _VL_CONTENT + "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'A: ' }}{% endif %}"
)


def build_vl_tokenizer():
    """The byte-level tokenizer with ``<pad> <s> </s>`` and the four vision tokens first (ids 0-6)."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=_byte_level_core([PAD, BOS, EOS, *VISION_SPECIALS]), pad_token=PAD, bos_token=BOS,
        eos_token=EOS, unk_token=EOS, padding_side="left", clean_up_tokenization_spaces=False,
        extra_special_tokens={"image_token": IMAGE_PAD, "video_token": VIDEO_PAD,
                              "vision_start_token": VISION_START, "vision_end_token": VISION_END})
    tok.chat_template = VL_CHAT_TEMPLATE
    return tok


def build_tiny_vl_config(tokenizer, arch: str = "qwen2_vl", *, hidden_size: int = 64, num_layers: int = 2,
                         vision_depth: int = 1, vision_hidden_size: int = 32):
    """A config of ``arch`` with a language model of ``num_layers`` and a vision tower of ``vision_depth``
    blocks (a few hundred thousand parameters)."""
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, Qwen3VLConfig

    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("vision_start_token_id", VISION_START), ("vision_end_token_id", VISION_END),
        ("image_token_id", IMAGE_PAD), ("video_token_id", VIDEO_PAD))}
    head_dim = hidden_size // 4
    # M-RoPE splits each head's rotary half over (time, height, width).
    section = [head_dim // 2 - 2 * (head_dim // 6), head_dim // 6, head_dim // 6]
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=1024, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                              "mrope_section": section},
                pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True)
    vision = dict(depth=vision_depth, num_heads=2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                  in_channels=3)
    if arch == "qwen2_vl":
        vision.update(embed_dim=vision_hidden_size, hidden_size=hidden_size, mlp_ratio=2)
        return Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **ids)
    if arch == "qwen2_5_vl":
        vision.update(hidden_size=vision_hidden_size, intermediate_size=2 * vision_hidden_size,
                      out_hidden_size=hidden_size, window_size=56, fullatt_block_indexes=[vision_depth - 1])
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **ids)
    if arch == "qwen3_vl":  # 16-pixel patches, interleaved M-RoPE, deepstack features from the tower's block 0
        text.update(head_dim=head_dim, rope_parameters={**text["rope_parameters"], "mrope_interleaved": True})
        vision.update(hidden_size=vision_hidden_size, intermediate_size=2 * vision_hidden_size,
                      out_hidden_size=hidden_size, patch_size=16, num_position_embeddings=64,
                      deepstack_visual_indexes=[0])
        return Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **ids)
    raise ValueError(f"unknown tiny vision-language architecture {arch!r}; choose one of {VL_ARCHITECTURES}")


def build_image_processor(patch_size: int = 14):
    """The family's image processor (its PIL backend: no torchvision needed), sized for tiny images:
    an image is resized to between 4 and 16 prompt tokens (2 x 2 patches merged into one)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    token = 2 * patch_size
    return Qwen2VLImageProcessorPil(min_pixels=token * token * 4, max_pixels=token * token * 16, patch_size=patch_size,
                                    merge_size=2, temporal_patch_size=2)


def make_tiny_vl_model_folder(path: str | Path, *, arch: str = "qwen2_vl", seed: int = 0, **config_kwargs) -> Path:
    """Write a randomly initialised tiny vision-language model of ``arch``, its tokenizer and image
    processor to ``path`` (module docstring); returns the path."""
    from transformers import AutoModelForImageTextToText

    from verl.models.loading import _quiet_transformers
    from verl.models.tiny import _save_new_model

    _quiet_transformers()
    path = Path(path)
    tokenizer = build_vl_tokenizer()
    config = build_tiny_vl_config(tokenizer, arch, **config_kwargs)
    return _save_new_model(AutoModelForImageTextToText, config, tokenizer, path, seed,
                           extras=(build_image_processor(config.vision_config.patch_size),))


BUILTIN_VL_MODEL_NAME = "tiny-qwen2-vl"
# The built-in visual task's model (data.builtin_task=shapes): wider than the tests' folders, so that a
# warm start reads colours off the picture in a few hundred steps (hidden 64 with a vision width of 32
# stayed at chance on the shapes task after 1000; 128 and 64 reached 0.75 sampled in 700).
_BUILTIN_VL_ARGS = {"arch": "qwen2_vl", "seed": 0, "hidden_size": 128, "vision_hidden_size": 64}
_BUILTIN_VL_REVISION = 1


def builtin_vl_model_path() -> Path:
    """The built-in tiny Qwen2-VL (random init), written to the cache on first use; its folder name
    carries a hash of what shapes it."""
    import hashlib
    import json

    from verl.models.tiny import cached_model_folder

    spec = {"revision": _BUILTIN_VL_REVISION, "args": _BUILTIN_VL_ARGS, "template": VL_CHAT_TEMPLATE}
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    return cached_model_folder(f"{BUILTIN_VL_MODEL_NAME}-{key}",
                               lambda folder: make_tiny_vl_model_folder(folder, **_BUILTIN_VL_ARGS))
