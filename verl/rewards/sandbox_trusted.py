"""What an assert may compute on the trusted side, and which of its names belong to the program.

In ``assert f(16) == math.sqrt(16)`` only ``f`` is the program's: ``math.sqrt(16)`` is the
expected side and is computed here, in the trainer, from the test text alone. Were it sent into the
sandbox, the program could answer it too (replacing ``__builtins__``, binding ``math`` to an object
of its own ...) and pass with a wrong ``f``. So every name of an assert is resolved here, in this
order, the first rule that applies deciding:

1. a name the test itself imports (``import math``, ``from math import sqrt`` among the asserts, or
   the ground truth's ``imports``): the stdlib object it names, whatever the program does;
2. a name the program binds itself (``def``, ``class``, an assignment, a loop or ``with`` target,
   found in the program's text without running it): the program's;
3. a name the program binds only by importing it from the standard library: that stdlib object;
4. a builtin (``sorted``, ``float``, ``set`` ...), a stdlib module used with an attribute
   (``math.pi``, ``collections.Counter``), or one of the few names tests commonly use bare
   (``Counter``, ``OrderedDict``, ``sqrt``, ``pi``, ``inf``, ``isclose``): that object;
5. anything else: the program's (it may define it at run time).

Names under rules 1, 3 and 4 are evaluated here when they are in ``TRUSTED`` (pure functions
wrapped so that their cost is bounded whatever the program returned, constants and types);
others cannot be evaluated, so an assert that needs them outside the program's calls cannot be
judged. An assert may name several program names (``f(Point(1, 2))``) only when the program's text
defines each of them and none shadows a trusted name (rule 2 over rule 4: ``def sqrt``); a name
defined at run time, or a shadowing one, must be the assert's only program name (it is then the
function under test). So a program cannot supply both an answer and what it is compared with.
Star imports bind nothing here: their names resolve by rules 4 and 5.

This module imports only the standard library (it is also loaded outside the verl package).
"""

from __future__ import annotations

import ast
import builtins
import collections
import json
import math
import signal
import string
import sys
from dataclasses import dataclass
from typing import Any

from verl.rewards.sandbox_results import MAX_ITEMS, TooCostly, check_hashes

MAX_BITS = 100_000
"""Largest integer (in bits) the trusted side computes with."""
MAX_COMBINATORIAL = 10_000
"""Largest argument of factorial, comb and perm evaluated here."""
MAX_MODULAR_POWER = 2**34
"""Most work of a three-argument ``pow`` evaluated here: bits of the exponent times the square of the
modulus's bits (at least 64), each step a multiplication and a division of the modulus's size. At the
bound ~0.07 s; a 2,000-bit exponent with a modulus of 100,000 bits (both within ``MAX_BITS``) held the
trainer's GIL for ~80 s."""


def bounded_int(value: Any) -> Any:
    if type(value) is int and value.bit_length() > MAX_BITS:
        raise TooCostly("number too large")
    return value


def _sized(value: Any) -> Any:
    if isinstance(value, (list, tuple, set, frozenset, dict, str, bytes, bytearray, range)) and len(value) > MAX_ITEMS:
        raise TooCostly("result too large")
    return value


def _hashed(factory, what: str):
    """``factory`` (set, frozenset, dict, Counter, OrderedDict) with the collision bound applied."""
    def build(*args, **kwargs):
        if args and not isinstance(args[0], dict):  # a dict's keys were bounded when it was built
            items = list(args[0])
            _sized(items)
            keys = items if what in ("set", "frozenset", "Counter") else [pair[0] for pair in items]
            check_hashes(keys, what)
            args = (items,) + args[1:]
        return factory(*args, **kwargs)
    build.__name__ = what
    return build


def _checked_sum(values, start=0):
    values = list(values)
    if not all(type(v) in (int, float, complex, bool) for v in [start, *values]):
        raise TypeError("sum() is judged on numbers only")
    return bounded_int(sum(values, start))


def _checked_round(number, ndigits=None):
    if ndigits is not None and (type(ndigits) is not int or abs(ndigits) > 400):
        raise ValueError("round() digits out of range")
    return round(number, ndigits)


def _checked_pow(base, exponent, modulus=None):
    if modulus is None and type(exponent) is int and type(base) is int and abs(base) > 1 and (
            exponent > MAX_BITS or base.bit_length() * exponent > MAX_BITS):
        raise TooCostly("power too large")
    if type(modulus) is int and type(exponent) is int and (
            exponent.bit_length() * max(64, modulus.bit_length()) ** 2 > MAX_MODULAR_POWER):
        raise TooCostly("modular power too costly")
    return pow(bounded_int(base), bounded_int(exponent), bounded_int(modulus))


