"""tests/integration/zygote.py: a forked launch is what ``python -m`` would have run (argv, working folder,
environment, output, exit code, traceback, timeout), and a run whose import-time environment differs
gets a fresh interpreter."""

import json
import subprocess

import pytest

from zygote import _ZYGOTE, run_module

PROBE = '''
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "flag": os.environ.get("PROBE_FLAG"),
                  "forked": sys.orig_argv[1] == "-c", "main": __name__}))
print("to stderr", file=sys.stderr)
what = sys.argv[1]
if what == "exit":
    sys.exit(3)
if what == "raise":
    raise RuntimeError("the probe failed")
if what == "sleep":
    import time
    time.sleep(60)
'''


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "zprobe.py").write_text(PROBE)
    return tmp_path


def _seen(done) -> dict:
    return json.loads(done.stdout.splitlines()[0])


def test_a_forked_run_sees_its_argv_folder_and_environment_and_exits_as_python_m_would(probe):
    done = run_module("zprobe", ["ok", "x=1"], cwd=probe, env={"PROBE_FLAG": "on"})
    seen = _seen(done)
    assert done.returncode == 0 and done.stderr.strip() == "to stderr"
    assert seen == {"argv": ["ok", "x=1"], "cwd": str(probe), "flag": "on", "forked": True, "main": "__main__"}
    assert run_module("zprobe", ["exit"], cwd=probe).returncode == 3
    failed = run_module("zprobe", ["raise"], cwd=probe)
    assert failed.returncode == 1
    assert "Traceback" in failed.stderr and "RuntimeError: the probe failed" in failed.stderr
    with pytest.raises(subprocess.TimeoutExpired):
        run_module("zprobe", ["sleep"], cwd=probe, timeout=2)
    assert _seen(run_module("zprobe", ["ok"], cwd=probe))["forked"]  # the zygote serves on after a kill


def test_a_different_import_time_variable_gets_a_fresh_interpreter(probe):
    run_module("zprobe", ["ok"], cwd=probe)  # the zygote is started
    done = run_module("zprobe", ["ok"], cwd=probe, env={"TRANSFORMERS_VERBOSITY": "error"})
    assert done.returncode == 0 and not _seen(done)["forked"]
    assert _ZYGOTE.proc is not None
