"""The trusted half of grading (verl/rewards/sandbox_verdict.py): asserts are split into calls for
the sandbox and an expression judged here; results come back as plain data and are parsed without
ever raising. Most of these run no sandbox; the few that do are marked in their names."""

import ast
import json
import math
import os
from collections import Counter, OrderedDict, namedtuple

import pytest

from verl.rewards import sandbox
from verl.rewards.sandbox import SandboxLimits, run_python
from verl.rewards.sandbox_codec import _child_encode
from verl.rewards.sandbox_trusted import names_for
from verl.rewards.sandbox_verdict import Call, CallResult, compile_assert, compile_check, decode_value, judge, parse_results
from verl.rewards.sandbox_workdir import remove_tree
from verl.rewards.scorers.code import compute_score

LIMITS = SandboxLimits(wall_seconds=3, cpu_seconds=3, memory_bytes=256 * 2**20)
EXTRA = {"sandbox": {"wall_seconds": 3, "cpu_seconds": 3, "memory_bytes": 256 * 2**20}}
# The program the compile-only cases stand for: it defines every function and class they call.
PROGRAM = "\n".join(f"def {name}(*args, **kwargs):\n    pass" for name in (
    "add", "f", "g", "is_prime", "area", "common", "rev", "root")) + "\nclass Solution: pass\nclass Point: pass\nANSWER = 42\n"


def plan_of(source, program=PROGRAM, imports=None):
    try:
        used = frozenset(node.id for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name))
    except SyntaxError:
        used = frozenset()
    return compile_check(source, names_for(program, imports or {}, used))[0]


def roundtrip(value, iterate=False):
    ok, payload = _child_encode(value, iterate)
    assert ok, payload
    return decode_value(json.loads(json.dumps(payload)))


def verdict(source, *values, run_status="ok"):
    plan = plan_of(source)
    assert plan is not None, source
    results = [v if isinstance(v, CallResult) or v is None else CallResult(True, v) for v in values]
    return judge(plan, results, run_status)


@pytest.mark.parametrize("source, calls", [
    ("assert add(1, 2) == 3", ["add(1, 2)"]),
    ("assert 3 == add(1, 2)", ["add(1, 2)"]),
    ("assert add(a=1, b=[2, (3, 4)]) == 3, 'message'", ["add(a=1, b=[2, (3, 4)])"]),
    ("assert Solution().two_sum([2, 7], 9) == [0, 1]", ["Solution().two_sum([2, 7], 9)"]),
    ("assert f(Point(1, 2), {'k': g(3)}) == 4", ["f(Point(1, 2), {'k': g(3)})"]),
    ("assert f(1)[0] == 2", ["f(1)"]),
    ("assert sorted(f(1))[0] == 2", ["f(1)"]),
    ("assert f(g(1)[0]).x == 2", ["f(g(1)[0]).x"]),
    ("assert sorted(f(1))[:2] == [1, 2]", ["f(1)"]),
    ("assert is_prime(7)", ["is_prime(7)"]),
    ("assert not is_prime(8) and f(1) is None", ["is_prime(8)", "f(1)"]),
    ("assert math.isclose(area(2), 12.566, rel_tol=1e-3)", ["area(2)"]),
    ("assert abs(area(2) - 12.566) < 1e-3", ["area(2)"]),
    ("assert set(common((1, 2), (2, 3))) == set((2,))", ["common((1, 2), (2, 3))"]),
    ("assert isinstance(f(1), (list, tuple)) and len(f(1)) == 2", ["f(1)", "f(1)"]),
    ("assert f(-1) == float('inf')", ["f(-1)"]),
    ("assert ANSWER == 42", ["ANSWER"]),
    ("assert sorted(f(1), key=len) == []", ["f(1)"]),                 # a trusted function as a keyword
    ("assert f(16) == math.sqrt(16)", ["f(16)"]),                     # the expected side stays here
    ("assert f(1) == Counter('aab') == collections.Counter('aba')", ["f(1)"]),
    ("assert type(f(1)) is int and f(2) == [string.digits, sys.maxsize]", ["f(1)", "f(2)"]),
    ("assert next(f(3)) == 1", ["next(f(3))"]),                       # a builtin applied to the program's value
    ("assert f(1)[1:-1] == (2,)", ["f(1)"]),
])
def test_judgeable_asserts_send_only_the_calls_into_the_sandbox(source, calls):
    plan = plan_of(source)
    assert plan is not None and [c.expression for c in plan.calls] == calls


