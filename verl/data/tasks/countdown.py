"""Countdown: reach a target with given numbers, e.g. numbers [6, 4, 3], target 8 -> ``6 / 3 * 4``.

The rules follow TinyZero's countdown task: 3 or 4 numbers, the operators ``+ - * /`` and
parentheses, and **every given number used exactly once** (a number given twice may be used twice).
Division is exact (``fractions.Fraction``), so ``(1 / 3 + 1) * 6 = 8`` is a valid use of 1, 3, 1, 6.

Instances are built solvable: a random expression over the drawn numbers is evaluated and its
value, when a whole number in ``TARGET_RANGE``, becomes the target. Each instance (the multiset of
numbers and the target) is a training or a held-out instance by a fixed hash, so held-out accuracy
measures puzzles never trained on, whatever the seed.

Scoring (``compute_score``): the equation is the text of the last ``<answer>...</answer>`` tag or,
without one, the last non-empty line; it is an arithmetic expression optionally followed by
``= <integer>`` (that number is ignored: the expression's value is what counts). It is parsed by a
small recursive-descent parser (never ``eval``) and scores

* ``1.0``: uses the given numbers exactly (as a multiset) and evaluates to the target;
* ``FORMAT_SCORE`` (0.1): a well-formed expression with other numbers or another value;
* ``0.0``: no parsable expression (any other character, a name, ``**``, unary minus), longer than
  ``MAX_EQUATION_CHARS`` or nested deeper than ``MAX_NESTING``, or a division by zero.
"""

from __future__ import annotations

import random
import re
import zlib
from collections import Counter
from fractions import Fraction

from verl.errors import VerlError

DATA_SOURCE = "builtin/countdown"
HELD_OUT_FRACTION = 0.1
DEFAULT_ROWS = {"train": 5000, "test": 500}  # rows of make_rows(split) when n is None
NUMBER_RANGE = (1, 30)  # each given number is drawn from this range, inclusive
TARGET_RANGE = (10, 200)  # targets are whole numbers in this range, inclusive
FORMAT_SCORE = 0.1
MAX_EQUATION_CHARS = 200  # longer answers score 0
MAX_NESTING = 16  # deeper parentheses score 0: bounds the parser's recursion
OPERATORS = "+-*/"

Node = int | tuple  # an integer leaf, or (operator, left, right)


class ExpressionError(ValueError):
    """The text is not an arithmetic expression of integers, + - * / and parentheses."""


# ----------------------------------------------------------------------------- parsing and scoring

_TOKEN = re.compile(r"\s*(?:([0-9]+)|([-+*/()]))")