def _checked_range(*args):
    return _sized(range(*map(bounded_int, args)))


def _small(function, name: str):
    def call(*args):
        if any(type(a) is int and abs(a) > MAX_COMBINATORIAL for a in args):
            raise TooCostly(f"{name}() argument too large")
        return function(*args)
    call.__name__ = name
    return call


def _checked_bytes(factory):
    def build(*args):
        if args and isinstance(args[0], int):
            raise TypeError("bytes(n) is not judged")  # it allocates n bytes
        return factory(*args)
    build.__name__ = factory.__name__
    return build


def _isclose(a, b, **tolerances):
    if any(type(x) not in (int, float, bool) for x in (a, b)):
        raise TypeError("math.isclose() takes real numbers")
    return math.isclose(a, b, **tolerances)


def _checked_prod(values, start=1):
    values = list(values)
    if sum(int(v).bit_length() if type(v) in (int, bool) else 64 for v in values) > MAX_BITS:
        raise TooCostly("product too large")
    return math.prod(values, start=start)


def _type(value):
    return type(value)  # one argument only: type(name, bases, dict) would build a class


def _checked_int(*args, **kwargs):
    # int() of a string in a power-of-two base has no digit limit: 4 MiB of hex made a 16-million-bit
    # integer here (in ~5 ms), on which divmod or isqrt take minutes. Linear to build, refused once built.
    return bounded_int(int(*args, **kwargs))


def _checked_str(*args):
    if args and type(args[0]) is int:
        bounded_int(args[0])  # int -> str is quadratic in the digits
    return str(*args)


_FUNCTIONS = {name: getattr(builtins, name) for name in (
    "abs", "all", "any", "bin", "bool", "bytes", "bytearray", "chr", "complex", "dict", "divmod", "enumerate", "float",
    "frozenset", "hex", "int", "isinstance", "len", "list", "max", "min", "oct", "ord", "pow", "range", "reversed",
    "round", "set", "sorted", "str", "sum", "tuple", "type", "zip")}
_FUNCTIONS.update({"collections.Counter": collections.Counter, "collections.OrderedDict": collections.OrderedDict,
                   "math.isclose": math.isclose, "math.prod": math.prod, "math.factorial": math.factorial,
                   "math.comb": math.comb, "math.perm": math.perm})
_FUNCTIONS.update({f"math.{name}": getattr(math, name) for name in (
    "acos", "asin", "atan", "atan2", "ceil", "copysign", "cos", "degrees", "dist", "exp", "fabs", "floor", "fmod",
    "fsum", "gcd", "hypot", "isfinite", "isinf", "isnan", "isqrt", "lcm", "log", "log10", "log1p", "log2", "modf",
    "radians", "remainder", "sin", "sqrt", "tan", "trunc")})
_CONSTANTS = {f"math.{name}": getattr(math, name) for name in ("pi", "e", "tau", "inf", "nan")}
_CONSTANTS.update({f"string.{name}": getattr(string, name) for name in (
    "ascii_letters", "ascii_lowercase", "ascii_uppercase", "digits", "hexdigits", "octdigits", "punctuation",
    "printable", "whitespace")})
_CONSTANTS["sys.maxsize"] = sys.maxsize
# Functions are trusted objects too; the types among them (int, set, dict ...) are the real types,
# so that type() and isinstance() compare with them. Calls go through BOUNDED where it has an entry.
TRUSTED: dict[str, Any] = {**_FUNCTIONS, **_CONSTANTS}
"""Qualified name -> the object the trusted side uses for it."""
BOUNDED: dict[Any, Any] = {
    set: _hashed(set, "set"), frozenset: _hashed(frozenset, "frozenset"), dict: _hashed(dict, "dict"),
    collections.Counter: _hashed(collections.Counter, "Counter"),
    collections.OrderedDict: _hashed(collections.OrderedDict, "OrderedDict"),
    bytes: _checked_bytes(bytes), bytearray: _checked_bytes(bytearray), range: _checked_range, pow: _checked_pow,
    round: _checked_round, sum: _checked_sum, type: _type, str: _checked_str, int: _checked_int,
    math.isclose: _isclose,
    math.prod: _checked_prod, math.factorial: _small(math.factorial, "factorial"), math.comb: _small(math.comb, "comb"),
    math.perm: _small(math.perm, "perm")}
