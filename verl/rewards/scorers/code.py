"""Code tasks: run the Python in a response against test cases in the sandbox; score = fraction passed.

The code is the last fenced block tagged ``python``/``py``/``python3`` (or untagged) in the
response, else the whole response. ``ground_truth`` holds the tests, as a JSON string or the
object itself, in one of two forms:

* stdin/stdout: ``{"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}``. Each case is one
  sandbox run given the input; it passes when the program exits 0 and its stdout equals the
  expected output, both with trailing whitespace stripped from every line and trailing blank
  lines dropped. The expected output stays here: it never enters the sandbox.
* asserts: ``{"assert": "assert add(1, 2) == 3"}``, ``{"assert": [...]}`` or a bare list of
  strings. Each assert is compiled here (``sandbox_verdict.compile_check``) into the calls the
  program must answer (``add(1, 2)``) and a trusted expression around them (``== 3``), which is
  evaluated here: nothing the program defines computes what it is compared with. The test's own
  imports (``import math``, ``from collections import Counter``) may stand among the asserts or
  under ``"imports"``; they are not cases, and the names they bind are the standard library's
  whatever the program does. One sandbox run executes the code, then every call, and returns
  the results as plain data, which are judged here. An assert of a shape that cannot be judged
  this way scores 0 for that case (status ``unsupported``; a warning names the first one and why).

The score is ``passed / total``. Two exceptions keep a bad sample cheap and unrewarded: a run that
the sandbox *blocks* (an attempted escape: socket, fork, write outside its directory ...) makes the
whole score 0, and after a stdin/stdout case *times out* the remaining cases are not run and count
as failed, so one sample waits for at most one wall limit (the asserts share one run, and so one
wall limit). The returned dict also carries ``passed``, ``total`` and ``status``: ``ok`` when all
passed, else the first failure's: a sandbox status, ``wrong_answer`` (ran fine, answered
something else) or ``unsupported``.

Limits: ``DEFAULT_LIMITS``, overridden per sample by ``extra_info["sandbox"]``, a dict of
``SandboxLimits`` fields (e.g. ``{"wall_seconds": 2, "memory_bytes": 268435456}``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import logging
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from verl.errors import RewardError
from verl.rewards.sandbox import SandboxLimits, run_python
from verl.rewards.sandbox_results import TooCostly
from verl.rewards.sandbox_trusted import Names, imports_of, names_for
from verl.rewards.sandbox_verdict import AssertPlan, compile_check, judge

logger = logging.getLogger(__name__)

DEFAULT_LIMITS = SandboxLimits(wall_seconds=5.0, cpu_seconds=5, memory_bytes=512 * 2**20)

_PYTHON_TAGS = ("", "python", "py", "python3")
_FORMATS = ('{"inputs": [stdin, ...], "outputs": [expected stdout, ...]}, '
            '{"assert": "assert f(1) == 2"} or {"assert": [...]} (optionally with "imports": '
            '["import math", ...]), or a list of assert strings (as the object or its JSON string)')


@dataclass(frozen=True)
class TestCase:
    """One stdin/stdout case (``expected_stdout`` set) or one assert case (``check`` set)."""

    __test__ = False  # not a pytest class, despite the name
    stdin: str = ""
    expected_stdout: str | None = None
    check: str | None = None


def extract_code(response: str) -> str:
    """The last fenced block tagged python/py/python3 or untagged (one cut off by the length limit
    included); the whole response if there is none."""
    blocks, current, tag = [], None, ""
    for line in response.splitlines():
        fence = line.strip()
        if fence.startswith("```") and current is None:
            current, tag = [], fence[3:].strip().lower()
        elif fence.startswith("```"):
            blocks.append((tag, "\n".join(current)))
            current = None
        elif current is not None:
            current.append(line)
    if current is not None:
        blocks.append((tag, "\n".join(current)))
    code = [text for tag, text in blocks if tag in _PYTHON_TAGS]
    return code[-1] if code else response


def parse_tests(ground_truth: Any) -> list[TestCase]:
    """The test cases ``ground_truth`` describes; RewardError naming the problem otherwise."""
    return _parse(ground_truth)[0]


def test_imports(ground_truth: Any) -> dict[str, str]:
    """``name -> qualified stdlib name`` for the imports the tests declare (``sandbox_trusted``)."""
    return _parse(ground_truth)[1]


def _parse(ground_truth: Any) -> tuple[list[TestCase], dict[str, str]]:
    tests = ground_truth
    if isinstance(tests, (str, bytes)):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError as e:
            raise RewardError(f"code ground_truth is not valid JSON ({e}): {ground_truth!r:.200}; "
                              f"expected {_FORMATS}") from None
    imports: list[str] = []
    if isinstance(tests, dict) and "assert" in tests:
        checks = tests["assert"]
        checks = [checks] if isinstance(checks, str) else checks
        declared = tests.get("imports", [])
        imports = _strings([declared] if isinstance(declared, str) else declared, "imports")
        checks = _strings(checks, "assert")
    elif isinstance(tests, dict) and {"inputs", "outputs"} <= tests.keys():
        inputs, outputs = _strings(tests["inputs"], "inputs"), _strings(tests["outputs"], "outputs")
        if len(inputs) != len(outputs):
            raise RewardError(f"code ground_truth has {len(inputs)} inputs but {len(outputs)} outputs; "
                              f"give one expected output per input")
        checks = None
        cases = [TestCase(stdin=i, expected_stdout=o) for i, o in zip(inputs, outputs)]
    elif isinstance(tests, dict):
        raise RewardError(f"code ground_truth has keys {sorted(tests)}; expected {_FORMATS}")
    else:
        checks = _strings(tests, "assert")
    if checks is not None:
        imports += [c for c in checks if _import_statements(c) is not None]
        cases = [TestCase(check=c) for c in checks if _import_statements(c) is None]
    if not cases:
        raise RewardError(f"code ground_truth holds no test cases: {ground_truth!r:.200}; "
                          f"expected {_FORMATS}")
    declared: dict[str, str] = {}
    for text in imports:
        statements = _import_statements(text)
        if statements is None:
            raise RewardError(f"code ground_truth 'imports' holds {text!r:.100}, which is not import statements; "
                              f"write e.g. 'import math' or 'from collections import Counter'")
        declared.update(imports_of(statements))
    return cases, declared


@functools.lru_cache(maxsize=4096)
def _import_statements(text: str) -> list[ast.stmt] | None:
    """The statements of ``text`` when it is nothing but imports, else None."""
    if "import" not in text:
        return None
    try:
        body = ast.parse(text).body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    return body if body and all(isinstance(node, (ast.Import, ast.ImportFrom)) for node in body) else None


def _strings(value: Any, name: str) -> list[str]:
    # Lists read back from parquet arrive as numpy arrays: any non-string iterable is accepted.
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable):
        raise RewardError(f"code ground_truth {name!r} must be a list of strings, got "
                          f"{type(value).__name__}: {value!r:.200}; expected {_FORMATS}")
    items = list(value)
    bad = [item for item in items if not isinstance(item, str)]
    if bad:
        raise RewardError(f"code ground_truth {name!r} must hold strings only, got {bad[0]!r:.100} "
                          f"({type(bad[0]).__name__}); write each case as a string")
    return items


def limits_for(extra_info: dict | None) -> SandboxLimits:
    """``DEFAULT_LIMITS`` with ``extra_info["sandbox"]``'s fields applied."""
    overrides = (extra_info or {}).get("sandbox") or {}
    fields = {f.name: f for f in dataclasses.fields(SandboxLimits)}
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise RewardError(f"extra_info['sandbox'] has unknown keys {unknown}; known: {sorted(fields)}")
    # Cast to the default's type: values read from parquet can be numpy scalars.
    return dataclasses.replace(DEFAULT_LIMITS, **{k: type(getattr(DEFAULT_LIMITS, k))(v)
                                                  for k, v in overrides.items()})


