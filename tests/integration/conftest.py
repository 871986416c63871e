import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every integration test shares one fresh cache (built-in model, task data, warm start)."""
    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "verl-cache"))
