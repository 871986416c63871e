"""The trusted half of grading: what the sandbox is asked to compute, and how its answers are judged.

An assert test such as ``assert add(1, 2) == 3`` is split here, in the trainer, into

* *calls*: the sub-expressions that need the program (``add(1, 2)``). Only these are sent into the
  sandbox, which evaluates them after the program ran and sends back each result as plain data;
* a *trusted expression* around them (``<call 0> == 3``), evaluated here on the returned data. The
  expected value never enters the sandbox, so the program cannot read it, and nothing the program
  does in its own process (patching ``builtins``, objects equal to everything, exit codes, frames)
  can turn a wrong answer into a pass.

Accepted shapes (anything else cannot be judged and the case scores 0, see ``compile_assert``):

* a call is a name, attribute, call or subscript chain whose arguments are literals, other calls,
  or list/tuple/set/dict displays of those: ``f(1, [2, 3])``, ``Solution().two_sum([2, 7], 9)``,
  ``f(Point(1, 2))``, ``CONSTANT``;
* around calls: literals; comparisons (``==  !=  <  <=  >  >=  in  not in``, and ``is`` / ``is not``
  with ``None``, ``True`` or ``False``); ``and``, ``or``, ``not``; unary ``-``/``+`` and the
  arithmetic operators ``+ - * / // %`` on numbers; subscripts with literal indexes; and the
  builtins ``abs all any bool float frozenset int isinstance len list max min round set sorted
  str sum tuple`` plus ``math.isclose`` (keyword arguments must be literals).

Results come back as *plain data*: None, bool, int, float, complex, str, bytes, bytearray, list,
tuple, dict, set, frozenset (subclasses, such as a namedtuple or a Counter, as their base type).
A call whose result is anything else fails. Comparison is Python's own ``==`` on the decoded
values, so ``1 == 1.0`` and ``True == 1`` hold, a tuple is not equal to a list, and NaN equals
nothing. When a call is the direct argument of ``list tuple set frozenset sorted sum min max any
all``, an iterator it returns (a generator, ``map``, a dict view ...) is read into a list in the
sandbox first, as Python would iterate it.

This module imports only the standard library (it is also loaded outside the verl package).
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 100
"""Deepest nesting of a returned value; deeper results fail."""
MAX_ITEMS = 1_000_000
"""Most containers and items one returned value may hold; larger results fail."""


@dataclass(frozen=True)
class Call:
    """An expression the sandbox evaluates in the program's namespace after running it."""

    expression: str
    iterate: bool = False
    """Read an iterator result into a list before returning it (see the module docstring)."""


@dataclass(frozen=True)
class CallResult:
    """What came back for one call: a plain value, or why there is none."""

    ok: bool
    value: Any = None
    error: str = ""
    """The exception's type name, or ``unplain:<type>`` for a result that is not plain data."""


@dataclass(frozen=True)
class AssertPlan:
    """A compiled assert: the calls for the sandbox, and the trusted expression around them."""

    source: str
    calls: tuple[Call, ...]
    tree: tuple


class _Unjudgeable(Exception):
    """The assert has a shape the trusted side cannot evaluate."""