def test_inputs_the_test_computes_are_computed_here_and_sent_as_data():
    call, = plan_of("assert f(math.pi, float('-inf'), sorted({3, 1}), 2) == 0").calls
    assert call.expression == "f(__verl_v0, __verl_v1, __verl_v2, 2)"
    assert call.values == (("__verl_v0", math.pi), ("__verl_v1", {"float": "-inf"}), ("__verl_v2", [1, 3]))
    call, = plan_of("assert f(collections.Counter('ab'), str) == 0").calls  # not plain data: left as source
    assert call.expression == "f(collections.Counter('ab'), str)" and call.modules == ("collections",)


def test_a_program_cannot_compute_what_it_is_compared_with():
    """Names on the expected side resolve to the standard library whatever the program binds at
    run time; where the program binds one in its text, it may not also be compared with it."""
    hijacker = "__builtins__ = {}\nglobals()['sqrt'] = lambda x: 0\ndef f(x):\n    return 0\n"
    assert [c.expression for c in plan_of("assert f(16) == sqrt(16)", hijacker).calls] == ["f(16)"]
    shadowing = "def sqrt(x):\n    return 0\ndef f(x):\n    return 0\n"
    for source in ("assert f(16) == sqrt(16)", "assert f(16) - sqrt(16) < 1e-9", "assert abs(f(16) - sqrt(16)) < 1"):
        plan, why = compile_check(source, names_for(shadowing, {}, frozenset({"f", "sqrt"})))
        assert plan is None and "program" in why, why
    # declared by the test: the stdlib's, even though the program defines its own
    assert plan_of("assert f(16) == sqrt(16)", shadowing, {"sqrt": "math.sqrt"}) is not None
    # the program's function under test may be named like a stdlib one when it is the only one
    assert [c.expression for c in plan_of("assert sqrt(16) == 4", shadowing).calls] == ["sqrt(16)"]
    fake_module = "class math:\n    sqrt = staticmethod(lambda x: 0)\ndef f(x):\n    return 0\n"
    assert plan_of("assert f(16) == math.sqrt(16)", fake_module) is None
    assert plan_of("assert f(16) == perm(3)", "from itertools import *\ndef f(x):\n    return 0\n") is None


@pytest.mark.parametrize("source", [
    "assert True",                                  # nothing of the program's
    "x = f(1)",                                     # not an assert
    "assert f(1) == 2\nassert f(2) == 3",           # two statements
    "assert f(1) ==",                               # not Python
    "assert check(f(1) == 3)",                      # the expected value would enter the sandbox
    "assert check(f(1), lambda: 3)",                # code from the test inside the sandbox
    "assert f(*args) == 1",
    "assert f(1) ** 2 == 4",                        # a power can take any time on the trusted side
    "assert f(1) is 5",                             # identity of anything but None/True/False
    "assert [x for x in f(1)] == [1]",
    "assert f(1) == g(1) != 3",                     # the program on both sides of ==
    "assert f(1) in g(2)",
    "assert f(3) == next(iter([1]))",               # next() is not evaluated on the trusted side
    "assert f(3) == math.frexp(8)",
    "assert f(3) == {**g(1)}",
    "assert f(1) if g else h",
])
def test_other_shapes_cannot_be_judged_and_have_no_plan(source):
    assert plan_of(source) is None


