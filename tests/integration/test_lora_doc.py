"""Every code block of docs/lora.md runs, in order, as written (so the guide cannot rot)."""

import pytest
from helpers import REPO, run_document

DOC = REPO / "docs" / "lora.md"

pytestmark = pytest.mark.slow


def test_every_code_block_of_the_lora_guide_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_document(DOC, tmp_path, min_blocks=3)
    exported = tmp_path / "outputs" / "lora-demo" / "huggingface"
    assert (exported / "config.json").exists() and (exported / "lora_adapter" / "adapter_config.json").exists()
    assert (tmp_path / "outputs" / "lora-continued" / "huggingface" / "lora_adapter").is_dir()