def tokenize(text: str) -> list:
    """Integers and the one-character tokens ``+ - * / ( )``; anything else raises ExpressionError."""
    tokens, pos, text = [], 0, text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ExpressionError(f"unexpected character {text[pos]!r} at position {pos}")
        tokens.append(int(match.group(1)) if match.group(1) else match.group(2))
        pos = match.end()
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)* ; term := factor (('*'|'/') factor)* ; factor := INT | '(' expr ')'"""

    def __init__(self, tokens: list):
        self.tokens, self.pos, self.depth = tokens, 0, 0

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self):
        token = self.peek()
        self.pos += 1
        return token

    def expr(self) -> Node:
        node = self.term()
        while self.peek() in ("+", "-"):
            node = (self.take(), node, self.term())
        return node

    def term(self) -> Node:
        node = self.factor()
        while self.peek() in ("*", "/"):
            node = (self.take(), node, self.factor())
        return node

    def factor(self) -> Node:
        token = self.take()
        if isinstance(token, int):
            return token
        if token == "(":
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise ExpressionError(f"parentheses nested deeper than {MAX_NESTING}")
            node = self.expr()
            self.depth -= 1
            if self.take() != ")":
                raise ExpressionError("unbalanced parenthesis: a '(' is never closed")
            return node
        raise ExpressionError(f"expected a number or '(' but got {token!r}" if token is not None
                              else "the expression ends where a number was expected")


def parse(text: str) -> Node:
    """The expression tree of ``text``; ExpressionError when it is not a whole expression."""
    parser = _Parser(tokenize(text))
    tree = parser.expr()
    if parser.peek() is not None:
        raise ExpressionError(f"unexpected {parser.peek()!r} after a complete expression")
    return tree


def leaves(tree: Node) -> list[int]:
    """The numbers the expression uses, in order."""
    return [tree] if isinstance(tree, int) else leaves(tree[1]) + leaves(tree[2])


def evaluate(tree: Node) -> Fraction:
    """The exact value; ZeroDivisionError on a division by zero."""
    if isinstance(tree, int):
        return Fraction(tree)
    op, left, right = tree[0], evaluate(tree[1]), evaluate(tree[2])
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    return left / right


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_equation(solution_str: str) -> str | None:
    """The expression part of the answer (see the module docstring), or None when there is none."""
    tags = _ANSWER_TAG.findall(solution_str)
    if tags:
        candidate = tags[-1].strip()
    else:
        lines = [line.strip() for line in solution_str.splitlines() if line.strip()]
        candidate = lines[-1] if lines else ""
    if "=" in candidate:
        candidate, claimed = candidate.split("=", 1)
        if not re.fullmatch(r"\s*-?[0-9]+\s*", claimed):
            return None
    candidate = candidate.strip()
    return candidate if candidate and len(candidate) <= MAX_EQUATION_CHARS else None


def _target_and_numbers(ground_truth) -> tuple[int, list[int]]:
    try:
        return int(ground_truth["target"]), [int(x) for x in ground_truth["numbers"]]
    except (TypeError, KeyError, ValueError):
        raise VerlError(f"countdown ground_truth must be a dict {{'target': int, 'numbers': [int, ...]}}, got "
                        f"{ground_truth!r:.200}; rows from verl.data.tasks.countdown.make_rows have this "
                        f"form in reward_model.ground_truth") from None


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """1.0 for a correct equation, FORMAT_SCORE for a well-formed wrong one, else 0.0."""
    target, numbers = _target_and_numbers(ground_truth)
    equation = extract_equation(solution_str)
    if equation is None:
        return 0.0
    try:
        tree = parse(equation)
    except ExpressionError:
        return 0.0
    if Counter(leaves(tree)) != Counter(numbers):
        return FORMAT_SCORE
    try:
        value = evaluate(tree)
    except ZeroDivisionError:
        return 0.0
    return 1.0 if value == target else FORMAT_SCORE


# ----------------------------------------------------------------------------- generation

_ATOM, _SUM, _PRODUCT = 3, 1, 2  # precedence of an expression's outermost operator


def _combine(left: tuple, op: str, right: tuple) -> tuple | None:
    """(value, text, precedence) of ``left op right`` with the parentheses it needs; None for x / 0."""
    (lv, lt, lp), (rv, rt, rp) = left, right
    if op == "/" and rv == 0:
        return None
    prec = _SUM if op in "+-" else _PRODUCT
    lt = f"({lt})" if lp < prec else lt
    rt = f"({rt})" if rp < prec or (rp == prec and op in "-/") else rt
    value = lv + rv if op == "+" else lv - rv if op == "-" else lv * rv if op == "*" else lv / rv
    return value, f"{lt} {op} {rt}", prec


def _atoms(numbers: list[int]) -> list[tuple]:
    return [(Fraction(x), str(x), _ATOM) for x in numbers]


def solve(numbers: list[int], target: int) -> str | None:
    """An expression using every number exactly once that equals ``target``, or None (brute force)."""

    def search(pool: list[tuple]) -> str | None:
        if len(pool) == 1:
            return pool[0][1] if pool[0][0] == target else None
        for i in range(len(pool)):
            for j in range(len(pool)):
                if i == j:
                    continue
                rest = [p for k, p in enumerate(pool) if k not in (i, j)]
                for op in OPERATORS:
                    if op in "+*" and i > j:
                        continue  # commutative: (i, j) already tried
                    combined = _combine(pool[i], op, pool[j])
                    found = combined and search(rest + [combined])
                    if found:
                        return found
        return None

    return search(_atoms(numbers))


def _is_held_out(numbers: list[int], target: int) -> bool:
    # crc32 of the canonical instance: the split never depends on the seed or on Python's hash salt.
    key = f"{sorted(numbers)}={target}".encode()
    return zlib.crc32(key) % 1000 < HELD_OUT_FRACTION * 1000


def _random_instance(rng: random.Random) -> tuple[list[int], int, str] | None:
    """(numbers, target, an expression reaching it), or None when this draw gives no valid target."""
    numbers = [rng.randint(*NUMBER_RANGE) for _ in range(rng.choice((3, 4)))]
    pool = _atoms(numbers)
    while len(pool) > 1:
        i, j = rng.sample(range(len(pool)), 2)
        combined = _combine(pool[i], rng.choice(OPERATORS), pool[j])
        if combined is None:
            return None
        pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [combined]
    value, text, _ = pool[0]
    if value.denominator != 1 or not TARGET_RANGE[0] <= value <= TARGET_RANGE[1]:
        return None
    return numbers, int(value), text


def prompt_text(numbers: list[int], target: int) -> str:
    return (f"Using the numbers {numbers}, create an equation that equals {target}. You can use + - * / and "
            f"parentheses, and each number exactly once. Show your work, then give the equation alone in "
            f"<answer> </answer> tags, for example <answer>(1 + 2) / 3</answer>.")


def make_rows(split: str, n: int | None = None, seed: int = 0) -> list[dict]:
    """``n`` distinct solvable instances of ``split`` ("train" or "test") in verl's layout, the same
    for the same seed; ``n`` defaults to ``DEFAULT_ROWS[split]``.

    ``reward_model.ground_truth`` is ``{"target": int, "numbers": [int, ...]}``; ``extra_info.solution``
    is a correct answer (``<answer>expression</answer>``) for supervised warm starts.
    """
    if split not in DEFAULT_ROWS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    n = DEFAULT_ROWS[split] if n is None else n
    rng = random.Random(seed)
    want_test, seen, rows = split == "test", set(), []
    for _ in range(2000 * max(n, 1)):
        if len(rows) == n:
            break
        instance = _random_instance(rng)
        if instance is None:
            continue
        numbers, target, expression = instance
        key = (tuple(sorted(numbers)), target)
        if key in seen or _is_held_out(numbers, target) != want_test:
            continue
        seen.add(key)
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": prompt_text(numbers, target)}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": {"target": target, "numbers": numbers}},
            "extra_info": {"split": split, "index": len(rows), "solution": f"<answer>{expression}</answer>"},
        })
    if len(rows) < n:
        raise ValueError(f"found only {len(rows)} distinct countdown {split} instances of the {n} asked for; "
                         f"ask for fewer rows or widen NUMBER_RANGE / TARGET_RANGE")
    return rows