@pytest.mark.parametrize("source, values, passed", [
    ("assert f(1) == 1", [1.0], True),                       # Python's == on plain data
    ("assert f(1) == 1", [True], True),
    ("assert f(1) == (1, 2)", [[1, 2]], False),              # a list is not a tuple
    ("assert f(1) == [1, 2]", [[1, 2]], True),
    ("assert f(1) == {'a': (1, 2)}", [{"a": (1, 2)}], True),
    ("assert f(1) == float('nan')", [math.nan], False),
    ("assert f(1) != 3", [4], True),
    ("assert f(1) in (1, 2)", [2], True),
    ("assert 3 not in f(1)", [[1, 2]], True),
    ("assert f(1) is None", [CallResult(True, None)], True),
    ("assert f(1) is True", [1], False),
    ("assert math.isclose(f(1), 0.3)", [0.1 + 0.2], True),
    ("assert abs(f(1) - 0.5) < 1e-9", [0.5], True),
    ("assert abs(f(1) - 0.5) < 1e-9", ["0.5"], False),       # arithmetic on numbers only
    ("assert sorted(f(1)) == [1, 2, 3]", [[3, 1, 2]], True),
    ("assert set(f(1)) == set((4, 5))", [[5, 4, 4]], True),
    ("assert len(f(1)) == 2", [{"a": 1, "b": 2}], True),
    ("assert round(f(1), 2) == 3.14", [3.14159], True),
    ("assert f(1)", [[]], False),
    ("assert not f(1)", [0], True),
    ("assert isinstance(f(1), int)", [True], True),
    ("assert sum(f(1)) == 6", [[1, 2, 3]], True),
    ("assert sum(f(1), []) == [1]", [[[1]]], False),         # sum of lists: refused (quadratic)
    ("assert round(1.5, f(1)) == 2", [-10**9], False),       # a huge ndigits is refused, not computed
    ("assert f(16) == math.sqrt(16)", [4.0], True),
    ("assert f(16) == math.sqrt(16)", [0], False),
    ("assert f(1) == Counter('aab')", [{"a": 2, "b": 1}], True),
    ("assert type(f(1)) is list", [[1]], True),
    ("assert type(f(1)) == tuple", [[1]], False),
    ("assert f(1) == {1, 2.0}", [{1, 2}], True),
    ("assert f(1) == list(range(3))", [[0, 1, 2]], True),
    ("assert len(list(range(f(1)))) == 3", [10**18], False),  # the range would be too long to judge
    ("assert math.factorial(f(1)) > 0", [10**9], False),
    ("assert pow(2, f(1)) > 0", [10**12], False),
    ("assert pow(3, f(1), 1000000007) != -1", [2**99_999], True),  # a long exponent, a short modulus: cheap
    ("assert pow(f(1), 65537, f(2)) != -1", [3, 2**2048 - 159], True),  # RSA sizes: cheap
    # a 16-bit exponent and a 100,000-bit modulus, both returned: ~0.5 s here, ~80 s with a 2,000-bit exponent
    ("assert pow(3, f(1), f(2)) != -1", [2**16 - 1, 2**100_000 - 1], False),
])
def test_the_trusted_side_judges_plain_values_as_python_would(source, values, passed):
    assert verdict(source, *values)[0] is passed


def test_a_failure_says_why():
    assert verdict("assert f(1) == 2", 3) == (False, "wrong_answer")
    assert verdict("assert f(1) == 2", CallResult(False, error="user:MemoryError")) == (False, "error")
    assert verdict("assert f(1) == 2", CallResult(False, error="ValueError")) == (False, "error")
    assert verdict("assert f(1) == 2", CallResult(False, error="MemoryError")) == (False, "memory")
    assert verdict("assert f(1) == 2", CallResult(False, error="unplain:Anything")) == (False, "wrong_answer")
    assert verdict("assert f(1) == 2", None, run_status="timeout") == (False, "timeout")
    assert verdict("assert f(1) == 2", None, run_status="ok") == (False, "error")  # exited before it
    assert verdict("assert f(1) == 2 or g(1)", 2, None) == (True, "ok")  # short-circuits like Python


@pytest.mark.parametrize("value", [
    None, True, 0, -7, 2**53, -(3**400), 0.1, -0.0, math.inf, -math.inf, 1 + 2j, "", "é\ud800", b"\x00\xff",
    bytearray(b"ab"), [1, [2, [3]]], (1, (2,)), {(1, 2): {"x": frozenset({1})}}, {1, 2}, frozenset(),
])
def test_plain_values_survive_the_results_channel_with_their_types(value):
    back = roundtrip(value)
    assert back == value and type(back) is type(value)
    assert math.isnan(roundtrip(math.nan))


def test_subclasses_arrive_as_their_base_type_and_anything_else_is_refused():
    Point = namedtuple("Point", "x y")
    assert roundtrip(Point(1, 2)) == (1, 2) and type(roundtrip(Point(1, 2))) is tuple
    assert type(roundtrip(Counter("aab"))) is dict and roundtrip(OrderedDict(a=1)) == {"a": 1}

    class Liar(int):
        def __eq__(self, other):
            return True
        __hash__ = int.__hash__
    assert roundtrip(Liar(5)) == 5 and type(roundtrip(Liar(5))) is int
    assert _child_encode(object(), False) == (False, "unplain:object")
    assert _child_encode(iter([1, 2]), False)[0] is False
    assert roundtrip((x for x in [1, 2]), iterate=True) == [1, 2]
    looped = []
    looped.append(looped)
    with pytest.raises(ValueError):
        _child_encode(looped, False)


