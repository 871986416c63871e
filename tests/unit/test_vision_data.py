"""Prompts with images in verl's layout (verl.data.vision through RLDataset): the ids and pixels equal the
model's processor's, the images ride with each item into the batch, and bad input (a missing, unreadable
or corrupt image, placeholders that do not match the images, a prompt too long once its images count,
videos) stops before training with one line naming the row and the column."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from verl.data import RLDataset, collate_prompts, write_parquet
from verl.data.io import DataError
from verl.data.vision import load_image
from verl.models.tiny_vision import make_tiny_vl_model_folder
from verl.models.vision import image_parts, load_processor


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    return load_processor(str(make_tiny_vl_model_folder(tmp_path_factory.mktemp("tiny-vl"))))


def picture(width=56, height=56, seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((height, width, 3)) * 255).astype("uint8"))


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def row(content="<image>How many dots?", images=None, answer="3"):
    images = [{"bytes": png(picture())}] if images is None else images
    return {"prompt": [{"role": "user", "content": content}], "images": images, "data_source": "dots",
            "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": {"split": "train"}}


def dataset(tmp_path, rows, processor, **kwargs):
    path = tmp_path / "train.parquet"
    write_parquet(rows, path)
    return RLDataset(str(path), processor.tokenizer, processor=processor, **kwargs)


def test_items_hold_the_processors_ids_and_pixels_and_the_batch_carries_them(tmp_path, processor):
    wide = picture(112, 56, seed=1)
    rows = [row(), row("<image>and this one?", [{"bytes": png(wide)}], "5"),
            {"prompt": [{"role": "user", "content": "no picture"}], "data_source": "dots",
             "reward_model": {"ground_truth": "0"}}]
    data = dataset(tmp_path, rows, processor, max_prompt_length=64)
    for i, image in ((0, picture()), (1, wide)):
        item = data[i]
        messages = image_parts(rows[i]["prompt"])
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        expected = processor(text=[text], images=[image], return_tensors="pt")
        assert item["input_ids"] == expected["input_ids"][0].tolist()
        assert torch.equal(item["multi_modal_inputs"]["pixel_values"], expected["pixel_values"])
        assert torch.equal(item["multi_modal_inputs"]["image_grid_thw"], expected["image_grid_thw"])
        assert np.array_equal(np.asarray(item["multi_modal_data"]["image"][0]), np.asarray(image))
        assert "images" not in item["extra_info"] and item["ground_truth"] == rows[i]["reward_model"]["ground_truth"]
    assert "multi_modal_inputs" not in data[2]  # a text row of the same dataset
    batch = collate_prompts([data[i] for i in range(3)], processor.tokenizer.pad_token_id)
    assert [m is None for m in batch["multi_modal_inputs"]] == [False, False, True]
    assert batch["multi_modal_inputs"][1]["image_grid_thw"].tolist() == [[1, 4, 8]]


def test_an_item_without_its_media_is_the_item_less_its_pictures_and_processes_none(tmp_path, processor,
                                                                                  monkeypatch):
    """The trainer's checks at start (token ids inside the vocabulary, answers present) read every row; through
    the items they ran the image processor on every picture of the training set, twice."""
    data = dataset(tmp_path, [row(), row(answer="5")], processor, max_prompt_length=64)
    full = [data[i] for i in range(2)]
    monkeypatch.setattr(type(data.vision), "media_of", lambda *a: pytest.fail("a picture was processed"))
    for i in range(2):
        plain = data.item(i, media=False)
        assert plain == {k: v for k, v in full[i].items() if k not in ("multi_modal_inputs", "multi_modal_data")}


def test_an_image_may_be_a_pil_image_bytes_a_path_or_a_dict_with_either(tmp_path, monkeypatch):
    image = picture(seed=3)
    file = tmp_path / "dots.png"
    file.write_bytes(png(image))
    monkeypatch.chdir(tmp_path)
    for value in (image, {"bytes": png(image)}, {"path": str(file)}, str(file), "dots.png",
                  {"bytes": None, "path": "dots.png"}, image.convert("RGBA")):
        loaded = load_image(value, "row 0")
        assert loaded.mode == "RGB" and np.array_equal(np.asarray(loaded), np.asarray(image))


@pytest.mark.parametrize("bad, message", [
    ({"path": "missing.png"}, r"row 1, column 'images', image 0: no image file at 'missing.png'"),
    ({"bytes": b"not a picture"}, r"row 1, column 'images', image 0: not a readable image"),
    ("truncated", r"row 1, column 'images', image 0: not a readable image"),
    (17, r"row 0, column 'images', image 0: int 17 is not an image"),
])
def test_a_missing_unreadable_or_corrupt_image_is_named_by_row_column_and_image(tmp_path, processor, bad, message):
    if bad == "truncated":
        bad = {"bytes": png(picture(200, 200))[:300]}
    rows = [row(images=[bad])] if isinstance(bad, int) else [row(), row(images=[bad])]  # a column of one type
    with pytest.raises(DataError, match=message):
        dataset(tmp_path, rows, processor)


@pytest.mark.parametrize("content, images, message", [
    ("<image><image>two?", 1, r"row 0: the prompt has 2 <image> placeholder\(s\) and column 'images' holds 1"),
    ("no placeholder", 1, r"row 0: the prompt has 0 <image> placeholder\(s\) and column 'images' holds 1"),
])
def test_placeholders_and_images_must_agree(tmp_path, processor, content, images, message):
    rows = [row(content, [{"bytes": png(picture())}] * images)]
    with pytest.raises(DataError, match=message):
        dataset(tmp_path, rows, processor)


def test_a_prompt_too_long_once_its_images_count_is_refused_or_filtered_never_cut(tmp_path, processor):
    big = {"bytes": png(picture(400, 400))}  # resized to the processor's most: 16 tokens
    rows = [row(), row(images=[big])]
    short = dataset(tmp_path, rows[:1], processor, max_prompt_length=64)
    length = len(short[0]["input_ids"])  # 4 image tokens
    for truncation in ("error", "left"):
        with pytest.raises(DataError, match=r"prompt of row 1 with its images is \d+ tokens long .*over "
                                            r"data.max_prompt_length=.*truncation cannot cut images"):
            dataset(tmp_path, rows, processor, max_prompt_length=length + 4, truncation=truncation)
    kept = dataset(tmp_path, rows, processor, max_prompt_length=length + 4, filter_overlong_prompts=True)
    assert len(kept) == 1 and kept.num_filtered == 1


def test_videos_are_refused_with_the_column_named_and_images_without_a_processor_still_are(tmp_path, processor):
    with pytest.raises(DataError, match="row 0 has videos \\(column 'videos'\\): videos are not supported yet"):
        dataset(tmp_path, [{**row(), "videos": [{"path": "clip.mp4"}]}], processor)
    path = tmp_path / "train.parquet"
    write_parquet([row()], path)
    with pytest.raises(DataError, match="has images"):
        RLDataset(str(path), processor.tokenizer)


def test_mm_processor_kwargs_size_the_images_and_their_token_count_alike(tmp_path, processor):
    big = {"bytes": png(picture(112, 112))}
    default = dataset(tmp_path, [row(images=[big])], processor, max_prompt_length=64)[0]
    small = dataset(tmp_path, [row(images=[big])], processor, max_prompt_length=64,
                    config={"mm_processor_kwargs": {"max_pixels": 56 * 56}})[0]
    for item, tokens in ((default, 16), (small, 4)):
        grid = item["multi_modal_inputs"]["image_grid_thw"]
        assert int(grid.prod()) // 4 == tokens == item["input_ids"].count(processor.image_token_id)
