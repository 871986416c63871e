"""The built-in visual task: seeded pictures whose answer is the colour with the most pixels (the largest
shape), one question text for every row (only the picture tells), verl's vision-language layout."""

import io
from collections import Counter

import numpy as np
from PIL import Image

from verl.data.tasks import TASKS, shapes


def test_rows_are_seeded_pictures_whose_answer_is_the_colour_covering_the_most_pixels():
    rows = shapes.make_rows("train", n=60)
    assert rows == shapes.make_rows("train", n=60) and rows != shapes.make_rows("test", n=60)
    assert TASKS["shapes"] is shapes and shapes.VISION
    assert {r["prompt"][0]["content"] for r in rows} == {"<image>Colour of the largest shape?"}
    answers = Counter()
    for row in rows:
        pixels = np.asarray(Image.open(io.BytesIO(row["images"][0]["bytes"]))).reshape(-1, 3)
        counts = {name: int((pixels == rgb).all(-1).sum()) for name, rgb in shapes.COLOURS.items()}
        truth = row["reward_model"]["ground_truth"]
        assert counts[truth] == max(counts.values()) and sum(c > 0 for c in counts.values()) >= 2
        answers[truth] += 1
    assert len(answers) == 4 and min(answers.values()) >= 5  # no colour is a safe guess


def test_the_score_is_the_colours_name_case_and_spaces_aside():
    assert shapes.compute_score(shapes.DATA_SOURCE, " Blue ", "blue") == 1.0
    assert shapes.compute_score(shapes.DATA_SOURCE, "blue!", "blue") == 0.0
    assert shapes.compute_score(shapes.DATA_SOURCE, "red", "blue") == 0.0