"""Trusted callable -> the version whose cost is bounded whatever the program returned."""
ITERATING = frozenset({"list", "tuple", "set", "frozenset", "sorted", "sum", "min", "max", "any", "all",
                       "enumerate", "reversed", "zip", "collections.Counter", "math.fsum", "math.prod"})
"""Functions that iterate their first argument (a generator result is then read into a list)."""
BARE = {"Counter": "collections.Counter", "OrderedDict": "collections.OrderedDict", "sqrt": "math.sqrt",
        "pi": "math.pi", "inf": "math.inf", "isclose": "math.isclose"}
"""Names that tests commonly use without importing them, and what they are taken to mean."""

_BUILTINS = frozenset(dir(builtins))
_STDLIB = frozenset(sys.stdlib_module_names)


@dataclass(frozen=True)
class Resolved:
    """What a name (with its attribute chain) of an assert refers to."""

    kind: str
    """``program``, ``trusted`` (``value`` is the object) or ``untrusted`` (stdlib or builtin, but
    not evaluated here)."""
    qualified: str = ""
    value: Any = None
    shadows: bool = False
    """A program name that hides a trusted one (``def sqrt``)."""
    static: bool = False
    """A program name that the program's text binds (rule 2), rather than one it may define at
    run time (rule 5)."""


@dataclass(frozen=True)
class Names:
    """The resolver of one sample: the test's own imports and the program's static bindings."""

    declared: tuple = ()
    """``((name, qualified), ...)`` from the test's imports."""
    bound: tuple = ()
    """``((name, qualified or ""), ...)`` bound by the program: ``""`` when it defines the name
    itself, the stdlib name when it only imports it."""

    def resolve(self, name: str, attributes: tuple[str, ...] = ()) -> Resolved:
        declared, bound = dict(self.declared), dict(self.bound)
        if name in declared:
            return _lookup(declared[name], attributes)
        trusted = name in _BUILTINS or name in BARE or (attributes and name in _STDLIB)
        if name in bound and bound[name] == "":
            return Resolved("program", name, shadows=bool(trusted), static=True)
        if name in bound:
            return _lookup(bound[name], attributes)
        if name in _BUILTINS:
            return _lookup(name, attributes)
        if attributes and name in _STDLIB:
            return _lookup(name, attributes)
        if name in BARE:
            return _lookup(BARE[name], attributes)
        return Resolved("program", name)


def _lookup(qualified: str, attributes: tuple[str, ...]) -> Resolved:
    full = ".".join((qualified, *attributes))
    if full in TRUSTED:
        return Resolved("trusted", full, TRUSTED[full])
    return Resolved("untrusted", full)


def _stdlib(module: str) -> bool:
    return module.split(".")[0] in _STDLIB


def imports_of(statements: list[ast.stmt]) -> dict[str, str]:
    """``name -> qualified`` for the import statements among ``statements``; a module outside the
    standard library maps to ``"<module>.name"`` (never trusted)."""
    names: dict[str, str] = {}
    for node in statements:
        if isinstance(node, ast.Import):
            for alias in node.names:
                module = alias.name if _stdlib(alias.name) else f"<{alias.name}>"
                if alias.asname:
                    names[alias.asname] = module
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top if _stdlib(top) else f"<{top}>"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            module = node.module if _stdlib(node.module) else f"<{node.module}>"
            for alias in node.names:
                if alias.name == "*":
                    if module in ("math", "string", "collections"):
                        names.update({n: f"{module}.{n}" for n in dir(sys.modules[module]) if not n.startswith("_")})
                    continue
                names[alias.asname or alias.name] = f"{module}.{alias.name}"
    return names