# Where str.splitlines breaks a line ("\r\n" counts once); all of them are whitespace, so none ends
# a text that was rstripped.
_LINE_BREAKS = ("\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")


def _same_output(actual: str, expected: str) -> bool:
    """Equal line by line, trailing whitespace and trailing blank lines ignored. The program's
    output is split only when it has as many lines as the expected one: 4 MiB of short lines
    would otherwise build ~1.4 million strings (~110 MiB) in the trainer for every run."""
    def norm(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().splitlines()]

    want = norm(expected)
    text = actual.rstrip()
    lines = sum(map(text.count, _LINE_BREAKS)) - text.count("\r\n") + 1 if text else 0
    return lines == len(want) and norm(text) == want


@functools.lru_cache(maxsize=4096)
def _plan(check: str, names: Names) -> tuple[AssertPlan | None, str]:
    return compile_check(check, names)


@functools.lru_cache(maxsize=4096)
def _names_in(check: str) -> frozenset[str]:
    try:
        return frozenset(node.id for node in ast.walk(ast.parse(check)) if isinstance(node, ast.Name))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return frozenset()


_warned = threading.Event()


def _warn_unsupported(check: str, why: str) -> None:
    if not _warned.is_set():
        _warned.set()
        logger.warning("code reward: an assert cannot be judged outside the sandbox and scores 0: "
                       "%.200r (%s). Write asserts as `assert f(<literals>) == <expected>` (see "
                       "docs/code_reward.md for every accepted shape). Warned once.", check, why)


