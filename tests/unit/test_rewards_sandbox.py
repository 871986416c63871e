"""The code reward's sandbox contains hostile programs, scores them 0, and always returns.

Escapes are tried with the audit hook on (the normal case: refused, status ``blocked``) and, as
root, with it off, to prove the OS layers (own uid, private mounts, network namespace, rlimits)
hold on their own. Timing checks are generous upper bounds ("it returned"), never precise.
"""

import dataclasses
import json
import os
import runpy
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from verl.rewards import RewardError, sandbox
from verl.rewards.sandbox import UID_BASE, SandboxLimits, run_python
from verl.rewards.scorers.code import compute_score, extract_code, parse_tests, score_batch

REPO = Path(__file__).resolve().parents[2]
LIMITS = SandboxLimits(wall_seconds=2, cpu_seconds=2, memory_bytes=256 * 2**20)
NO_HOOK = SandboxLimits(wall_seconds=2, cpu_seconds=2, memory_bytes=256 * 2**20, audit_hook=False)
EXTRA = {"sandbox": {"wall_seconds": 2, "cpu_seconds": 2, "memory_bytes": 256 * 2**20}}
SUM_TESTS = json.dumps({"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]})
FORK_BOMB = "import os\nwhile True:\n    os.fork()\n"
NEVER_BLOCKS_S = 30  # "returned at all", for runs limited to 2 s

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the OS layers need the trainer to run as root")


def with_layer(result, layer):
    """The result, or a skip when this machine could not set up ``layer`` (e.g. no CAP_SYS_ADMIN)."""
    if not result.layers.get(layer):
        pytest.skip(f"sandbox layer {layer!r} unavailable here: {result.layers}")
    return result


@pytest.fixture
def run_uids(monkeypatch):
    """The uids (as root) of the runs this test starts: other sandboxes may run on the machine."""
    uids = []

    class Recording(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            uids.append(UID_BASE + self.pid)

    monkeypatch.setattr(sandbox.subprocess, "Popen", Recording)
    return uids


def sandbox_processes(uids):
    """Live processes whose real uid is one of ``uids``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            lines = Path(f"/proc/{entry}/status").read_text().splitlines()
            fields = dict(line.split(":", 1) for line in lines if ":" in line)
        except OSError:
            continue
        uid = int(fields["Uid"].split()[0])
        if uid in uids and not fields["State"].strip().startswith(("Z", "X")):
            found.append((int(entry), uid))
    return found


def test_correct_solution_scores_one_in_both_test_formats():
    stdio = "Here:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\nDone."
    assert compute_score("code", stdio, SUM_TESTS, EXTRA) == {"score": 1.0, "passed": 3, "total": 3,
                                                              "status": "ok"}
    asserts = {"assert": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}
    assert compute_score("code", "def add(a, b):\n    return a + b\n", asserts, EXTRA)["score"] == 1.0


def test_partially_correct_solution_scores_the_fraction_passed():
    wrong_on_negatives = "```python\na, b = map(int, input().split())\nprint(abs(a) + abs(b))\n```"
    result = compute_score("code", wrong_on_negatives, SUM_TESTS, EXTRA)
    assert result["passed"] == 2 and result["total"] == 3 and result["status"] == "wrong_answer"
    assert result["score"] == pytest.approx(2 / 3)
    asserts = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
    half = compute_score("code", "def add(a, b):\n    return 3\n", asserts, EXTRA)
    assert half["score"] == 0.5 and half["status"] == "wrong_answer"  # judged outside: no AssertionError


def test_output_is_compared_without_trailing_whitespace():
    tests = {"inputs": [""], "outputs": ["3"]}
    assert compute_score("code", "print('3   ')\nprint()\n", tests, EXTRA)["score"] == 1.0
    assert compute_score("code", "print(' 3')", tests, EXTRA)["score"] == 0.0


@pytest.mark.parametrize("early_exit", ["import sys\nsys.exit(0)", "exit()", "import os\nos._exit(0)"])
def test_exiting_before_the_assert_runs_does_not_pass_it(early_exit):
    code = f"def add(a, b):\n    return 0\n{early_exit}\n"
    assert compute_score("code", code, {"assert": "assert add(1, 2) == 3"}, EXTRA)["score"] == 0.0


IGNORES_SIGNALS = ("import signal, time\nfor name in ('SIGTERM', 'SIGINT', 'SIGHUP', 'SIGXCPU', 'SIGALRM', 'SIGPIPE'):\n"
                   "    signal.signal(getattr(signal, name), signal.SIG_IGN)\ntime.sleep = lambda s: None\n"
                   "while True:\n    time.sleep(600)\n")


@pytest.mark.parametrize("code", ["while True:\n    pass\n", "import time\ntime.sleep(600)\n", IGNORES_SIGNALS],
                         ids=["loop", "sleep", "ignores-signals-patched-sleep"])
def test_infinite_loop_times_out_scores_zero_and_returns(code):
    started = time.monotonic()
    result = run_python(code, limits=LIMITS)
    assert result.status == "timeout"
    scored = compute_score("code", code, SUM_TESTS, EXTRA)
    assert scored["score"] == 0.0 and scored["status"] == "timeout"
    assert time.monotonic() - started < NEVER_BLOCKS_S


@pytest.mark.parametrize("limits, status", [(LIMITS, "blocked"),
                                            pytest.param(NO_HOOK, "error", marks=as_root),
                                            pytest.param(SandboxLimits(wall_seconds=2, cpu_seconds=2,
                                                                       audit_hook=False, max_processes=8),
                                                         "error", marks=as_root)],
                         ids=["audit-hook", "own-uid-nproc-1", "own-uid-nproc-8"])
def test_fork_bomb_is_contained_scores_zero_and_leaves_no_process(limits, status, run_uids):
    result = run_python(FORK_BOMB, limits=limits)
    if not limits.audit_hook:
        with_layer(result, "own_uid")
    assert result.status == status, result.stderr
    assert sandbox_processes(run_uids) == []
    scored = compute_score("code", FORK_BOMB, SUM_TESTS, {"sandbox": {"audit_hook": limits.audit_hook,
                                                                      "max_processes": limits.max_processes}})
    assert scored["score"] == 0.0
    assert sandbox_processes(run_uids) == []


@as_root
@pytest.mark.parametrize("namespaces", [True, False], ids=["pid-namespace", "uid-sweep"])
def test_background_grandchild_that_left_the_process_group_is_killed_when_the_run_ends(namespaces, monkeypatch,
                                                                                       run_uids):
    # Forking is allowed here on purpose: the grandchild starts its own session, so killing the
    # process group misses it. The pid namespace's end kills it; without namespaces only the sweep
    # of the run's uid can reach it. The filter kills setsid (the escape tests check that); it is
    # off here so that these layers are tested alone.
    monkeypatch.setattr(sandbox, "_NAMESPACES", namespaces)
    monkeypatch.setitem(sandbox._state, "warned", True)  # the weak-mode warning is tested elsewhere
    code = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        print(os.getpid(), flush=True)\n"
            "        time.sleep(600)\n"
            "    os._exit(0)\n"
            "os.wait()\n"
            "time.sleep(0.2)\n")
    result = with_layer(run_python(code, limits=SandboxLimits(wall_seconds=2, audit_hook=False, seccomp=False,
                                                              max_processes=4)), "own_uid")
    assert result.status == "ok", result.stderr
    assert result.layers["pid_namespace"] is namespaces
    if not namespaces:  # a pid of this namespace: it must be gone, or a zombie
        grandchild = Path(f"/proc/{int(result.stdout)}/status")
        assert not grandchild.exists() or "State:\tZ" in grandchild.read_text()
    assert sandbox_processes(run_uids) == []


@pytest.mark.parametrize("code", ["x = bytearray(10**11)\n",
                                  "x = []\nwhile True:\n    x.append(bytearray(10**6))\n"],
                         ids=["one-huge-block", "growing-list"])
def test_huge_allocation_fails_with_memory_status_and_scores_zero(code):
    assert run_python(code, limits=LIMITS).status == "memory"
    assert compute_score("code", code, SUM_TESTS, EXTRA)["score"] == 0.0


@pytest.mark.parametrize("where", ["tmp", "repo"])
@pytest.mark.parametrize("limits, status, layer", [(LIMITS, "blocked", "audit_hook"),
                                                   pytest.param(NO_HOOK, "error", None, marks=as_root)],
                         ids=["audit-hook", "os-layers-only"])
def test_writing_outside_the_working_directory_is_refused_and_scores_zero(where, limits, status, layer):
    target = (Path("/tmp") if where == "tmp" else REPO) / f"verl_sandbox_escape_{uuid.uuid4().hex}"
    code = f"open({str(target)!r}, 'w').write('escaped')\nprint(3)\n"
    try:
        result = run_python(code, limits=limits)
        with_layer(result, layer or ("private_mounts" if where == "tmp" else "own_uid"))
        assert result.status == status, result.stderr
        assert not target.exists()
        extra = {"sandbox": {**EXTRA["sandbox"], "audit_hook": limits.audit_hook}}
        assert compute_score("code", code, {"inputs": [""], "outputs": ["3"]}, extra)["score"] == 0.0
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)


def test_the_working_directory_is_writable_and_thrown_away():
    result = run_python("import os\nopen('scratch.txt', 'w').write('x')\nprint(os.getcwd())\n", limits=LIMITS)
    assert result.status == "ok", result.stderr
    assert not Path(result.stdout.strip()).exists()


@pytest.mark.parametrize("limits, status, layer", [(LIMITS, "blocked", "audit_hook"),
                                                   pytest.param(NO_HOOK, "error", "network_namespace",
                                                                marks=as_root)],
                         ids=["audit-hook", "network-namespace-only"])
def test_network_socket_is_refused_and_the_listener_sees_nothing(limits, status, layer):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n"
        result = with_layer(run_python(code, limits=limits), layer)
        assert result.status == status, result.stderr
        extra = {"sandbox": {**EXTRA["sandbox"], "audit_hook": limits.audit_hook}}
        assert compute_score("code", code, SUM_TESTS, extra)["score"] == 0.0
        listener.settimeout(0.2)
        with pytest.raises(socket.timeout):
            listener.accept()


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_endless_output_is_capped(stream):
    code = f"import signal, sys\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\nwhile True:\n    sys.{stream}.write('x' * 1000)\n"
    result = run_python(code, limits=SandboxLimits(wall_seconds=2, cpu_seconds=2, max_output_bytes=64 * 1024))
    assert result.status != "ok" and result.truncated and len(getattr(result, stream)) <= 64 * 1024


@pytest.mark.parametrize("namespaces", [True, False], ids=["private-tmpfs", "weak-host-directory"])
@pytest.mark.parametrize("files, size", [(16, 256 * 1024), (2000, 0)], ids=["bytes", "entries"])
def test_a_run_cannot_fill_its_working_directory_beyond_max_disk_bytes_in_any_mode(namespaces, files, size,
                                                                                    monkeypatch):
    """RLIMIT_FSIZE bounds each file only. With namespaces the working directory is a tmpfs of
    max_disk_bytes (ENOSPC past it); in weak mode it is a host directory, where a 3 s run wrote
    ~3.2 GB of 4 MiB files (the trainer then took ~3.6 s to remove them): the run is killed there."""
    monkeypatch.setattr(sandbox, "_NAMESPACES", namespaces)
    monkeypatch.setitem(sandbox._state, "warned", True)  # the weak-mode warning is tested elsewhere
    code = (f"import os, time\nmade = 0\ntry:\n    for i in range({files}):\n        with open('f%d' % i, 'wb') as f:\n"
            f"            f.write(b'x' * {size})\n        made += 1\nexcept OSError as error:\n"
            f"    print('refused', error.errno)\nprint('made', made, flush=True)\ntime.sleep(0.5)\n")
    result = run_python(code, limits=SandboxLimits(wall_seconds=5, max_disk_bytes=1 << 20))
    if namespaces:
        with_layer(result, "private_workdir")
    assert result.layers["private_workdir"] is namespaces
    if namespaces:
        assert result.status == "ok" and "refused 28" in result.stdout, result  # ENOSPC
    else:
        assert result.status == "killed", result
        assert "verl sandbox: killed: the working directory held more than" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("namespaces", [True, False], ids=["namespaces", "weak"])
def test_the_oom_killer_takes_a_run_before_the_trainer_and_the_program_cannot_change_that(namespaces, monkeypatch):
    """Many runs together, each within its limits, can exhaust the host's memory; the OOM killer then
    took the process with the most resident memory, the trainer. Runs are its first choice now."""
    monkeypatch.setattr(sandbox, "_NAMESPACES", namespaces)
    monkeypatch.setitem(sandbox._state, "warned", True)  # the weak-mode warning is tested elsewhere
    code = ("def adj():\n    return open('/proc/self/oom_score_adj').read().strip()\nbefore = adj()\ntry:\n"
            "    with open('/proc/self/oom_score_adj', 'w') as f:\n        f.write('0')\nexcept OSError:\n    pass\n"
            "print(before, adj())\n")
    result = run_python(code, limits=NO_HOOK)  # the hook refuses the write outright
    assert result.status == "ok" and result.stdout.split() == ["1000", "1000"], result


def test_a_run_killed_by_sigkill_that_the_trainer_did_not_send_is_reported_as_killed():
    """The launcher mirrors a signal death to the trainer; for SIGKILL (the OOM killer's, or its
    own) it raised EINVAL resetting a handler SIGKILL cannot have: status error, and its traceback
    on the program's stderr."""
    code = "import os, signal\nprint('started', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    result = run_python(code, limits=NO_HOOK)  # the hook refuses os.kill, even to itself
    assert (result.status, result.returncode, result.stdout) == ("killed", -9, "started\n"), result
    assert result.stderr == ""


@pytest.mark.parametrize("calls", [[], ["add(1, 2)", "add(3, 4)"]])
def test_a_flood_of_junk_lines_on_the_results_channel_costs_the_trainer_a_bounded_number_of_parses(calls,
                                                                                                  monkeypatch):
    """4 MiB of tiny lines written to the results pipe (every fd) once cost the trainer a parse per
    line, ~470,000 of them and 2 s of its CPU per run; now at most two per call plus a fixed slack,
    and the program only loses its own results."""
    from verl.rewards import sandbox_channel, sandbox_results

    scans, scan = [], sandbox_results._scan
    monkeypatch.setattr(sandbox_results, "_scan", lambda *args: scans.append(1) or scan(*args))
    looked, find_line = [], sandbox_channel._find_line  # the trainer's look for each call's line, before it sends the next

    def counting(results, start, searched, index, lines_left):
        before = lines_left[0]
        found = find_line(results, start, searched, index, lines_left)
        looked.append(before - lines_left[0])
        return found

    monkeypatch.setattr(sandbox_channel, "_find_line", counting)
    flood = ("import os\njunk = b'{\"i\": 0}\\n' * (1 << 16)\nfor fd in range(3, 64):\n    try:\n"
             "        for _ in range(8):\n            os.write(fd, junk)\n    except OSError:\n        pass\n"
             "def add(a, b):\n    return a + b\n")
    result = run_python(flood, calls=calls, limits=SandboxLimits(audit_hook=False))
    assert result.status == "ok" and len(result.results) == len(calls)
    assert 1 <= len(scans) <= 1 + 2 * len(calls) + sandbox_results.MAX_EXTRA_LINES
    assert sum(looked) <= 1 + 2 * len(calls) + sandbox_results.MAX_EXTRA_LINES
    # an honest run's results all come back (the report, a line per call, the empty end)
    scans.clear()
    honest = run_python("def add(a, b):\n    return a + b\n", calls=calls)
    assert [r.value for r in honest.results] == [3, 7][:len(calls)] and len(scans) <= 2 + len(calls)


def test_a_trickle_on_the_results_channel_does_not_wake_the_trainer_for_every_byte(monkeypatch):
    """One byte at a time to every fd for 1 s: the trainer read each (a 2.5 s run took ~1 s of its CPU, with
    the GIL held); now a small read that releases no call pauses the results pipe for 5 ms."""
    reads, os_read = [], os.read
    monkeypatch.setattr(os, "read", lambda fd, n: reads.append(1) or os_read(fd, n))
    trickle = ("import os, time\nfds = []\nfor fd in range(3, 64):\n    try:\n        os.fstat(fd)\n        fds.append(fd)\n"
               "    except OSError:\n        pass\nend = time.monotonic() + 1\nwhile time.monotonic() < end:\n"
               "    for fd in fds:\n        try:\n            os.write(fd, b'x')\n        except OSError:\n            pass\n"
               "def add(a, b):\n    return a + b\n")
    result = run_python(trickle, calls=["add(1, 2)"], limits=NO_HOOK)
    assert result.status == "ok" and result.results == [None]  # its junk came first, on the call's line
    assert len(reads) < 1000, len(reads)  # ~200 a second at most, where every byte was one
    reads.clear()
    honest = run_python("def add(a, b):\n    return a + b\n", calls=["add(1, 2)", "add(3, 4)"], limits=NO_HOOK)
    assert [r.value for r in honest.results] == [3, 7]


@pytest.mark.parametrize("limits", [LIMITS, NO_HOOK])
def test_an_endless_stream_on_the_results_channel_is_read_only_up_to_the_cap(limits, monkeypatch):
    """Writing to the results pipe without end made the trainer read (and drop) all of it: a 5 s
    run cost ~2.4 s of trainer CPU for 0.1 s of its own. Past the cap the pipe is no longer read."""
    cap = 256 * 1024
    read, os_read = [], os.read
    monkeypatch.setattr(os, "read", lambda fd, n: read.append(len(data := os_read(fd, n))) or data)
    flood = ("import os\njunk = b'x' * 65536\nfds = []\nfor fd in range(3, 64):\n    try:\n        os.fstat(fd)\n"
             "        fds.append(fd)\n    except OSError:\n        pass\nwhile True:\n    for fd in fds:\n"
             "        try:\n            os.write(fd, junk)\n        except OSError:\n            pass\n")
    result = run_python(flood, calls=["len('ab')"], limits=dataclasses.replace(limits, max_output_bytes=cap))
    assert result.status == "timeout" and result.truncated and result.results == [None]
    assert cap <= sum(read) <= cap + 2 * 65536, sum(read)  # was as much as it could write in the wall limit
    # a program whose results are over the cap ends as before, its result lost
    big = run_python("x = 'y' * 300_000\n", calls=["x", "len(x)"], limits=dataclasses.replace(LIMITS, max_output_bytes=cap))
    assert big.status == "ok" and big.results == [None, None] and big.truncated


def test_a_flood_of_short_output_lines_is_compared_without_splitting_it():
    """4 MiB of two-letter lines on stdout once built ~1.4 million strings (~110 MiB) in the
    trainer for each run before failing the comparison."""
    import tracemalloc

    flood = "import sys\nsys.stdout.write('\\nab' * (4 * 2**20 // 3 - 10))\n"
    tracemalloc.start()
    try:
        score = compute_score("code", flood, SUM_TESTS, EXTRA)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert score["score"] == 0.0 and score["status"] == "wrong_answer"
    assert peak < 32 * 2**20  # ~8 MiB: the output itself, once as bytes and once as str


def test_output_comparison_is_the_line_by_line_one_for_every_kind_of_line_break():
    import random

    from verl.rewards.scorers.code import _same_output

    def reference(actual, expected):
        def norm(text):
            return [line.rstrip() for line in text.rstrip().splitlines()]
        return norm(actual) == norm(expected)

    pieces = ["a", "b", " ", "\t", "\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x1f", "\x85",
              "\u2028", "\u2029", "\xa0", "\u3000"]
    rng, equal = random.Random(0), 0
    for _ in range(20_000):
        expected = "".join(rng.choices(pieces, k=rng.randint(0, 8)))
        actual = (expected + "".join(rng.choices(pieces[2:], k=rng.randint(0, 3))) if rng.random() < 0.5
                  else "".join(rng.choices(pieces, k=rng.randint(0, 8))))
        assert _same_output(actual, expected) == reference(actual, expected), (actual, expected)
        equal += reference(actual, expected)
    assert 5_000 < equal < 19_000  # both outcomes were exercised


def test_score_batch_returns_for_a_batch_of_hostile_programs(run_uids):
    good = "a, b = map(int, input().split())\nprint(a + b)\n"
    hostile = ["while True:\n    pass\n", FORK_BOMB, "x = bytearray(10**11)\n",
               "open('/tmp/verl_sandbox_escape_batch', 'w')\n",
               "import socket\nsocket.create_connection(('127.0.0.1', 9))\n"]
    started = time.monotonic()
    results = score_batch([good, *hostile], [SUM_TESTS] * 6, [EXTRA] * 6, max_workers=3)
    assert time.monotonic() - started < NEVER_BLOCKS_S
    assert [r["score"] for r in results] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert [r["status"] for r in results] == ["ok", "timeout", "blocked", "memory", "blocked", "blocked"]
    assert sandbox_processes(run_uids) == []


def test_code_is_the_last_python_block_or_the_whole_response():
    two = "```python\nprint(1)\n```\ntext\n```cpp\nint x;\n```\n```\nprint(2)\n```"
    assert extract_code(two) == "print(2)"
    assert extract_code("print(3)") == "print(3)"
    assert extract_code("```py\nprint(4)\n") == "print(4)"  # cut off by the length limit


@pytest.mark.parametrize("ground_truth, message", [
    ("not json", "not valid JSON"),
    ({"inputs": ["1"], "outputs": []}, "1 inputs but 0 outputs"),
    ({"inputs": [1], "outputs": ["1"]}, "must hold strings only"),
    ({"tests": []}, "has keys ['tests']"),
    ([], "no test cases"),
    (42, "must be a list of strings"),
])
def test_bad_ground_truth_names_the_problem_and_the_expected_format(ground_truth, message):
    with pytest.raises(RewardError, match="expected|give one|write each") as error:
        parse_tests(ground_truth)
    assert message in str(error.value)


def test_unknown_limit_in_extra_info_is_an_error_naming_the_known_ones():
    with pytest.raises(RewardError, match="unknown keys \\['timeout'\\].*wall_seconds"):
        compute_score("code", "print(3)", SUM_TESTS, {"sandbox": {"timeout": 3}})


def test_example_script_scores_as_documented(capsys):
    results = runpy.run_path(str(REPO / "examples" / "rewards" / "code_reward.py"))["main"]()
    assert {name: r["score"] for name, r in results.items()} == pytest.approx(
        {"correct": 1.0, "partial": 2 / 3, "loops": 0.0, "escapes": 0.0, "phones_home": 0.0})
    assert "correct      score=1.00 passed=3/3 status=ok" in capsys.readouterr().out


def test_assert_example_scores_as_documented(capsys):
    results = runpy.run_path(str(REPO / "examples" / "rewards" / "code_asserts.py"))["main"]()
    assert {name: r["score"] for name, r in results.items()} == pytest.approx(
        {"correct": 1.0, "rounded": 2 / 3, "answers_itself": 0.0})
    out = capsys.readouterr().out
    assert "answers_itself  score=0.00 passed=0/3 status=wrong_answer" in out
    assert out in (REPO / "docs" / "code_reward.md").read_text()


def test_the_reward_manager_runs_a_batch_of_sandboxes_concurrently_and_returns():
    """data_source "code" through the trainer's reward path: hostile samples score 0, the good one 1,
    and the step returns (a generous bound, not a timing claim: four 2 s limits run side by side)."""
    import time

    import torch

    from verl.models.tiny import build_char_tokenizer
    from verl.protocol import Batch
    from verl.rewards import RuleRewardManager

    tok = build_char_tokenizer()
    texts = ["print(sum(map(int, input().split())))", "while True: pass",
             "import os\nwhile True: os.fork()", "x = bytearray(10**11)"]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, ids))
    responses = torch.tensor([row + [0] * (width - len(row)) for row in ids])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
    tests = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    batch = Batch({"responses": responses, "response_mask": mask},
                  {"data_source": ["code"] * 4, "ground_truth": [tests] * 4,
                   "extra_info": [{"sandbox": {"wall_seconds": 2, "memory_bytes": 256 * 2**20}}] * 4})
    start = time.monotonic()
    scores, columns = RuleRewardManager(tok)(batch)
    assert time.monotonic() - start < 60
    assert scores.sum(-1).tolist() == [1.0, 0.0, 0.0, 0.0]
    assert list(columns["status"]) == ["ok", "timeout", "blocked", "memory"]


def test_isolation_reports_the_layers_up_front_and_runs_see_only_the_new_root():
    layers = sandbox.isolation(SandboxLimits(wall_seconds=5))
    missing = [name for name in (*sandbox.ESSENTIAL_LAYERS, "private_proc") if not layers.get(name)]
    if missing:
        pytest.skip(f"this machine cannot set up {missing}: {layers}")
    code = ("import os\nprint(sorted(os.listdir('/')))\n"
            "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
            f"print(os.path.exists({str(REPO / 'verl')!r}), os.path.exists('/etc/passwd'))\n")
    result = run_python(code, limits=LIMITS)
    visible, processes, exists = (eval(line) if line[0] == "[" else line for line in result.stdout.splitlines())
    interpreter = {Path(os.path.realpath(p)).parts[1] for p in (sys.prefix, sys.base_prefix)}
    interpreter |= {Path(p).parts[1] for p in (sys.prefix, sys.base_prefix)}
    system = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc", "tmp"}
    assert set(visible) <= system | interpreter, visible
    assert processes == ["1", "2"]  # the namespace's init and the program: not the trainer
    assert exists == "False True"  # the repository's sources are not there, the system is
