"""The results channel, read in the trainer: what a sandbox run sent back, decoded with bounded work.

Everything on this channel is written by a hostile process, so decoding it must cost the trainer
little whatever it holds, not only few bytes:

* before ``json.loads`` builds anything, a line is pre-scanned (strings cut out by one regular
  expression, then the separators counted): a line that would build more than
  ``max_items`` values is dropped unparsed, so parsing memory and time follow the item count
  (``SandboxLimits.max_result_items``) and not only the byte cap;
* only ``2 * calls + MAX_EXTRA_LINES`` lines are looked at: each line costs a parse (or a failed
  one) of its own, so 4 MiB of empty lines cost seconds of trainer CPU before the item budget,
  which counts values, ran out (a line over the remaining budget did not even lower it);
* nesting deeper than ``MAX_DEPTH`` is refused (``json.loads`` itself stops at the interpreter's
  recursion limit, long before memory matters), and so are integers of more than 100,000 bits
  and decimal numbers of 4300 digits or more (converting them costs quadratic time);
* hashed containers (set, frozenset, dict keys, and the trusted ``set``/``dict``/``Counter`` the
  verdict applies to returned lists) are built only when no more than ``MAX_SAME_HASH`` distinct
  elements share one hash value. Integers that all hash alike (multiples of 2**61 - 1), floats and
  tuples made to collide would otherwise cost time quadratic in their number (40,000 of them took
  ~9 s of trainer CPU). The check sorts the hashes, so it is O(n log n) whatever the values.

Anything malformed or over a bound means "no result" for that call, never an exception here.
This module imports only the standard library (it is also loaded outside the verl package).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 100
"""Deepest nesting of a returned value; deeper results fail."""
MAX_ITEMS = 200_000
"""Default for ``SandboxLimits.max_result_items``: the most values all results of one run may
hold together (each list item, dict key and value, and container counts one)."""
MAX_SAME_HASH = 32
"""Most distinct elements of one set, frozenset or dict that may share a hash value."""
MAX_HEX_DIGITS = 25_002
"""Largest integer a result may hold (``0x`` and 100,000 bits): the trusted side computes with
nothing larger."""

MAX_EXTRA_LINES = 64
"""Lines beyond two per call that are still looked at on the results channel (see ``parse_results``)."""
RESULT_PREFIX = b'{"i": %d, '
"""How the harness's line for a call begins (``json.dumps`` of ``{"i": index, ...}``). The first line that
begins so for a call is that call's, parsed or not: the trainer sends the next call when it sees it
(``sandbox_channel._supervise``), so nothing written after the program saw the next call can change this one."""
_LINE_OF = re.compile(rb'\{"i": (0|[1-9][0-9]{0,8}), ')

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')  # the two branches never overlap: linear time
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 4300  # int() of a decimal number this long is quadratic; Python refuses it by default


@dataclass(frozen=True)
class CallResult:
    """What came back for one call: a plain value, or why there is none."""

    ok: bool
    value: Any = None
    error: str = ""
    """The exception's type name (``user:<name>`` for a class the program defined), or
    ``unplain:<type>`` for a result that is not plain data."""


class TooCostly(ValueError):
    """A value would cost the trainer more than the bounds allow to build or compare."""


def check_hashes(items: list, what: str = "set") -> None:
    """Raise ``TooCostly`` when more than ``MAX_SAME_HASH`` distinct ``items`` share a hash value
    (building the ``what`` would then be quadratic); TypeError for an unhashable item, as Python.
    Each item is hashed once and looked at only with the items of its own hash: a run of equal items
    once cost a pass over every item, so 6,000 runs of 33 equal ints (200,000 items, one result line)
    cost ~40 s of trainer CPU. Now O(n log n), plus at most ``MAX_SAME_HASH`` comparisons per item."""
    if len(items) <= MAX_SAME_HASH:
        return
    hashes = list(map(hash, items))
    order = sorted(range(len(items)), key=hashes.__getitem__)
    run_start = 0
    for i in range(1, len(order) + 1):
        if i < len(order) and hashes[order[i]] == hashes[order[run_start]]:
            continue
        if i - run_start > MAX_SAME_HASH:
            _check_run([items[k] for k in order[run_start:i]], what)
        run_start = i


def _check_run(run: list, what: str) -> None:
    """``run``: items of one hash value. Equal items share a hash harmlessly (a set holds them once):
    count the distinct ones."""
    distinct: set = set()  # each add compares with at most MAX_SAME_HASH items (they all share a hash)
    for item in run:
        distinct.add(item)
        if len(distinct) > MAX_SAME_HASH:
            raise TooCostly(f"{what} with more than {MAX_SAME_HASH} distinct elements of one hash value")


def _scan(line: bytes, budget: int) -> int:
    """An upper bound on the values ``json.loads(line)`` builds, without building them; raises
    ``TooCostly`` past ``budget``."""
    bare = _STRING.sub(b'""', line) if b'"' in line else line
    count = bare.count(b",") + bare.count(b"[") + bare.count(b"{") + bare.count(b":") + 1
    if count > budget:
        raise TooCostly(f"a result line of ~{count} values, over the budget of {budget}")
    if _LONG_NUMBER in bare.translate(_DIGITS_AS_ZERO):  # a substring search: linear, unlike a regex here
        raise TooCostly("a number of 4300 digits or more")
    return count


def decode_value(encoded: Any, budget: list[int] | None = None) -> Any:
    """A plain value from its JSON form (``sandbox_codec._child_encode``). ValueError if malformed,
    ``TooCostly`` past the bounds; ``budget`` (a one-item list) is the values left to build."""
    budget = budget if budget is not None else [MAX_ITEMS]

    def walk(node: Any, depth: int) -> Any:
        budget[0] -= 1
        if depth > MAX_DEPTH or budget[0] < 0:
            raise TooCostly("result too deep or too large")
        if node is None or type(node) in (bool, int, float, str):
            return node
        if type(node) is list:
            return [walk(x, depth + 1) for x in node]
        if type(node) is not dict or len(node) != 1:
            raise ValueError("malformed result")
        (tag, body), = node.items()
        if tag == "int" and type(body) is str:
            if len(body) > MAX_HEX_DIGITS:
                raise TooCostly("integer too large")
            return int(body, 16)
        if tag == "float" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "complex" and type(body) is list and len(body) == 2:
            real, imag = (walk(x, depth + 1) for x in body)
            if type(real) is not float or type(imag) is not float:
                raise ValueError("malformed complex")
            return complex(real, imag)
        if tag in ("bytes", "bytearray") and type(body) is str:
            return (bytes if tag == "bytes" else bytearray).fromhex(body)
        if tag == "tuple" and type(body) is list:
            return tuple(walk(x, depth + 1) for x in body)
        if tag in ("set", "frozenset") and type(body) is list:
            items = [walk(x, depth + 1) for x in body]
            check_hashes(items, tag)
            return (set if tag == "set" else frozenset)(items)
        if tag == "dict" and type(body) is list:
            pairs = [walk(x, depth + 1) for x in body]
            if not all(type(p) is list and len(p) == 2 for p in pairs):
                raise ValueError("malformed dict")
            check_hashes([k for k, _ in pairs], "dict")
            return {k: v for k, v in pairs}
        raise ValueError(f"unknown tag {tag!r}")

    return walk(encoded, 0)


def parse_results(data: bytes, num_calls: int, max_items: int = MAX_ITEMS) -> tuple[dict, list[CallResult | None]]:
    """``(layers, results)`` from what the sandbox wrote to its results pipe.

    The first line is the set-up report, written before the program started; each further line
    is one call's result. The program can write to the pipe too: only the first line that begins as
    the harness's do (``RESULT_PREFIX``) counts for a call, and if it is malformed that call has no
    result. All lines together build at most ``max_items`` values, and at most ``2 * num_calls + MAX_EXTRA_LINES``
    lines after the report are looked at (the harness writes one per call; more are the program's
    own, which can then only push its own results out). Never raises.
    """
    # Bounded before splitting: 4 MiB of empty or tiny lines would otherwise cost seconds of
    # trainer CPU (a json.loads, or a failed one, per line) whatever the item budget.
    lines = data.split(b"\n", 2 * num_calls + MAX_EXTRA_LINES + 1)[:2 * num_calls + MAX_EXTRA_LINES + 1]
    layers: dict = {}
    try:
        _scan(lines[0], 1000)
        head = json.loads(lines[0])
        if type(head) is dict and type(head.get("layers")) is dict:
            layers = {str(k): v is True for k, v in head["layers"].items()}
    except Exception:  # noqa: BLE001 (set-up died before reporting)
        pass
    results: list[CallResult | None] = [None] * num_calls
    decided = [False] * num_calls
    budget = [max_items]
    for line in lines[1:]:
        if budget[0] <= 0:
            break
        match = _LINE_OF.match(line)
        index = int(match.group(1)) if match else -1
        if not 0 <= index < num_calls or decided[index]:
            continue
        decided[index] = True  # this call's line, whatever follows (see RESULT_PREFIX)
        try:
            budget[0] -= _scan(line, budget[0])
            record = json.loads(line)
            if type(record) is not dict or record.get("i") != index or type(record["i"]) is not int:
                continue
            if "value" in record:
                try:
                    results[index] = CallResult(True, decode_value(record["value"], [max_items]))
                except TooCostly:
                    results[index] = CallResult(False, error="unplain:too costly to judge")
            elif type(record.get("raised")) is str:
                results[index] = CallResult(False, error=record["raised"][:200])
        except Exception:  # noqa: BLE001 (garbage, or over a bound: that call has no result)
            continue
    return layers, results