def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: dict | None = None) -> dict:
    """``{"score": passed / total, "passed", "total", "status"}`` (see the module docstring)."""
    cases, declared = _parse(ground_truth)
    limits = limits_for(extra_info)
    code = extract_code(solution_str)
    if cases[0].check is not None:
        passed, status = _score_asserts(code, [case.check for case in cases], declared, limits)
    else:
        passed, status = _score_stdio(code, cases, limits)
    return {"score": passed / len(cases), "passed": passed, "total": len(cases), "status": status}


def _score_stdio(code: str, cases: list[TestCase], limits: SandboxLimits) -> tuple[int, str]:
    passed, status = 0, "ok"
    for case in cases:
        result = run_python(code, case.stdin, limits=limits)
        if result.status == "ok" and _same_output(result.stdout, case.expected_stdout):
            passed += 1
            continue
        if status == "ok":
            status = "wrong_answer" if result.status == "ok" else result.status
        if result.status == "blocked":
            return 0, status
        if result.status == "timeout":
            break
    return passed, status


def _score_asserts(code: str, checks: list[str], declared: dict[str, str],
                   limits: SandboxLimits) -> tuple[int, str]:
    try:
        names = names_for(code, declared, frozenset().union(*map(_names_in, checks)), cpu_seconds=limits.cpu_seconds,
                          memory_bytes=limits.memory_bytes, wall_seconds=limits.wall_seconds)
    except TooCostly:  # its text alone took longer to parse than a run may take: it could not have run
        return 0, "timeout"
    compiled = [_plan(check, names) for check in checks]
    plans = [plan for plan, _ in compiled]
    calls, offsets = [], []
    for plan in plans:
        offsets.append(len(calls))
        calls.extend(plan.calls if plan is not None else ())
    result = run_python(code, limits=limits, calls=calls) if calls else None
    if result is not None and result.status == "blocked":
        return 0, "blocked"
    passed, status = 0, "ok"
    for check, (plan, why), offset in zip(checks, compiled, offsets):
        if plan is None:
            _warn_unsupported(check, why)
            verdict = (False, "unsupported")
        else:
            verdict = judge(plan, result.results[offset:offset + len(plan.calls)], result.status)
        passed += verdict[0]
        if not verdict[0] and status == "ok":
            status = verdict[1]
    return passed, status


def score_batch(responses: Sequence[str], ground_truths: Sequence[Any],
                extra_infos: Sequence[dict | None] | None = None, *, max_workers: int = 4,
                data_source: str = "code") -> list[dict]:
    """``compute_score`` for many samples at once, ``max_workers`` sandboxes at a time.

    Threads suffice: each sandbox is its own process, and every sample is bounded by its limits
    (about one wall limit plus the time of its passing cases), so the batch always returns.
    """
    if len(responses) != len(ground_truths):
        raise RewardError(f"score_batch got {len(responses)} responses but {len(ground_truths)} "
                          f"ground truths; pass one ground truth per response")
    extra_infos = extra_infos if extra_infos is not None else [None] * len(responses)
    with ThreadPoolExecutor(max_workers=max_workers) as pool:
        futures = [pool.submit(compute_score, data_source, r, g, e)
                   for r, g, e in zip(responses, ground_truths, extra_infos)]
        return [f.result() for f in futures]


async def compute_score_async(data_source: str, solution_str: str, ground_truth: Any,
                              extra_info: dict | None = None) -> dict:
    """:func:`compute_score` on a worker thread, so that the reward manager runs many samples'
    sandboxes at once (``reward.max_concurrency``) instead of one wall limit after another."""
    import asyncio

    return await asyncio.to_thread(compute_score, data_source, solution_str, ground_truth, extra_info)
