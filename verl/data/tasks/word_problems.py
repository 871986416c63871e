"""Grade-school word problems in GSM8K's format: the response ends with ``#### <answer>``.

Six templates (``TEMPLATES``): shopping totals, sharing equally, rates and time, differences, and
two multi-step ones (baking then selling, paying and getting change). Numbers come from a seeded
RNG; names and items vary the wording. Each row's ``extra_info.solution`` is a worked solution
ending in ``#### N``, usable as the response of supervised warm-start data.

A problem is a training or a held-out problem by a fixed hash of its template and numbers, so a
held-out problem never shares its numbers (only its wording) with a training problem.

Scoring (``compute_score``), GSM8K's strict rule: the answer is the number right after the *last*
``####`` (a ``$`` and thousands commas are allowed: ``#### $1,250``); it scores 1.0 when it equals the
ground truth as a number (``16.0`` equals ``16``), else 0.0. No ``####``, or text in place of a
number after it, scores 0.0.
"""

from __future__ import annotations

import random
import re
import zlib
from fractions import Fraction

from verl.errors import VerlError

DATA_SOURCE = "builtin/word_problems"
HELD_OUT_FRACTION = 0.1
DEFAULT_ROWS = {"train": 5000, "test": 500}  # rows of make_rows(split) when n is None
INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."

NAMES = ["Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hana", "Ivan", "Jade", "Kofi", "Lena",
         "Mateo", "Nina", "Omar", "Priya"]
GOODS = ["notebook", "pen", "apple", "comic", "ticket", "sandwich", "candle", "plant"]
THINGS = ["stickers", "marbles", "cards", "cookies", "pencils", "stamps", "beads", "shells"]
VEHICLES = ["train", "bus", "boat", "truck", "cyclist"]
MACHINES = [("printer", "pages"), ("machine", "bottles"), ("oven", "rolls"), ("loom", "scarves")]
BAKES = [("trays", "cookies"), ("boxes", "muffins"), ("bags", "bagels"), ("plates", "tarts")]


def _plural(word: str) -> str:
    return word + "es" if word.endswith(("ch", "sh", "s", "x")) else word + "s"


def _n(x: int) -> str:
    """A number as GSM8K writes it in questions: thousands separated by commas."""
    return f"{x:,}"


# Each template: rng -> (numbers that define the problem, question, worked solution lines, answer).

def shopping(rng: random.Random):
    name, (a_item, b_item) = rng.choice(NAMES), rng.sample(GOODS, 2)
    a, p, b, q = rng.randint(2, 9), rng.randint(2, 25), rng.randint(2, 9), rng.randint(2, 25)
    question = (f"{name} buys {a} {_plural(a_item)} for ${p} each and {b} {_plural(b_item)} for ${q} each. "
                f"How many dollars does {name} spend in total?")
    steps = [f"The {_plural(a_item)} cost {a} * {p} = {a * p} dollars.",
             f"The {_plural(b_item)} cost {b} * {q} = {b * q} dollars.",
             f"In total {name} spends {a * p} + {b * q} = {a * p + b * q} dollars."]
    return (a, p, b, q), question, steps, a * p + b * q


def sharing(rng: random.Random):
    name, things = rng.choice(NAMES), rng.choice(THINGS)
    each, friends = rng.randint(2, 60), rng.randint(2, 12)
    total = each * friends
    question = (f"{name} has {_n(total)} {things} and shares them equally among {friends} friends. "
                f"How many {things} does each friend get?")
    return (total, friends), question, [f"Each friend gets {total} / {friends} = {each} {things}."], each


def rates(rng: random.Random):
    if rng.random() < 0.5:
        vehicle, speed, hours = rng.choice(VEHICLES), rng.randint(5, 90), rng.randint(2, 12)
        question = (f"A {vehicle} travels at {speed} kilometres per hour. How many kilometres does it travel "
                    f"in {hours} hours?")
        steps = [f"In {hours} hours it travels {speed} * {hours} = {speed * hours} kilometres."]
        return (0, speed, hours), question, steps, speed * hours
    (machine, items), rate, minutes = rng.choice(MACHINES), rng.randint(3, 40), rng.randint(2, 30)
    total = rate * minutes
    question = (f"A {machine} makes {rate} {items} per minute. How many minutes does it take to make "
                f"{_n(total)} {items}?")
    steps = [f"It takes {total} / {rate} = {minutes} minutes."]
    return (1, rate, total), question, steps, minutes