@pytest.mark.parametrize("line", [
    b"not json", b"[1, 2]", b'{"i": 0}', b'{"i": -1, "value": 1}', b'{"i": 5, "value": 1}', b'{"i": true, "value": 1}',
    b'{"i": 0, "value": {"tuple": 3}}', b'{"i": 0, "value": {"weird": 1}}', b'{"i": 0, "value": {"dict": [[[1], 2]]}}',
    b'{"i": 0, "value": ' + b"[" * 5000 + b"]" * 5000 + b"}", b'{"i": 0, "value": {"int": "zz"}}',
    b'{"i": 0, "value": ' + b"9" * 10000 + b"}", b"\xff\xfe", b'{"i": 0, "raised": 3}',
])
def test_garbage_on_the_results_channel_means_no_result_never_an_exception(line):
    layers, results = parse_results(b'{"layers": {"audit_hook": true}}\n' + line + b"\n", 1)
    assert layers == {"audit_hook": True} and results == [None]


def test_only_the_first_result_of_a_call_counts_and_the_report_is_only_the_first_line():
    data = (b'{"i": 0, "value": 1}\n{"layers": {"x": true}}\n'
            b'{"i": 0, "value": 2}\n{"i": 0, "value": 3}\n{"i": 1, "raised": "KeyError"}\n')
    layers, results = parse_results(data, 2)
    assert layers == {} and results == [CallResult(True, 2), CallResult(False, error="KeyError")]
    # A call's line is the first that begins as the harness's do, parsed or not: the trainer sent the next
    # call on seeing it, so a line written after that (the harness's own included) cannot replace it.
    data = b'{}\n{"value": 7, "i": 0}\n{"i": 0, "value": [\n{"i": 0, "value": 2}\n{"i": 1, "value": 3}\n'
    assert parse_results(data, 2)[1] == [None, CallResult(True, 3)]


def test_a_call_in_the_sandbox_sees_no_later_call_in_the_harness_frames_or_on_its_fds():
    """No audit event sees ``f_back``: a program walked from its own frame into the harness's, which held
    the whole job, and answered the first call knowing the inputs of the others (for an involution, one
    assert's input is another's expected output). Calls now come one at a time, each after the previous
    result came back; a program that reads the job's pipe itself takes only what was already sent."""
    code = ("import os, sys\nseen = []\ndef f(x):\n    frame, text = sys._getframe(0), ''\n    while frame is not None:\n"
            "        text += repr(frame.f_locals)\n        frame = frame.f_back\n    for fd in range(3, 64):\n"
            "        try:\n            os.set_blocking(fd, False)\n            text += repr(os.read(fd, 65536))\n"
            "        except OSError:\n            pass\n"
            "    return sorted({n for n in ('100', '200', '300') if 'f(' + n + ')' in text.replace(' ', '')})\n")
    result = run_python(code, limits=LIMITS, calls=["f(100)", "f(200)", "f(300)"])
    assert result.status == "ok", result.stderr
    seen = [set(r.value) for r in result.results]
    assert seen[0] == {"100"} and seen[1] <= {"100", "200"} and "200" in seen[1] and "300" in seen[2], seen


def test_sandbox_returns_results_as_plain_data_and_iterates_when_asked():
    code = ("def pairs(n):\n    return ((i, i * i) for i in range(n))\n"
            "class Box:\n    pass\n"
            "def boom():\n    raise KeyError('x')\n")
    result = run_python(code, limits=LIMITS, calls=[Call("pairs(3)", iterate=True), Call("pairs(3)"),
                                                     "Box()", "boom()", "{1: [2.5, None]}"])
    assert result.status == "ok", result.stderr
    assert result.results == [CallResult(True, [(0, 0), (1, 1), (2, 4)]),
                              CallResult(False, error="unplain:generator"), CallResult(False, error="unplain:Box"),
                              CallResult(False, error="KeyError"), CallResult(True, {1: [2.5, None]})]


