"""The trusted half of grading: what the sandbox is asked to compute, and how its answers are judged.

An assert test such as ``assert add(1, 2) == 3`` is split here, in the trainer, into

* *calls*: the sub-expressions that need the program (``add(1, 2)``). Only these are sent into the
  sandbox, which evaluates them after the program ran and sends back each result as plain data;
* a *trusted expression* around them (``<call 0> == 3``), evaluated here on the returned data.
  Nothing the program defines takes part in computing what its answers are compared with: the
  expected side (``math.sqrt(16)``, ``Counter("aab")``, ``sorted(...)``, ``float("inf")``) is
  evaluated here from the test text alone, its names resolved by ``sandbox_trusted`` (which also
  says which names are the program's). Inputs the test computes (``f(math.pi)``) are computed
  here too and sent as data. The expected value never enters the sandbox, so the program cannot
  read it, and nothing the program does in its own process (replacing ``__builtins__``, objects
  equal to everything, exit codes, frames) can turn a wrong answer into a pass.

Accepted shapes (anything else cannot be judged and the case scores 0, see ``compile_check``):

* a call is a name, attribute, call or subscript chain rooted at a program name whose arguments
  are literals, expressions of the trusted side, other calls, or list/tuple/set/dict displays of
  those: ``f(1, [2, 3])``, ``Solution().two_sum([2, 7], 9)``, ``f(Point(1, 2))``, ``CONSTANT``;
* around calls: literals, trusted names (``sandbox_trusted.TRUSTED``: builtins such as ``sorted``,
  ``set``, ``float``, ``type``; ``math.*``; ``collections.Counter``; ``string`` constants),
  displays; comparisons (``==  !=  <  <=  >  >=  in  not in``; ``is`` / ``is not`` with ``None``,
  ``True``, ``False`` or a type), never with the program on both sides of one operator;
  ``and``, ``or``, ``not``; unary ``-``/``+`` and ``+ - * / // %`` on numbers; subscripts and
  slices; keyword arguments of the trusted side.

Results come back as *plain data* (``sandbox_results``): None, bool, int, float, complex, str,
bytes, bytearray, list, tuple, dict, set, frozenset (subclasses, such as a namedtuple or a
Counter, as their base type). A call whose result is anything else fails. Comparison is Python's
own ``==`` on the decoded values, so ``1 == 1.0`` and ``True == 1`` hold, a tuple is not equal to
a list, and NaN equals nothing. When a call is the direct argument of a function that iterates it
(``list tuple set sorted sum min max any all`` ...), an iterator it returns (a generator, ``map``,
a dict view ...) is read into a list in the sandbox first, as Python would iterate it.

This module imports only the standard library (it is also loaded outside the verl package).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from verl.rewards.sandbox_codec import _child_encode
from verl.rewards.sandbox_results import (MAX_DEPTH, MAX_ITEMS, CallResult, TooCostly,  # noqa: F401 (re-exported)
                                          decode_value, parse_results)
from verl.rewards.sandbox_trusted import BOUNDED, ITERATING, Names, Resolved, bounded_int

_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset)


@dataclass(frozen=True)
class Call:
    """An expression the sandbox evaluates in the program's namespace after running it."""

    expression: str
    iterate: bool = False
    """Read an iterator result into a list before returning it (see the module docstring)."""
    values: tuple = ()
    """``((name, encoded value), ...)``: inputs computed by the trusted side, bound under these
    names while the expression is evaluated (encoded as results are)."""
    modules: tuple = ()
    """Standard-library modules the expression names, imported and bound for it."""


@dataclass(frozen=True)
class AssertPlan:
    """A compiled assert: the calls for the sandbox, and the trusted expression around them."""

    source: str
    calls: tuple[Call, ...]
    tree: tuple


class _Unjudgeable(Exception):
    """The assert has a shape the trusted side cannot evaluate; the message says why."""


