"""verl.checkpoint: crash-safe save/latest/load, pruning, and the Hugging Face export."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.checkpoint import CheckpointManager, write_hf_folder
from verl.checkpoint.manager import POINTER
from verl.models.loading import load_causal_lm, load_tokenizer


def state_for(step: int) -> dict:
    torch.manual_seed(step)
    return {"global_step": step, "weights": torch.randn(3, 2), "history": [(step, {"acc": 0.5})]}


def step_names(root) -> list[str]:
    return sorted(p.name for p in root.glob("global_step_*"))


def test_save_then_load_returns_the_same_state_and_latest_is_the_newest_step(tmp_path):
    manager = CheckpointManager(tmp_path / "run")
    assert manager.latest() is None

    manager.save(3, state_for(3))
    path = manager.save(7, state_for(7))

    assert path == manager.step_dir(7) == tmp_path / "run" / "global_step_7"
    assert manager.latest() == path
    assert (tmp_path / "run" / POINTER).read_text().strip() == "7"
    loaded = manager.load(manager.latest())
    expected = state_for(7)
    assert loaded["global_step"] == 7 and loaded["history"] == expected["history"]
    assert torch.equal(loaded["weights"], expected["weights"])
    assert torch.equal(manager.load(manager.step_dir(3))["weights"], state_for(3)["weights"])


def test_saving_a_step_again_replaces_its_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(5, {"value": 1})
    manager.save(5, {"value": 2})
    assert manager.load(manager.latest()) == {"value": 2}
    assert step_names(tmp_path) == ["global_step_5"]


def _interrupt_the_second_rename(monkeypatch):
    """os.replace as a Ctrl-C lands between the two renames of a folder saved again: the old one is aside,
    the new one not yet in place."""
    import os

    real, calls = os.replace, []

    def replace(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def test_a_step_saved_again_and_interrupted_between_its_renames_is_put_back_on_resume(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path)
    manager.save(5, {"value": 1})
    with monkeypatch.context() as patch:
        _interrupt_the_second_rename(patch)
        with pytest.raises(KeyboardInterrupt):
            manager.save(5, {"value": 2})
    assert not manager.step_dir(5).exists()  # the complete old one lies aside
    path, state = CheckpointManager(tmp_path).load_latest()
    assert path == manager.step_dir(5) and state == {"value": 1}
    assert {p.name for p in tmp_path.iterdir()} == {POINTER, "global_step_5"}
    manager.save(5, {"value": 3})  # and a later save of it again leaves nothing aside
    assert manager.load(manager.latest()) == {"value": 3}
    assert {p.name for p in tmp_path.iterdir()} == {POINTER, "global_step_5"}


def test_an_export_interrupted_between_its_renames_is_put_back_by_the_next_one(tiny_model_dir, tmp_path, monkeypatch):
    model = load_causal_lm(tiny_model_dir)
    tokenizer = load_tokenizer(tiny_model_dir)
    target = tmp_path / "huggingface"
    write_hf_folder(model, tokenizer, target)
    with monkeypatch.context() as patch:
        _interrupt_the_second_rename(patch)
        with pytest.raises(KeyboardInterrupt):
            write_hf_folder(model, tokenizer, target)
    assert not target.exists() and (tmp_path / ".old-huggingface" / "model.safetensors").exists()
    write_hf_folder(model, tokenizer, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huggingface"]
    assert AutoModelForCausalLM.from_pretrained(target).config.hidden_size == model.config.hidden_size


def test_a_checkpoints_files_reach_the_disk_before_it_is_named(tmp_path, monkeypatch):
    """A power cut after the rename must not leave global_step_N with an empty state.pt (the rename may reach
    the disk before the file's data): state.pt and its folder are flushed, then renamed, then the pointer."""
    import os

    events, real_fsync, real_replace = [], os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("rename", str(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    CheckpointManager(tmp_path).save(1, {"value": 1})
    named = events.index(("rename", str(tmp_path / "global_step_1")))
    flushed = [path for kind, path in events[:named] if kind == "fsync"]
    assert any(path.endswith("/state.pt") for path in flushed), events
    assert events[-1] == ("rename", str(tmp_path / POINTER)), events


def test_max_to_keep_prunes_the_oldest_checkpoints(tmp_path):
    manager = CheckpointManager(tmp_path, max_to_keep=2)
    for step in (1, 2, 3, 4):
        manager.save(step, state_for(step))
    assert step_names(tmp_path) == ["global_step_3", "global_step_4"]
    assert manager.latest() == manager.step_dir(4)


def test_max_to_keep_never_prunes_a_copy_kept_beside_the_checkpoints(tmp_path):
    """A user's backup (``cp -r global_step_1 global_step_1.bak``) was pruned as the oldest checkpoint."""
    import shutil

    manager = CheckpointManager(tmp_path, max_to_keep=1)
    manager.save(1, state_for(1))
    for copy in ("global_step_1.bak", "global_step_1_before_lr_change"):
        shutil.copytree(manager.step_dir(1), tmp_path / copy)
    manager.save(2, state_for(2))
    manager.save(3, state_for(3))
    assert step_names(tmp_path) == ["global_step_1.bak", "global_step_1_before_lr_change", "global_step_3"]


def test_without_max_to_keep_every_checkpoint_stays(tmp_path):
    manager = CheckpointManager(tmp_path)
    for step in (1, 2, 3):
        manager.save(step, state_for(step))
    assert step_names(tmp_path) == ["global_step_1", "global_step_2", "global_step_3"]


def test_a_save_interrupted_midway_leaves_latest_unchanged_and_the_next_save_cleans_it_up(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, state_for(1))
    crashed = tmp_path / ".tmp-crashed"  # what a crash during torch.save leaves behind
    crashed.mkdir()
    (crashed / "state.pt").write_bytes(b"half a pickle")

    assert manager.latest() == manager.step_dir(1)
    assert manager.load(manager.latest())["global_step"] == 1

    manager.save(2, state_for(2))
    assert not crashed.exists()
    assert list(tmp_path.glob(".tmp-*")) == []
    assert manager.latest() == manager.step_dir(2)


def test_latest_falls_back_past_a_pointer_to_an_incomplete_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, state_for(1))
    (tmp_path / POINTER).write_text("9")
    manager.step_dir(9).mkdir()  # folder without state.pt
    assert manager.latest() == manager.step_dir(1)


def test_pruning_never_deletes_the_checkpoint_just_saved(tmp_path):
    manager = CheckpointManager(tmp_path, max_to_keep=1)
    manager.save(20, state_for(20))  # left over from an earlier run in the same folder
    path = manager.save(10, state_for(10))
    assert (path / "state.pt").exists()
    assert manager.latest() == path


def test_write_hf_folder_writes_a_folder_that_from_pretrained_loads_with_identical_logits(tiny_model_dir, tmp_path):
    model = load_causal_lm(str(tiny_model_dir)).eval()
    tokenizer = load_tokenizer(str(tiny_model_dir))
    with torch.no_grad():  # change the weights, so the export cannot pass by reloading the original
        model.model.layers[0].mlp.down_proj.weight.mul_(2.0)
    target = tmp_path / "out" / "huggingface"
    target.mkdir(parents=True)
    (target / "stale.txt").write_text("from an older export")

    assert write_hf_folder(model, tokenizer, target) == target

    reloaded = AutoModelForCausalLM.from_pretrained(target).eval()
    ids = torch.tensor([[10, 11, 12, 13], [0, 0, 20, 21]])
    mask = (ids != 0).long()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids, attention_mask=mask).logits,
                           model(input_ids=ids, attention_mask=mask).logits)
    assert AutoTokenizer.from_pretrained(target)("ab=")["input_ids"] == tokenizer("ab=")["input_ids"]
    assert not (target / "stale.txt").exists()
    assert list((tmp_path / "out").glob(".tmp-*")) == []


