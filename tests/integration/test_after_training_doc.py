"""Every code block of docs/after_training.md runs, in order, as written: a short run, its checkpoints
merged, generated with and evaluated (so the guide cannot rot)."""


import pandas as pd
import pytest
from helpers import REPO, run_document

DOC = REPO / "docs" / "after_training.md"

pytestmark = pytest.mark.slow


def test_every_code_block_of_the_after_training_guide_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run_document(DOC, tmp_path, min_blocks=6)
    out = tmp_path / "outputs" / "after-demo"
    assert (out / "merged_step_1" / "config.json").is_file() and (out / "merged" / "config.json").is_file()
    generations = pd.read_parquet(out / "generations" / "test_gen.parquet")
    assert len(generations) == 8 and all(len(r) == 4 for r in generations["responses"])
    # The table the guide shows is what main_eval prints for these generations.
    from verl.trainer.main_eval import main as evaluate

    capsys.readouterr()
    assert evaluate([f"data.path={out / 'generations' / 'test_gen.parquet'}"]) == 0
    printed = capsys.readouterr().out.strip()
    shown = DOC.read_text().split("```text\n", 1)[1].split("```", 1)[0].strip()
    assert printed == shown
