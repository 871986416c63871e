"""The colour of the largest shape: a picture of two or three filled shapes (squares and discs, not
overlapping) of different colours and sizes, and the question ``<image>Colour of the largest shape?``; the answer is
one of ``red green blue yellow``. The built-in visual task (docs/vision.md): the prompt's text is the
same for every row, so a model that does not read the image can only guess (one in four).

Rows are in verl's vision-language layout: ``prompt`` messages with ``<image>``, ``images`` a list of
one ``{"bytes": PNG}``; a picture is a training or a held-out one by its seed. Scoring
(``compute_score``): 1.0 for the colour's name (case and surrounding spaces aside), else 0.0.
"""

from __future__ import annotations

import io
import random

DATA_SOURCE = "builtin/shapes"
VISION = True
"""Rows with images: the built-in vision-language model and its warm start (verl.trainer.vision_warmstart)."""
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 30)}
SIZE = 56
TRAIN_ROWS, TEST_ROWS = 2000, 200
QUESTION = "<image>Colour of the largest shape?"


def picture(rng: random.Random) -> tuple[bytes, str]:
    """A PNG of two or three shapes that do not overlap and the colour of the largest (sides 8, 14, 20 or
    26 pixels, so the largest also covers the most pixels, disc or square)."""
    from PIL import Image, ImageDraw

    count = rng.choice((2, 3))
    colours = rng.sample(list(COLOURS), count)
    sizes = sorted(rng.sample(range(8, 30, 6), count), reverse=True)
    image = Image.new("RGB", (SIZE, SIZE), "white")
    draw = ImageDraw.Draw(image)
    placed: list[tuple[int, int, int]] = []
    for colour, size in zip(colours, sizes):  # the largest first: it always fits
        for _ in range(100):
            x, y = rng.randrange(0, SIZE - size + 1), rng.randrange(0, SIZE - size + 1)
            if all(x + size <= px or px + ps <= x or y + size <= py or py + ps <= y for px, py, ps in placed):
                break
        else:
            continue  # no room left for this one: the picture has one shape fewer
        placed.append((x, y, size))
        shape = draw.rectangle if rng.random() < 0.5 else draw.ellipse
        shape([x, y, x + size - 1, y + size - 1], fill=COLOURS[colour])
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue(), colours[0]


def make_rows(split: str, n: int | None = None, seed: int = 0) -> list[dict]:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    count = n if n is not None else (TEST_ROWS if split == "test" else TRAIN_ROWS)
    rng = random.Random(f"shapes-{split}-{seed}")
    rows = []
    for i in range(count):
        png, answer = picture(rng)
        rows.append({"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": QUESTION}],
                     "images": [{"bytes": png}], "ability": "vision",
                     "reward_model": {"style": "rule", "ground_truth": answer},
                     "extra_info": {"split": split, "index": i}})
    return rows


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    return 1.0 if solution_str.strip().lower() == str(ground_truth).lower() else 0.0
