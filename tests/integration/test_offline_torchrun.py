"""SFT, DPO and KTO under torchrun: two CPU ranks (gloo) train like one process on the whole batch.

Every rank reads the same rows; each trains on its half of every step's batch, with losses
normalised by the step's counts over both ranks. The per-step losses and the final weights must
be those of a plain one-process run with the same config; the ranks' debug lines show that they
trained on different halves (rows 0:4 and 4:8, whose checksums add up to the whole batch's).
A checkpoint written by the two ranks holds full tensors, so one process resumes from it.
"""

import json
import logging
import re
import subprocess
from pathlib import Path

import pytest
from helpers import free_port
from zygote import run_torchrun
from transformers import AutoModelForCausalLM

from verl.data import write_parquet
from verl.data.offline import addition_rows
from verl.trainer.main_dpo import main as dpo_main
from verl.trainer.main_kto import main as kto_main
from verl.trainer.main_sft import main as sft_main

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STEPS, BATCH = 3, 8
ROW_LINE = re.compile(r"rank (\d) of (\d), step (\d+): rows (\d+):(\d+) of (\d+), checksum (\d+)")


def write_data(kind: str, n: int, tmp_path: Path) -> tuple[Path, Path]:
    """Training rows, and 7 validation rows: one rank validates on 4, the other on 3 (and a copy)."""
    rows = addition_rows(kind, "train", n=n, seed=0)
    return write_parquet(rows, tmp_path / "train.parquet"), write_parquet(rows[:7], tmp_path / "val.parquet")


def args(tiny_model_dir, data, out, *extra) -> list[str]:
    train, val = data
    return [f"model.path={tiny_model_dir}", f"data.train_files={train}", f"data.val_files={val}",
            f"data.train_batch_size={BATCH}", "data.micro_batch_size_per_gpu=2", "optim.lr=1e-3",
            f"trainer.total_training_steps={STEPS}", f"trainer.default_local_dir={out}", "trainer.progress_bar=false",
            "trainer.logger=[]", "trainer.resume_mode=disable", *extra]