class _NoValue(Exception):
    """A call needed by the expression has no plain result; ``status`` says why."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status


_COMPARE = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
            ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
_ARITHMETIC = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%"}
_UNARY = {ast.Not: "not", ast.USub: "neg", ast.UAdd: "pos"}
_DISPLAYS = {ast.List: "list", ast.Tuple: "tuple", ast.Set: "set"}


def compile_check(source: str, names: Names = Names()) -> tuple[AssertPlan | None, str]:
    """``(plan, "")`` for one ``assert`` statement, or ``(None, why)`` when it cannot be judged
    outside the sandbox (see the module docstring); such a case scores 0."""
    try:
        module = ast.parse(source, mode="exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None, "not Python"
    if len(module.body) != 1 or not isinstance(module.body[0], ast.Assert):
        return None, "not one assert statement"
    compiler = _Compiler(names)
    try:
        tree = compiler.expr(module.body[0].test)
        compiler.check_roots()
    except _Unjudgeable as why:
        return None, str(why)
    except RecursionError:
        return None, "nested too deeply"
    if not compiler.calls:
        return None, "it calls nothing of the program's"
    return AssertPlan(source, tuple(compiler.calls), tree), ""


def compile_assert(source: str, names: Names = Names()) -> AssertPlan | None:
    """The plan for one ``assert`` statement, or None when it cannot be judged (``compile_check``)."""
    return compile_check(source, names)[0]


def _literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _chain(node: ast.AST) -> tuple[str, tuple[str, ...]] | None:
    """``("math", ("pi",))`` for ``math.pi``; None unless ``node`` is a name or dotted name."""
    attributes: list[str] = []
    while isinstance(node, ast.Attribute):
        attributes.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return node.id, tuple(reversed(attributes))
    return None


class _Compiler:
    def __init__(self, names: Names):
        self.names = names
        self.calls: list[Call] = []
        self.roots: dict[str, Resolved] = {}  # the program names the assert uses

    # -- which parts depend on the program
    def resolve(self, node: ast.AST) -> Resolved | None:
        chain = _chain(node)
        return None if chain is None else self.names.resolve(*chain)

    def depends(self, node: ast.AST) -> bool:
        resolved = self.resolve(node)
        if resolved is not None:
            if resolved.kind == "program":
                self.roots[resolved.qualified] = resolved
                return True
            return False
        if isinstance(node, ast.Attribute):
            return self.depends(node.value)
        return any([self.depends(child) for child in ast.iter_child_nodes(node)])  # every root recorded

    def check_roots(self) -> None:
        if len(self.roots) > 1:
            for root in self.roots.values():
                if root.shadows or not root.static:
                    why = "shadows a builtin or standard-library name" if root.shadows else "is not defined in its text"
                    raise _Unjudgeable(f"it uses several program names and `{root.qualified}` {why}, so the "
                                       f"program could compute what it is compared with")

    # -- the trusted expression
    def expr(self, node: ast.AST, iterate: bool = False) -> tuple:
        is_literal, value = _literal(node)
        if is_literal:
            return ("lit", value)
        dependent = self.depends(node)
        resolved = self.resolve(node)
        if resolved is not None and resolved.kind != "program":
            if resolved.kind == "untrusted":
                raise _Unjudgeable(f"`{resolved.qualified}` is not evaluated on the trusted side")
            return ("lit", resolved.value)
        if isinstance(node, ast.Compare):
            return self.compare(node)
        if isinstance(node, ast.BoolOp):
            return ("and" if isinstance(node.op, ast.And) else "or", tuple(self.expr(v) for v in node.values))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return (_UNARY[type(node.op)], self.expr(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            return ("bin", _ARITHMETIC[type(node.op)], self.expr(node.left), self.expr(node.right))
        if isinstance(node, ast.Subscript) and not self.depends(node.slice):
            return ("item", self.expr(node.value), self.index(node.slice))
        if type(node) in _DISPLAYS:
            return ("display", _DISPLAYS[type(node)], tuple(self.expr(e) for e in self.plain_elements(node.elts)))
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                raise _Unjudgeable("`**` in a dict display")
            return ("dict", tuple(self.expr(k) for k in node.keys), tuple(self.expr(v) for v in node.values))
        if isinstance(node, ast.Call):
            function = self.resolve(node.func)
            if function is not None and function.kind == "trusted" and callable(function.value):
                return self.trusted_call(node, function)
            if function is not None and function.kind == "untrusted" and not dependent:
                raise _Unjudgeable(f"`{function.qualified}` is not evaluated on the trusted side")
        if dependent and self.is_leaf(node):
            return self.leaf(node, iterate)
        raise _Unjudgeable(f"`{_short(node)}` has a shape the trusted side does not evaluate")

    def compare(self, node: ast.Compare) -> tuple:
        sides = [node.left, *node.comparators]
        ops = []
        for i, op in enumerate(node.ops):
            name = _COMPARE.get(type(op))
            if name is None:
                raise _Unjudgeable("an unknown comparison")
            if self.depends(sides[i]) and self.depends(sides[i + 1]):
                raise _Unjudgeable(f"both sides of `{name}` depend on the program, so it could compute "
                                   f"what it is compared with")
            ops.append(name)
        operands = [self.expr(side) for side in sides]
        for i, name in enumerate(ops):
            if name in ("is", "is not") and not any(
                    o[0] == "lit" and (any(o[1] is s for s in (None, True, False)) or isinstance(o[1], type))
                    for o in operands[i:i + 2]):
                raise _Unjudgeable("`is` with anything but None, True, False or a type")
        return ("cmp", tuple(ops), tuple(operands))

    def index(self, node: ast.AST) -> tuple:
        if isinstance(node, ast.Slice):
            return ("slice", tuple(("lit", None) if part is None else self.expr(part)
                                   for part in (node.lower, node.upper, node.step)))
        return self.expr(node)

    def trusted_call(self, node: ast.Call, function: Resolved) -> tuple:
        self.plain_elements(node.args)
        args = tuple(self.expr(a, iterate=(i == 0 and function.qualified in ITERATING)) for i, a in enumerate(node.args))
        keywords = []
        for keyword in node.keywords:
            if keyword.arg is None:
                raise _Unjudgeable("`**` in a call")
            keywords.append((keyword.arg, self.expr(keyword.value)))
        return ("call", BOUNDED.get(function.value, function.value), args, tuple(keywords))

    @staticmethod
    def plain_elements(elements: list[ast.AST]) -> list[ast.AST]:
        if any(isinstance(e, ast.Starred) for e in elements):
            raise _Unjudgeable("`*` unpacking")
        return elements

    # -- the calls sent to the sandbox
    def is_leaf(self, node: ast.AST) -> bool:
        """A reference into the program (``f``, ``a.b``, ``f(...)``, ``x[0]``) whose arguments are inputs."""
        if isinstance(node, ast.Name):
            return True
        if isinstance(node, ast.Attribute):
            return self.is_leaf(node.value)
        if isinstance(node, ast.Subscript):
            return self.is_leaf(node.value) and self.is_input(node.slice)
        if isinstance(node, ast.Call):
            return (self.is_leaf(node.func) and all(self.is_input(a) for a in node.args)
                    and all(k.arg is not None and self.is_input(k.value) for k in node.keywords))
        return False

    def is_input(self, node: ast.AST) -> bool:
        if not self.depends(node):
            return not isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp,
                                         ast.NamedExpr, ast.Starred, ast.Await, ast.Yield, ast.YieldFrom))
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return all(self.is_input(e) for e in node.elts)
        if isinstance(node, ast.Dict):
            return all(k is not None and self.is_input(k) for k in node.keys) and all(map(self.is_input, node.values))
        return self.is_leaf(node)

    def leaf(self, node: ast.AST, iterate: bool) -> tuple:
        values: list[tuple[str, Any]] = []
        modules: set[str] = set()
        rewritten = _Inputs(self, values, modules).visit(_copy(node))
        self.calls.append(Call(ast.unparse(rewritten), iterate, tuple(values), tuple(sorted(modules))))
        return ("leaf", len(self.calls) - 1)


class _Inputs(ast.NodeTransformer):
    """Replaces each input of a call that the trusted side can compute by a bound name holding its
    value; the rest stays as source (stdlib module roots in it are bound for the call)."""

    def __init__(self, compiler: _Compiler, values: list, modules: set):
        self.compiler, self.values, self.modules = compiler, values, modules

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.expr) and not _literal(node)[0] and not self.compiler.depends(node):
            value = self.value_of(node)
            if value is not None:
                name = f"__verl_v{len(self.values)}"
                self.values.append((name, value))
                return ast.copy_location(ast.Name(name, ast.Load()), node)
            for child in ast.walk(node):
                chain = _chain(child)
                if chain is not None:
                    resolved = self.compiler.names.resolve(*chain)
                    if resolved.qualified.split(".")[0] == chain[0] != resolved.qualified and resolved.kind != "program":
                        self.modules.add(chain[0])
            return node
        return super().generic_visit(node)

    def value_of(self, node: ast.AST) -> Any:
        """The encoded value of a trusted input, or None when it is not exactly plain data."""
        try:
            value = _evaluate(self.compiler.expr(node), [], "ok")
        except Exception:  # noqa: BLE001 (it raises as Python would: leave it to the sandbox)
            return None
        if not _exactly_plain(value, 0):
            return None
        ok, encoded = _child_encode(value, False)
        return encoded if ok else None


def _copy(node: ast.AST) -> ast.AST:
    return ast.parse(ast.unparse(node), mode="eval").body


def _exactly_plain(value: Any, depth: int) -> bool:
    if type(value) not in _PLAIN or depth > MAX_DEPTH:
        return False
    if isinstance(value, dict):
        return all(_exactly_plain(k, depth + 1) and _exactly_plain(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_exactly_plain(v, depth + 1) for v in value)
    return True


def _short(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


# ----------------------------------------------------------------------------------- judging
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
        return bounded_int({"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b,
                            "//": lambda: a // b, "%": lambda: a % b}[tree[1]]())
    if kind == "item":
        return _evaluate(tree[1], results, run_status)[_evaluate(tree[2], results, run_status)]
    if kind == "slice":
        return slice(*(_evaluate(part, results, run_status) for part in tree[1]))
    if kind == "display":
        items = [_evaluate(item, results, run_status) for item in tree[2]]
        return {"list": list, "tuple": tuple, "set": BOUNDED[set]}[tree[1]](items)
    if kind == "dict":
        keys = [_evaluate(k, results, run_status) for k in tree[1]]
        return BOUNDED[dict](list(zip(keys, [_evaluate(v, results, run_status) for v in tree[2]])))
    if kind == "call":
        args = [_evaluate(a, results, run_status) for a in tree[2]]
        value = tree[1](*args, **{k: _evaluate(v, results, run_status) for k, v in tree[3]})
        if isinstance(value, (list, tuple, set, frozenset, str)) and len(value) > MAX_ITEMS:
            raise TooCostly("result too large")
        return value
    raise AssertionError(f"unknown node {kind!r}")


def _number(value: Any) -> Any:
    if type(value) not in (int, float, complex, bool):
        raise TypeError("arithmetic is judged on numbers only")
    return bounded_int(value)


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