def program_bindings(code: str) -> dict[str, str] | None:
    """The names the program's text binds at module level: ``""`` for those it defines itself,
    the stdlib name for those it only imports. Found without running anything; None for a
    program that does not parse."""
    try:
        module = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    imported: dict[str, str] = {}
    defined: set[str] = set()
    todo: list[ast.AST] = list(module.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name, qualified in imports_of([node]).items():
                if qualified.startswith("<") or name in imported and imported[name] != qualified:
                    defined.add(name)
                imported[name] = qualified
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
            todo.extend(node.decorator_list)  # their bodies bind nothing at module level
            continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            defined.add(node.id)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            defined.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            defined.add(node.rest)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            defined.add(node.name)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            defined.update(node.names)
        todo.extend(ast.iter_child_nodes(node))
    return {**{n: q for n, q in imported.items() if n not in defined}, **dict.fromkeys(defined, "")}


MAX_PARSED_HERE = 8 * 1024
"""Longest program (in characters) whose text the trainer parses in its own process. A longer one is
parsed by a helper process under the run's CPU, memory and wall limits: the parser holds the GIL,
and its time grows faster than the text for some shapes (120 KB of f-string fields took ~2 s,
600 KB ~40 s)."""

_HELPER = r"""
import ctypes, json, os, resource, sys, types
zero = ctypes.c_ulong(0)
ctypes.CDLL(None).prctl(4, zero, zero, zero, zero)  # not dumpable before the program is read (see _bindings_elsewhere)
cpu, memory, rewards = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
try:  # the first the OOM killer takes, before the trainer, as every sandbox run (sandbox_child)
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
except OSError:
    pass
for name, path in (("verl", os.path.dirname(rewards)), ("verl.rewards", rewards)):
    module = types.ModuleType(name)  # the packages' __init__ files import torch: skip them
    module.__path__ = [path]
    sys.modules[name] = module
from verl.rewards.sandbox_trusted import program_bindings
job = json.loads(sys.stdin.buffer.read())
bound = program_bindings(job["code"])
used = set(job["used"])
sys.stdout.write(json.dumps(None if bound is None else {n: q for n, q in bound.items() if n in used}))
"""


def _bindings_elsewhere(code: str, used: frozenset[str], cpu_seconds: float, memory_bytes: int,
                        wall_seconds: float) -> dict[str, str] | None:
    """``program_bindings`` (restricted to ``used``) computed by a helper process; ``TooCostly`` when
    the parse did not finish within the limits (the sandbox, which compiles the same text under the
    same limits, could not run it either), None when it failed otherwise (as for text that does not
    parse)."""
    import os
    import subprocess

    from verl.rewards.sandbox import _memfd

    job = json.dumps({"code": code, "used": sorted(used)}).encode("utf-8", "surrogatepass")
    # Another sample's program, read by a process of the trainer's uid that is dumpable until it has started: in
    # a plain user's weak mode without Landlock a sandbox run read the trainer's environment from this helper's
    # /proc/<pid>/environ. So: no environment of the trainer's, the job in a file no process can open again
    # (mode 0), read only once the helper is non-dumpable.
    stdin = _memfd("verl-parse", job)  # filled, rewound and sealed
    try:
        os.fchmod(stdin, 0)
        done = subprocess.run([sys.executable, "-I", "-B", "-c", _HELPER, str(max(1, int(cpu_seconds))),
                               str(memory_bytes), os.path.dirname(os.path.abspath(__file__))],
                              stdin=stdin, capture_output=True, timeout=wall_seconds, cwd="/",
                              env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})
    except subprocess.TimeoutExpired:
        raise TooCostly("the program's text took too long to parse") from None
    finally:
        os.close(stdin)
    if done.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        raise TooCostly("the program's text took too long to parse")
    try:
        bound = json.loads(done.stdout) if done.returncode == 0 else None
    except ValueError:
        return None
    if bound is not None and not (type(bound) is dict and all(type(v) is str for v in bound.values())):
        return None
    return bound


def names_for(code: str, declared: dict[str, str], used: frozenset[str], *, cpu_seconds: float = 5,
              memory_bytes: int = 512 * 2**20, wall_seconds: float = 5.0) -> Names:
    """The resolver for a program, restricted to the names the asserts ``used`` (so that plans
    can be cached across programs that bind those names alike). A program longer than
    ``MAX_PARSED_HERE`` is parsed in a helper process under these limits (``TooCostly`` if it
    does not finish in them)."""
    if len(code) > MAX_PARSED_HERE:
        bound = _bindings_elsewhere(code, used, cpu_seconds, memory_bytes, wall_seconds)
    else:
        bound = program_bindings(code)
    if bound is None:  # it cannot run, so it cannot answer anything: its failure is the program's, not the test's
        bound = {n: "" for n in used if n not in _BUILTINS and n not in BARE and n not in _STDLIB}
    return Names(tuple(sorted((n, q) for n, q in declared.items() if n in used)),
                 tuple(sorted((n, q) for n, q in bound.items() if n in used)))