class _NoValue(Exception):
    """A call needed by the expression has no plain result; ``status`` says why."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status


_NUMBERS = (int, float, complex)  # bool is an int
_ITERATING = frozenset({"list", "tuple", "set", "frozenset", "sorted", "sum", "min", "max", "any", "all"})
_TYPES = {"int": int, "float": float, "complex": complex, "bool": bool, "str": str, "bytes": bytes,
          "bytearray": bytearray, "list": list, "tuple": tuple, "dict": dict, "set": set,
          "frozenset": frozenset, "NoneType": type(None)}
_COMPARE = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
            ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
_ARITHMETIC = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%"}
_SINGLETONS = (None, True, False)


def _checked_sum(values, start=0):
    values = list(values)
    if not all(type(v) in (*_NUMBERS, bool) for v in [start, *values]):
        raise TypeError("sum() is judged on numbers only")
    return sum(values, start)


def _checked_round(number, ndigits=None):
    if ndigits is not None and (type(ndigits) is not int or abs(ndigits) > 400):
        raise ValueError("round() digits out of range")
    return round(number, ndigits)


def _isclose(a, b, **tolerances):
    if any(type(x) not in (int, float, bool) for x in (a, b)):
        raise TypeError("math.isclose() takes real numbers")
    return math.isclose(a, b, **tolerances)


# Pure functions applied here, to plain data. Those whose cost depends on an argument's value
# (not only its size) are wrapped to refuse extremes; a result has at most MAX_ITEMS items.
_FUNCTIONS = {"abs": abs, "all": all, "any": any, "bool": bool, "float": float, "frozenset": frozenset,
              "int": int, "len": len, "list": list, "max": max, "min": min, "round": _checked_round,
              "set": set, "sorted": sorted, "str": str, "sum": _checked_sum, "tuple": tuple,
              "math.isclose": _isclose, "isinstance": isinstance}


def compile_assert(source: str) -> AssertPlan | None:
    """The plan for one ``assert`` statement, or None when it has a shape that cannot be judged
    outside the sandbox (see the module docstring); such a case scores 0."""
    try:
        module = ast.parse(source, mode="exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if len(module.body) != 1 or not isinstance(module.body[0], ast.Assert):
        return None
    calls: list[Call] = []
    try:
        tree = _trusted(module.body[0].test, calls)
    except (_Unjudgeable, RecursionError):
        return None
    if not calls:  # nothing of the program's is tested (e.g. ``assert True``)
        return None
    return AssertPlan(source, tuple(calls), tree)


def _literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


def _trusted(node: ast.AST, calls: list[Call], iterate: bool = False) -> tuple:
    """The trusted expression for ``node``; calls are appended to ``calls`` in evaluation order."""
    is_literal, value = _literal(node)
    if is_literal:
        return ("lit", value)
    if isinstance(node, ast.Compare):
        operands = [_trusted(node.left, calls)]
        ops = []
        for op, right in zip(node.ops, node.comparators):
            name = _COMPARE.get(type(op))
            if name is None:
                raise _Unjudgeable
            operands.append(_trusted(right, calls))
            ops.append(name)
        for i, name in enumerate(ops):
            if name in ("is", "is not") and not any(
                    o[0] == "lit" and any(o[1] is s for s in _SINGLETONS) for o in operands[i:i + 2]):
                raise _Unjudgeable
        return ("cmp", tuple(ops), tuple(operands))
    if isinstance(node, ast.BoolOp):
        kind = "and" if isinstance(node.op, ast.And) else "or"
        return (kind, tuple(_trusted(v, calls) for v in node.values))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
        kind = {ast.Not: "not", ast.USub: "neg", ast.UAdd: "pos"}[type(node.op)]
        return (kind, _trusted(node.operand, calls))
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        return ("bin", _ARITHMETIC[type(node.op)], _trusted(node.left, calls), _trusted(node.right, calls))
    if isinstance(node, ast.Subscript):  # judged here: ``f(1)[0]`` sends ``f(1)`` only
        index_ok, index = _literal(node.slice)
        if isinstance(node.slice, ast.Slice):
            parts = [_literal(p) if p is not None else (True, None)
                     for p in (node.slice.lower, node.slice.upper, node.slice.step)]
            index_ok, index = all(ok for ok, _ in parts), slice(*(v for _, v in parts))
        if not index_ok:
            raise _Unjudgeable
        return ("item", _trusted(node.value, calls), index)
    if isinstance(node, ast.Call) and _dotted(node.func) in _FUNCTIONS:
        name = _dotted(node.func)
        if name == "isinstance":
            if len(node.args) != 2 or node.keywords:
                raise _Unjudgeable
            return ("call", name, (_trusted(node.args[0], calls), ("lit", _type_spec(node.args[1]))), ())
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise _Unjudgeable
        args = tuple(_trusted(a, calls, iterate=(i == 0 and name in _ITERATING)) for i, a in enumerate(node.args))
        keywords = []
        for keyword in node.keywords:
            ok, value = _literal(keyword.value)
            if keyword.arg is None or not ok:
                raise _Unjudgeable
            keywords.append((keyword.arg, value))
        return ("call", name, args, tuple(keywords))
    if _is_call(node):
        calls.append(Call(ast.unparse(node), iterate))
        return ("leaf", len(calls) - 1)
    raise _Unjudgeable


def _type_spec(node: ast.AST):
    if isinstance(node, ast.Name) and node.id in _TYPES:
        return _TYPES[node.id]
    if isinstance(node, ast.Tuple) and node.elts:
        return tuple(_type_spec(e) for e in node.elts)
    raise _Unjudgeable


def _is_call(node: ast.AST) -> bool:
    """A reference into the program (``f``, ``a.b``, ``f(...)``, ``x[0]``) whose arguments are inputs."""
    if isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.Attribute):
        return _is_call(node.value)
    if isinstance(node, ast.Subscript):
        return _is_call(node.value) and _literal(node.slice)[0]
    if isinstance(node, ast.Call):
        return (_is_call(node.func) and all(_is_input(a) for a in node.args)
                and all(k.arg is not None and _is_input(k.value) for k in node.keywords))
    return False


def _is_input(node: ast.AST) -> bool:
    if _literal(node)[0] or _is_call(node):
        return True
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_is_input(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _is_input(k) for k in node.keys) and all(map(_is_input, node.values))
    return False


def judge(plan: AssertPlan, results: list[CallResult | None], run_status: str) -> tuple[bool, str]:
    """``(passed, status)`` of one assert from its calls' results. ``status`` is ``ok`` when it
    passed, else why not: ``wrong_answer``, ``error`` (a call raised), ``memory``, or the run's
    status when a result is missing (``timeout``, ``blocked``, ...; ``error`` if the run ended
    normally without it, e.g. the program exited first)."""
    try:
        value = _evaluate(plan.tree, results, run_status)
        return (True, "ok") if bool(value) else (False, "wrong_answer")
    except _NoValue as missing:
        return False, missing.status
    except Exception:  # noqa: BLE001 (a TypeError etc. on the returned data: the answer is wrong)
        return False, "wrong_answer"


def _evaluate(tree: tuple, results: list[CallResult | None], run_status: str) -> Any:
    kind = tree[0]
    if kind == "lit":
        return tree[1]
    if kind == "leaf":
        index = tree[1]
        result = results[index] if index < len(results) else None
        if result is None:
            raise _NoValue("error" if run_status == "ok" else run_status)
        if not result.ok:
            if result.error.startswith("unplain:"):
                raise _NoValue("wrong_answer")
            raise _NoValue("memory" if result.error == "MemoryError" else "error")
        return result.value
    if kind == "cmp":
        ops, operands = tree[1], tree[2]
        left = _evaluate(operands[0], results, run_status)
        for op, operand in zip(ops, operands[1:]):
            right = _evaluate(operand, results, run_status)
            if not _compare(op, left, right):
                return False
            left = right
        return True
    if kind in ("and", "or"):
        value = None
        for item in tree[1]:
            value = _evaluate(item, results, run_status)
            if bool(value) != (kind == "and"):
                return value
        return value
    if kind == "not":
        return not _evaluate(tree[1], results, run_status)
    if kind in ("neg", "pos"):
        value = _number(_evaluate(tree[1], results, run_status))
        return -value if kind == "neg" else +value
    if kind == "bin":
        a = _number(_evaluate(tree[2], results, run_status))
        b = _number(_evaluate(tree[3], results, run_status))
        return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b,
                "//": lambda: a // b, "%": lambda: a % b}[tree[1]]()
    if kind == "item":
        return _evaluate(tree[1], results, run_status)[tree[2]]
    if kind == "call":
        args = [_evaluate(a, results, run_status) for a in tree[2]]
        value = _FUNCTIONS[tree[1]](*args, **dict(tree[3]))
        if isinstance(value, (list, tuple, set, frozenset, str)) and len(value) > MAX_ITEMS:
            raise ValueError("result too large")
        return value
    raise AssertionError(f"unknown node {kind!r}")


def _number(value: Any) -> Any:
    if type(value) not in (*_NUMBERS, bool):
        raise TypeError("arithmetic is judged on numbers only")
    if type(value) is int and value.bit_length() > 100_000:
        raise ValueError("number too large")
    return value


def _compare(op: str, left: Any, right: Any) -> bool:
    if op == "==":
        return left == right
    if op == "!=":
        return left != right
    if op == "<":
        return left < right
    if op == "<=":
        return left <= right
    if op == ">":
        return left > right
    if op == ">=":
        return left >= right
    if op == "in":
        return left in right
    if op == "not in":
        return left not in right
    if op == "is":
        return left is right
    return left is not right


# ----------------------------------------------------------------------------- the results channel
def decode_value(encoded: Any) -> Any:
    """A plain value from its JSON form (``sandbox_child._child_encode``); ValueError if malformed."""
    budget = [MAX_ITEMS]

    def walk(node: Any, depth: int) -> Any:
        budget[0] -= 1
        if depth > MAX_DEPTH or budget[0] < 0:
            raise ValueError("result too deep or too large")
        if node is None or type(node) in (bool, int, float, str):
            return node
        if type(node) is list:
            return [walk(x, depth + 1) for x in node]
        if type(node) is not dict or len(node) != 1:
            raise ValueError("malformed result")
        (tag, body), = node.items()
        if tag == "int" and type(body) is str:
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
        if tag in ("tuple", "set", "frozenset") and type(body) is list:
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](walk(x, depth + 1) for x in body)
        if tag == "dict" and type(body) is list:
            pairs = [walk(x, depth + 1) for x in body]
            if not all(type(p) is list and len(p) == 2 for p in pairs):
                raise ValueError("malformed dict")
            return {k: v for k, v in pairs}
        raise ValueError(f"unknown tag {tag!r}")

    return walk(encoded, 0)


def parse_results(data: bytes, num_calls: int) -> tuple[dict, list[CallResult | None]]:
    """``(layers, results)`` from what the sandbox wrote to its results pipe.

    The first line is the set-up report, written before the program started; each further line
    is one call's result. The program can write to the pipe too: anything malformed is ignored
    (that call then has no result), and only the first result of each call counts. Never raises.
    """
    lines = data.split(b"\n")
    layers: dict = {}
    try:
        head = json.loads(lines[0])
        if type(head) is dict and type(head.get("layers")) is dict:
            layers = {str(k): v is True for k, v in head["layers"].items()}
    except Exception:  # noqa: BLE001 (set-up died before reporting)
        pass
    results: list[CallResult | None] = [None] * num_calls
    for line in lines[1:]:
        try:
            record = json.loads(line)
            index = record["i"]
            if type(index) is not int or not 0 <= index < num_calls or results[index] is not None:
                continue
            if "value" in record:
                results[index] = CallResult(True, decode_value(record["value"]))
            elif type(record.get("raised")) is str:
                results[index] = CallResult(False, error=record["raised"][:200])
        except Exception:  # noqa: BLE001 (garbage: that call has no result)
            continue
    return layers, results