def difference(rng: random.Random):
    first, second = rng.sample(NAMES, 2)
    things = rng.choice(THINGS)
    a = rng.randint(100, 9999)
    b = rng.randint(10, a - 1)
    question = (f"{first} has {_n(a)} {things} and {second} has {_n(b)} {things}. How many more {things} "
                f"does {first} have than {second}?")
    return (a, b), question, [f"{first} has {a} - {b} = {a - b} more {things}."], a - b


def baking(rng: random.Random):
    name, (packs, goods) = rng.choice(NAMES), rng.choice(BAKES)
    count, per = rng.randint(2, 9), rng.randint(6, 24)
    made = count * per
    sold = rng.randint(1, made - 2)
    given = rng.randint(1, made - sold - 1)
    question = (f"{name} bakes {count} {packs} of {per} {goods}. {name} sells {sold} {goods} and gives away "
                f"{given}. How many {goods} does {name} have left?")
    steps = [f"{name} bakes {count} * {per} = {made} {goods}.",
             f"{name} sells or gives away {sold} + {given} = {sold + given} {goods}.",
             f"So {made} - {sold + given} = {made - sold - given} {goods} are left."]
    return (count, per, sold, given), question, steps, made - sold - given


def change(rng: random.Random):
    name, item = rng.choice(NAMES), rng.choice(GOODS)
    bill = rng.choice((20, 50, 100))
    count = rng.randint(2, 6)
    price = rng.randint(1, (bill - 1) // count)
    cost = count * price
    question = (f"{name} buys {count} {_plural(item)} that cost ${price} each and pays with a ${bill} bill. "
                f"How many dollars of change does {name} get?")
    steps = [f"The {_plural(item)} cost {count} * {price} = {cost} dollars.",
             f"The change is {bill} - {cost} = {bill - cost} dollars."]
    return (bill, count, price), question, steps, bill - cost


TEMPLATES = {"shopping": shopping, "sharing": sharing, "rates": rates, "difference": difference,
             "baking": baking, "change": change}


def _is_held_out(template: str, numbers: tuple) -> bool:
    # crc32 of the template and its numbers: the split never depends on the seed or on Python's hash salt.
    return zlib.crc32(f"{template}:{numbers}".encode()) % 1000 < HELD_OUT_FRACTION * 1000


def make_rows(split: str, n: int | None = None, seed: int = 0) -> list[dict]:
    """``n`` distinct problems of ``split`` ("train" or "test") in verl's layout, the same for the same
    seed; ``n`` defaults to ``DEFAULT_ROWS[split]``. The ground truth is the integer answer as a string."""
    if split not in DEFAULT_ROWS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    n = DEFAULT_ROWS[split] if n is None else n
    rng = random.Random(seed)
    want_test, seen, rows = split == "test", set(), []
    names = sorted(TEMPLATES)
    for _ in range(1000 * max(n, 1)):
        if len(rows) == n:
            break
        template = rng.choice(names)
        numbers, question, steps, answer = TEMPLATES[template](rng)
        if question in seen or _is_held_out(template, numbers) != want_test:
            continue
        seen.add(question)
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(answer)},
            "extra_info": {"split": split, "index": len(rows), "template": template, "numbers": list(numbers),
                           "solution": "\n".join(steps + [f"#### {answer}"])},
        })
    if len(rows) < n:
        raise ValueError(f"found only {len(rows)} distinct word problems for {split} of the {n} asked for; "
                         f"ask for fewer rows")
    return rows


_FINAL_NUMBER = re.compile(r"\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")


def extract_answer(solution_str: str) -> str | None:
    """The number after the last ``####``, without ``$`` and commas; None when there is none."""
    if "####" not in solution_str:
        return None
    match = _FINAL_NUMBER.match(solution_str.rsplit("####", 1)[1])
    return match.group(1).replace(",", "") if match else None


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """1.0 when the number after the last ``####`` equals the ground truth, else 0.0."""
    try:
        expected = Fraction(str(ground_truth).replace(",", "").strip())
    except ValueError:
        raise VerlError(f"word-problem ground_truth must be a number, got {ground_truth!r:.100}; rows from "
                        f"verl.data.tasks.word_problems.make_rows carry the answer as a string") from None
    answer = extract_answer(solution_str)
    return 1.0 if answer is not None and Fraction(answer) == expected else 0.0
