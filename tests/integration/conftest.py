import os

import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every integration test shares one fresh cache (built-in model, task data, warm start); under
    pytest-xdist the workers share it too (the warm start is trained once, under a lock)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # .../pytest-N/popen-gwK: the run's folder, common to the workers
    monkeypatch.setenv("VERL_CACHE_DIR", str(base / "verl-cache"))