def test_asserts_are_judged_in_one_run_each_with_its_own_verdict():
    code = "def rev(s):\n    return s[::-1] if len(s) < 5 else s\n"
    tests = {"assert": ["assert rev('ab') == 'ba'", "assert rev('abcdef') == 'fedcba'",
                        "assert sorted(rev('cab')) == ['a', 'b', 'c']", "assert rev('x') == 'x' == 'y'",
                        "assert [rev(c) for c in 'ab'] == ['a', 'b']"]}
    assert compute_score("code", code, tests, EXTRA) == {"score": 0.4, "passed": 2, "total": 5,
                                                         "status": "wrong_answer"}


def test_unjudgeable_asserts_score_zero_and_are_reported():
    result = compute_score("code", "def f(x):\n    return x\n", ["assert check(f(1) == 1)", "assert f(2) == 2"], EXTRA)
    assert result == {"score": 0.5, "passed": 1, "total": 2, "status": "unsupported"}
    assert compute_score("code", "x = 1", ["assert True"], EXTRA)["status"] == "unsupported"


def test_the_audit_hook_keeps_no_state_a_program_could_change(monkeypatch):
    """Everything the hook uses is bound as positional defaults (a tuple) and is immutable;
    nothing is a closure cell, a keyword default (a dict) or a global."""
    import sys

    namespace = {}
    exec(sandbox._CHILD_SOURCE.split("\n_state = ")[0], namespace)  # noqa: S102 (defines functions only)
    captured = []
    monkeypatch.setattr(sys, "addaudithook", captured.append)
    namespace["_child_audit_hook"](os.getcwd(), 97)
    hook, = captured
    functions = [hook] + [v for v in hook.__defaults__ if type(v) is type(hook)]
    assert len(functions) > 4
    attributes = {"startswith", "split", "join", "decode", "encode", "extend", "pop", "append", "st_mode", "st_dev",
                  "st_ino", "f_code", "co_filename", "f_back", "__code__", "__name__"}
    for function in functions:
        assert function.__closure__ is None and function.__kwdefaults__ is None, function.__name__
        assert set(function.__code__.co_names) <= attributes, (function.__name__, function.__code__.co_names)
        for value in function.__defaults__ or ():
            assert type(value) in (type(hook), type(len), str, int, tuple, frozenset, type), (function.__name__, value)


def test_a_run_directory_is_removed_whatever_the_run_left_in_it(tmp_path, monkeypatch):
    (tmp_path / "keep").write_text("outside, reached through a symlink")
    top = tmp_path / "run"
    top.mkdir()
    monkeypatch.chdir(top)
    for depth in range(3000):  # deeper than Python's recursion limit, and paths longer than PATH_MAX
        os.mkdir("d")
        os.chdir("d")
        if depth % 500 == 0:
            open("f", "w").close()
            os.symlink(tmp_path / "keep", "link")
            os.symlink(tmp_path, "dirlink")
    for depth in range(3000):
        os.chdir("..")
        if depth % 700 == 0:
            os.chmod("d", 0)
    monkeypatch.chdir(tmp_path)
    remove_tree(str(top))
    assert not top.exists() and (tmp_path / "keep").read_text().startswith("outside")


P = 2**61 - 1  # every multiple of it hashes to 0


def colliding(kind, n):
    if kind == "ints":
        return [P * (k + 1) for k in range(n)]
    if kind == "negative-ints":
        return [-P * (k + 1) - 1 for k in range(n)]  # hash(-1) == hash(-2): all hash to -2
    if kind == "tuples":
        return [(P * (k + 1),) for k in range(n)]
    return [frozenset({P * (k + 1)}) for k in range(n)]


@pytest.mark.parametrize("kind", ["ints", "negative-ints", "tuples", "frozensets"])
@pytest.mark.parametrize("container", ["set", "frozenset", "dict"])
def test_values_that_all_hash_alike_are_refused_before_any_set_is_built(kind, container):
    """20,000 such ints cost ~2 s of trainer CPU to rebuild as a set (40,000: ~9 s); refused after
    one sort. (Twice as many would already exceed the item budget of the line.)"""
    items = colliding(kind, 20_000)
    assert len({hash(x) for x in items[:100]}) == 1
    encoded = [_child_encode(x, False)[1] for x in items]  # as the sandbox would send such a container
    payload = {"dict": [[x, 0] for x in encoded]} if container == "dict" else {container: encoded}
    line = json.dumps({"i": 0, "value": payload}).encode()
    _, (result,) = parse_results(b"{}\n" + line + b"\n", 1)
    assert result == CallResult(False, error="unplain:too costly to judge")