def test_an_exported_tokenizer_has_no_pad_token_where_the_checkpoints_had_none(tiny_model_dir, tmp_path):
    """Llama 3's and Mistral's tokenizers have no pad token: verl pads with the eos, and the exported folder
    carried that pad (a later fine-tune then masks the eos out of its labels). It is the checkpoint's again;
    the tokenizer in use keeps its pad."""
    import json

    source = tmp_path / "no-pad"
    plain = AutoTokenizer.from_pretrained(tiny_model_dir)
    plain.pad_token = None
    plain.save_pretrained(source)
    model = load_causal_lm(str(tiny_model_dir))
    tokenizer = load_tokenizer(str(source))
    assert tokenizer.pad_token == tokenizer.eos_token == "</s>"
    target = write_hf_folder(model, tokenizer, tmp_path / "huggingface")
    assert tokenizer.pad_token == "</s>"
    assert json.loads((target / "tokenizer_config.json").read_text()).get("pad_token") is None
    assert AutoTokenizer.from_pretrained(target).pad_token is None
    with_pad = write_hf_folder(model, load_tokenizer(str(tiny_model_dir)), tmp_path / "kept")  # its own pad stays
    assert AutoTokenizer.from_pretrained(with_pad).pad_token == "<pad>"


def test_resume_path_follows_the_resume_mode(tmp_path):
    from verl.config import TrainerConfig
    from verl.errors import VerlError

    manager = CheckpointManager(tmp_path)
    trainer = TrainerConfig().trainer
    assert manager.resume_path(trainer) is None  # auto, nothing saved yet
    manager.save(3, {"x": 1})
    assert manager.resume_path(trainer) == tmp_path / "global_step_3"
    trainer.resume_mode = "disable"
    assert manager.resume_path(trainer) is None
    trainer.resume_mode = "resume_path"
    with pytest.raises(VerlError, match="needs trainer.resume_from_path"):
        manager.resume_path(trainer)
    trainer.resume_from_path = str(tmp_path / "global_step_9")
    with pytest.raises(VerlError, match="global_step_9 does not exist; give a global_step_N folder"):
        manager.resume_path(trainer)
    trainer.resume_from_path = str(tmp_path / "global_step_3")
    assert manager.resume_path(trainer) == tmp_path / "global_step_3"


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs (as root; skipped elsewhere): a disk that a save fills up."""
    import os
    import subprocess

    folder = tmp_path / "small"
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(folder)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    yield folder
    subprocess.run(["umount", "--lazy", str(folder)], check=True)  # lazy: a failed save's file may still be open


def test_a_save_that_fills_the_disk_says_so_in_one_line_and_leaves_the_previous_checkpoint(small_disk, tiny_model_dir):
    from verl.errors import VerlError

    manager = CheckpointManager(small_disk / "run")
    manager.save(1, state_for(1))
    with pytest.raises(VerlError) as raised:
        manager.save(2, {"global_step": 2, "weights": torch.zeros(2**20)})  # 4 MiB
    message = str(raised.value)
    assert "\n" not in message and "no space left" in message and str(small_disk / "run") in message, message
    assert "MiB free" in message and "global_step_1" in message and "is intact" in message, message
    # The partial save is gone (its space freed) and the previous checkpoint is still the one resumed from.
    assert sorted(p.name for p in (small_disk / "run").iterdir()) == ["global_step_1", POINTER]
    path, state = manager.load_latest()
    assert path.name == "global_step_1" and torch.equal(state["weights"], state_for(1)["weights"])

    # The Hugging Face export too: one line, no partial folder left.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.get_input_embeddings().weight.data = torch.zeros(2**20 // 4, 4)  # 4 MiB: more than is left
    with pytest.raises(VerlError, match="no space left on the device to write huggingface/"):
        write_hf_folder(model, AutoTokenizer.from_pretrained(tiny_model_dir), small_disk / "run" / "huggingface")
    assert sorted(p.name for p in (small_disk / "run").iterdir()) == ["global_step_1", POINTER]