def torchrun(module: str, argv: list[str]) -> subprocess.CompletedProcess:
    done = run_torchrun(["--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m",
                         module, *argv], env={"VERL_LOG_LEVEL": "DEBUG"}, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def shares(text: str) -> dict[tuple[int, int], tuple[int, int, int]]:
    """{(step, rank): (first row, end row, checksum)} from the trainers' debug lines."""
    return {(int(step), int(rank)): (int(start), int(stop), int(checksum))
            for rank, _, step, start, stop, _, checksum in ROW_LINE.findall(text)}


def assert_same_run(one: Path, two: Path) -> None:
    """The same logged losses at every step and the same final weights."""
    rows1, rows2 = metrics(one), metrics(two)
    assert [r["step"] for r in rows1] == [r["step"] for r in rows2]  # rank 0 alone logged
    for a, b in zip(rows1, rows2):
        for key in ("train/loss", "val/loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4), (a["step"], key)
    assert len([r for r in rows1 if "train/loss" in r]) == STEPS
    assert [r["step"] for r in rows1 if "val/loss" in r] == [0, STEPS]
    w1 = AutoModelForCausalLM.from_pretrained(one / "huggingface").state_dict()
    w2 = AutoModelForCausalLM.from_pretrained(two / "huggingface").state_dict()
    assert w1.keys() == w2.keys()
    for key, value in w1.items():
        assert (w2[key] - value).abs().max() < 1e-5, key


def assert_ranks_split_the_batch(rank_lines: str, one_process: dict) -> None:
    ranks = shares(rank_lines)
    for step in range(1, STEPS + 1):
        (start0, stop0, sum0), (start1, stop1, sum1) = ranks[step, 0], ranks[step, 1]
        assert (start0, stop0, start1, stop1) == (0, BATCH // 2, BATCH // 2, BATCH)
        assert sum0 != sum1 and sum0 + sum1 == one_process[step, 0][2], step
        assert one_process[step, 0][:2] == (0, BATCH)


def test_sft_on_two_ranks_equals_one_process_and_resumes_in_one(tiny_model_dir, tmp_path, caplog):
    data = write_data("sft", 64, tmp_path)
    two = torchrun("verl.trainer.main_sft", args(tiny_model_dir, data, tmp_path / "two", "trainer.save_freq=2"))
    assert two.stdout.count("SFT: 3 steps") == 1  # the summary, from rank 0 only
    caplog.set_level(logging.DEBUG, logger="verl.trainer.offline.trainer")
    assert sft_main(args(tiny_model_dir, data, tmp_path / "one")) == 0
    assert_same_run(tmp_path / "one", tmp_path / "two")
    assert_ranks_split_the_batch(two.stderr, shares(caplog.text))

    # The checkpoint of step 2, written by two ranks, resumes in one process: step 3 is the same.
    assert sft_main(args(tiny_model_dir, data, tmp_path / "resumed", "trainer.resume_mode=resume_path",
                         f"trainer.resume_from_path={tmp_path / 'two' / 'global_step_2'}")) == 0
    resumed = [r for r in metrics(tmp_path / "resumed") if "train/loss" in r]
    third = next(r for r in metrics(tmp_path / "two") if r["step"] == 3 and "train/loss" in r)
    assert [r["step"] for r in resumed] == [3]
    assert resumed[0]["train/loss"] == pytest.approx(third["train/loss"], rel=1e-6)


@pytest.mark.parametrize("kind, module, main", [("preference", "verl.trainer.main_dpo", dpo_main),
                                                ("kto", "verl.trainer.main_kto", kto_main)], ids=["dpo", "kto"])
def test_preference_training_on_two_ranks_equals_one_process(tiny_model_dir, tmp_path, caplog, kind, module, main):
    n = 64 if kind == "preference" else 32  # KTO has two rows per prompt
    data = write_data(kind, n, tmp_path)
    two = torchrun(module, args(tiny_model_dir, data, tmp_path / "two"))
    caplog.set_level(logging.DEBUG, logger="verl.trainer.offline.trainer")
    assert main(args(tiny_model_dir, data, tmp_path / "one")) == 0
    assert_same_run(tmp_path / "one", tmp_path / "two")
    assert_ranks_split_the_batch(two.stderr, shares(caplog.text))
    # The statistics of the step (means over its pairs or examples) are those of the whole batch too.
    for a, b in zip(metrics(tmp_path / "one"), metrics(tmp_path / "two")):
        for key in ("rewards/margins", "logps/chosen", "kl", "val/rewards/margins"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)


def test_verls_fsdp_sft_trainer_runs_its_gsm8k_lora_example_under_torchrun(tiny_model_dir, tmp_path):
    # verl's examples/sft/gsm8k LoRA script, as written but for the paths and sizes: its entry point,
    # its keys (partial_pretrain, the dict keys inside extra_info, default_hdfs_dir=null, Hydra's '+').
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{i}+{i}?"}],
             "extra_info": {"split": "train", "index": i, "question": f"{i}+{i}?", "answer": f"#### {2 * i}"}}
            for i in range(40)]
    train, val = write_parquet(rows, tmp_path / "train.parquet"), write_parquet(rows[:4], tmp_path / "test.parquet")
    out = tmp_path / "out"
    done = torchrun("verl.trainer.fsdp_sft_trainer", [
        f"data.train_files={train}", f"data.val_files={val}", "data.prompt_key=extra_info",
        "data.response_key=extra_info", "optim.lr=1e-4", "data.prompt_dict_keys=['question']",
        "+data.response_dict_keys=['answer']", "data.micro_batch_size_per_gpu=2", f"model.partial_pretrain={tiny_model_dir}",
        f"trainer.default_local_dir={out}", "trainer.project_name=gsm8k-sft", "trainer.experiment_name=gsm8k-sft-x",
        "trainer.logger=['console']", "trainer.total_epochs=1", "trainer.default_hdfs_dir=null",
        "model.lora_rank=8", "model.lora_alpha=16", "model.target_modules=all-linear",
        "data.train_batch_size=8", "data.train_max_samples=16", "trainer.n_gpus_per_node=2",
        "trainer.progress_bar=false"])
    assert "WARNING verl.config" not in done.stderr  # every key above is honoured as verl honours it
    assert "micro_batch_size_per_gpu: 2\n" in (out / "config.yaml").read_text()
    assert [r["step"] for r in metrics(out) if "train/loss" in r] == [1, 2]  # 16 of the 40 rows, 8 per step
    assert (out / "huggingface" / "lora_adapter" / "adapter_config.json").exists()
    AutoModelForCausalLM.from_pretrained(out / "huggingface")