def test_a_few_colliding_or_many_equal_elements_still_decode():
    assert roundtrip(set(colliding("ints", 32))) == set(colliding("ints", 32))
    assert verdict("assert set(f(1)) == {0}", [0] * 100_000) == (True, "ok")   # equal items share a hash harmlessly
    assert verdict("assert len(set(f(1))) == 100000", list(range(100_000))) == (True, "ok")


class Hashed(int):
    """An int that counts how often it is hashed: the work the collision check does."""

    hashed = [0]

    def __hash__(self):
        Hashed.hashed[0] += 1
        return int.__hash__(self)


def test_the_collision_check_hashes_each_item_a_bounded_number_of_times_whatever_its_runs():
    """Runs of equal items longer than MAX_SAME_HASH each cost a pass over every item: 6,000 runs of 33
    equal ints (198,000 items, one 1.2 MB result line) held the trainer's GIL for ~40 s."""
    from verl.rewards.sandbox_results import MAX_SAME_HASH, check_hashes

    items = [Hashed(k) for k in range(300) for _ in range(MAX_SAME_HASH + 1)]
    Hashed.hashed[0] = 0
    check_hashes(items)
    assert Hashed.hashed[0] <= 2 * len(items)  # the old check: ~300 * 9,900
    line = json.dumps({"i": 0, "value": {"set": [k for k in range(6000) for _ in range(MAX_SAME_HASH + 1)]}})
    _, (result,) = parse_results(b"{}\n" + line.encode() + b"\n", 1)
    assert result == CallResult(True, set(range(6000)))


@pytest.mark.parametrize("source", ["assert set(f(1)) == set()", "assert len(Counter(f(1))) == 0",
                                    "assert dict(f(1)) == {}", "assert frozenset(f(1)) == frozenset()"])
def test_the_trusted_side_refuses_to_build_colliding_sets_from_returned_lists(source):
    items = colliding("ints", 40_000)
    value = [[x, 0] for x in items] if "dict" in source else items
    assert verdict(source, value) == (False, "wrong_answer")


def test_parsing_is_bounded_by_the_item_count_before_json_builds_anything():
    import tracemalloc

    line = b'{"i": 0, "value": [' + b"0," * (2 * 2**20 - 20) + b'0]}'  # 4 MiB, two million values
    tracemalloc.start()
    _, (result,) = parse_results(b"{}\n" + line + b"\n", 1)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert result is None and peak < 32 * 2**20  # json.loads would have built ~100 MB of objects
    _, (ok,) = parse_results(b'{}\n{"i": 0, "value": [' + b"1," * 1000 + b'1]}\n', 1)
    assert ok == CallResult(True, [1] * 1001)
    _, results = parse_results(b"{}\n" + b'{"i": 0, "value": [1, 2]}\n' * 3 + b'{"i": 1, "value": [1, 2]}\n', 2,
                               max_items=8)  # the budget is for all lines of a run together
    assert results == [CallResult(True, [1, 2]), None]


def test_strings_do_not_count_as_items_and_cannot_hide_separators():
    text = "[, {" * 100_000
    ok, payload = _child_encode([text], False)
    _, (result,) = parse_results(b"{}\n" + json.dumps({"i": 0, "value": payload}).encode() + b"\n", 1)
    assert result == CallResult(True, [text])


@pytest.mark.parametrize("source, value, passed", [
    ("assert type(f(1)) == set", {1}, True),
    ("assert type(f(1)) is dict", {1: 2}, True),
    ("assert isinstance(f(1), (set, frozenset))", frozenset({1}), True),
    ("assert isinstance(f(1), dict) and type(f(1)) is not bytes", {1: 2}, True),
    ("assert isinstance(f(1), range)", [0], False),
    ("assert str(f(1)) == '1'", 1, True),
    ("assert len(str(f(1))) > 0", "2**90_000", False),          # int -> str of 27,000 digits: refused
    ("assert int(f(1), 16) == 255", "ff", True),
    ("assert divmod(int(f(1), 16), 3) != -1", "f" * 30_000, False),  # 120,000 bits, past what is computed with
    ("assert int(f(1), 0) > 0", "0b" + "1" * 100_001, False),
])
def test_trusted_types_are_the_real_types_and_their_calls_are_bounded(source, value, passed):
    value = 2**90_000 if value == "2**90_000" else value
    results = [CallResult(True, value)] * 2
    plan = plan_of(source)
    assert judge(plan, results[:len(plan.calls)], "ok")[0] is passed


