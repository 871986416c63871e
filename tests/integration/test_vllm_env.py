"""The vLLM tests (tests/with_vllm), run in the environment that has vLLM: ``.venv-vllm``.

vLLM pins its own torch and transformers versions, so it lives in an environment of its own, made by
``bash scripts/setup.sh --vllm`` (``--test`` makes it too). Each test file there runs in one pytest
process of that environment; its own summary line is shown on failure.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
FILES = sorted(p.name for p in (ROOT / "tests" / "with_vllm").glob("test_*.py"))

pytestmark = pytest.mark.slow


def _in_vllm_env() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("name", FILES)
def test_vllm_file_passes_in_its_environment(name):
    if _in_vllm_env():
        pytest.skip("this interpreter has vLLM: tests/with_vllm are collected directly")
    if not VLLM_PYTHON.exists():
        message = "no .venv-vllm: make it with `bash scripts/setup.sh --vllm`"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI's set-up makes it: its absence is a failure there
        pytest.skip(message)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    run = subprocess.run([str(VLLM_PYTHON), "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", f"tests/with_vllm/{name}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    summary = re.findall(r"^=*\s*(\d+ passed.*|.*failed.*|.*error.*)$", run.stdout, re.M)
    assert run.returncode == 0, f"{name} in .venv-vllm: {summary[-1:] or ''}\n{out[-6000:]}"
    passed = re.search(r"(\d+) passed", run.stdout)
    assert passed and int(passed.group(1)) > 0 and "skipped" not in run.stdout.splitlines()[-1], out[-2000:]
