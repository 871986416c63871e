"""Tiny vision-language models offline (verl.models.tiny_vision) and their inputs (verl.models.vision):
the folders load as the hub's do, the processor renders messages and images together, and a response's
log-probs with images do not depend on padding or on who computes them (the model's own generate or a
teacher-forced forward with M-RoPE positions)."""

import numpy as np
import pytest
import torch
from PIL import Image

from verl.models.tiny_vision import IMAGE_PAD, VL_ARCHITECTURES, make_tiny_vl_model_folder
from verl.models.vision import image_parts, load_processor, rope_positions, token_types


@pytest.fixture(scope="module", params=VL_ARCHITECTURES)
def vl_model(request, tmp_path_factory):
    from transformers import AutoModelForImageTextToText

    path = make_tiny_vl_model_folder(tmp_path_factory.mktemp(request.param), arch=request.param)
    return AutoModelForImageTextToText.from_pretrained(path).eval(), load_processor(str(path))


def image(width, height, seed=0):
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((height, width, 3)) * 255).astype("uint8"))


def render(processor, question="How many dots?"):
    messages = image_parts([{"role": "user", "content": f"<image>{question}"}])
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def test_verls_image_placeholders_become_typed_parts_in_order():
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "<image>left, <image> right<video>"}]
    assert image_parts(messages) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "left, "}, {"type": "image"},
                                     {"type": "text", "text": " right"}, {"type": "video"}]}]


def test_the_folder_loads_as_a_hub_checkpoint_and_the_processor_widens_each_image_to_its_tokens(vl_model):
    model, processor = vl_model
    assert sum(p.numel() for p in model.parameters()) < 500_000 and model.config.vision_config.depth == 1
    text = render(processor)
    assert text.count(IMAGE_PAD) == 1 and text.startswith("Q: <|vision_start|>")
    side = 2 * model.config.vision_config.patch_size  # one prompt token's side: 2 x 2 patches
    small, wide = image(2 * side, 2 * side), image(4 * side, 2 * side, seed=1)
    out = processor(text=[text, text], images=[small, wide], return_tensors="pt")
    grids = out["image_grid_thw"]
    # 56 x 56 -> a 4 x 4 grid of 14-pixel patches -> 4 tokens after the 2 x 2 merge; 112 x 56 -> 8 (Qwen3: 16)
    assert grids.tolist() == [[1, 4, 4], [1, 4, 8]]
    pads = (out["input_ids"] == processor.image_token_id).sum(1)
    assert pads.tolist() == [4, 8]
    patch = model.config.vision_config.patch_size
    assert out["pixel_values"].shape == (16 + 32, 3 * 2 * patch * patch)
    assert torch.equal(out["mm_token_type_ids"], token_types(out["input_ids"], processor.image_token_id))
    with pytest.raises(ValueError, match="1 image placeholder"):
        processor(text=[text], images=[small, wide], return_tensors="pt")


def _with_response(processor, texts, images, response: str):
    """Prompts and images through the processor, the response's ids appended to every row."""
    out = processor(text=texts, images=images, return_tensors="pt")
    resp = torch.tensor(processor.tokenizer(response, add_special_tokens=False)["input_ids"])
    ids = torch.cat([out["input_ids"], resp.expand(len(texts), -1)], dim=1)
    mask = torch.cat([out["attention_mask"], torch.ones(len(texts), len(resp), dtype=torch.long)], dim=1)
    return out, ids, mask, len(resp)


def _response_log_probs(model, ids, mask, out, n_resp, positions=True):
    types = token_types(ids, model.config.image_token_id)
    kwargs = dict(pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"], mm_token_type_ids=types)
    if positions:
        kwargs["position_ids"] = rope_positions(model, ids, mask, out["image_grid_thw"], types)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, **kwargs).logits.float()
    lp = torch.log_softmax(logits[:, -n_resp - 1:-1], dim=-1)
    return lp.gather(-1, ids[:, -n_resp:, None]).squeeze(-1)


def test_a_responses_log_probs_do_not_depend_on_padding_or_on_who_computes_the_positions(vl_model):
    model, processor = vl_model
    text = render(processor)
    images = [image(56, 56), image(112, 56, seed=1)]  # 4 and 8 image tokens: the first row is left-padded
    out, ids, mask, n = _with_response(processor, [text, text], images, "3 dots")
    assert (mask[0] == 0).any() and (mask[1] == 1).all()
    batched = _response_log_probs(model, ids, mask, out, n)
    # the model's own forward computes the same positions when given none
    torch.testing.assert_close(_response_log_probs(model, ids, mask, out, n, positions=False), batched)
    for row in range(2):
        alone, ids1, mask1, _ = _with_response(processor, [text], images[row:row + 1], "3 dots")
        torch.testing.assert_close(_response_log_probs(model, ids1, mask1, alone, n)[0], batched[row],
                                   atol=1e-5, rtol=0)
    # the image matters: another image, other log-probs
    other, ids2, mask2, _ = _with_response(processor, [text], [image(56, 56, seed=7)], "3 dots")
    assert (_response_log_probs(model, ids2, mask2, other, n)[0] - batched[0]).abs().max() > 1e-4


def test_generates_with_images_and_its_log_probs_equal_the_teacher_forced_forward(vl_model):
    model, processor = vl_model
    text = render(processor)
    images = [image(56, 56), image(112, 56, seed=1)]
    out = processor(text=[text, text], images=images, return_tensors="pt")
    prompt_len = out["input_ids"].shape[1]
    gen = model.generate(**out, max_new_tokens=6, do_sample=False, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=processor.tokenizer.pad_token_id)
    response = gen.sequences[:, prompt_len:]
    engine = torch.stack([torch.log_softmax(s.float(), -1).gather(-1, response[:, t:t + 1]).squeeze(-1)
                          for t, s in enumerate(gen.logits)], dim=1)
    live = (response == processor.tokenizer.eos_token_id).long()
    live = (live.cumsum(1) - live) == 0  # up to and including the first eos
    mask = torch.cat([out["attention_mask"], live.long()], dim=1)
    actor = _response_log_probs(model, gen.sequences, mask, out, response.shape[1])
    assert live[:, :2].all()
    torch.testing.assert_close(engine[live], actor[live], atol=1e-4, rtol=0)