@pytest.mark.parametrize("line", [
    b'{"i": 0, "value": ' + b"7" * 5000 + b"}",                    # decimal: quadratic to parse
    b'{"i": 0, "value": {"int": "0x' + b"f" * 30_000 + b'"}}',     # 120,000 bits
])
def test_numbers_too_large_to_judge_cheaply_are_no_result(line):
    _, (result,) = parse_results(b"{}\n" + line + b"\n", 1)
    assert result in (None, CallResult(False, error="unplain:too costly to judge"))
    just_under = b'{"i": 0, "value": [' + (b"7" * 4299 + b",") * 900 + b"1]}"  # the scan is a substring search
    _, (result,) = parse_results(b"{}\n" + just_under + b"\n", 1)
    assert result.ok and len(result.value) == 901


def test_a_program_that_does_not_parse_fails_as_an_error_not_as_an_unjudgeable_test():
    result = compute_score("code", "def f(p:\n    return 3\n", ["assert f(Point(1, 2)) == 3"], EXTRA)
    assert result["score"] == 0.0 and result["status"] == "error"


# A program's text is parsed in the trainer (which of its names the asserts may trust). The parser
# holds the GIL and some shapes cost it far more than their length: 600 KB of f-string fields took
# ~40 s of trainer CPU. A long program is parsed by a helper process under the run's limits.
SLOW_TO_PARSE = "def rev(s):\n    return s[::-1]\nx = f'" + "{1}" * 200_000 + "'\n"


def test_a_program_slow_to_parse_is_not_parsed_in_the_trainer_and_scores_zero_as_a_timeout(monkeypatch):
    from verl.rewards import sandbox_trusted

    parsed = []
    parse = sandbox_trusted.ast.parse
    monkeypatch.setattr(sandbox_trusted.ast, "parse", lambda text, *a, **k: parsed.append(len(text)) or parse(text, *a, **k))
    runs = []
    monkeypatch.setattr("verl.rewards.scorers.code.run_python", lambda *a, **k: runs.append(a))
    result = compute_score("code", SLOW_TO_PARSE, ["assert rev('ab') == 'ba'"],
                           {"sandbox": {"cpu_seconds": 1, "wall_seconds": 2}})
    assert result == {"score": 0.0, "passed": 0, "total": 1, "status": "timeout"}
    assert max(parsed, default=0) < sandbox_trusted.MAX_PARSED_HERE and runs == []  # nor run: it could not compile


@pytest.mark.parametrize("padding", [0, 20_000])
def test_a_long_program_resolves_its_names_as_a_short_one_does(monkeypatch, padding):
    from verl.rewards import sandbox_trusted

    program = ("import math as m\nfrom math import pi as PI, sqrt\nfrom json import *\nimport numpy as np\n"
               "def root(x):\n    return m.sqrt(x)\nclass Point: pass\nfor i in range(3): pass\n" + "#" * padding + "\n")
    used = frozenset({"root", "Point", "sqrt", "PI", "m", "np", "i", "dumps", "missing", "sorted"})
    here = names_for(program, {"math": "math"}, used)
    monkeypatch.setattr(sandbox_trusted, "MAX_PARSED_HERE", -1)  # every program through the helper
    assert names_for(program, {"math": "math"}, used) == here
    assert names_for("def broken(:\n" + "#" * padding, {}, used) == names_for("def broken(:\n", {}, used)
    program = program.replace("import numpy as np\n", "")  # (importing numpy is slow in a sandbox)
    assert compute_score("code", program, ["assert root(16) == 4.0", "assert root(16) == sqrt(16)"], EXTRA)["score"] == 1.0


def test_the_helper_that_parses_a_long_program_is_the_first_the_oom_killer_takes():
    # Like every sandbox run: many helpers at once must not make the trainer the OOM killer's choice.
    import json
    import os
    import subprocess
    import sys

    from verl.rewards import sandbox_trusted

    probe = sandbox_trusted._HELPER + "\nsys.stderr.write(open('/proc/self/oom_score_adj').read())\n"
    done = subprocess.run([sys.executable, "-I", "-B", "-c", probe, "5", str(512 * 2**20),
                           os.path.dirname(sandbox_trusted.__file__)],
                          input=json.dumps({"code": "x = 1\n", "used": ["x"]}).encode(), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"x": ""}  # it still parses: x is bound by the program
    assert done.stderr.decode().strip() == "1000"
