"""Real ``main_ppo`` processes killed at the worst moments (SIGKILL mid-step, mid-save, mid-export),
stopped by Ctrl-C or SIGTERM, or left with a damaged newest checkpoint, then run again: the resumed
run equals an uninterrupted one step by step (metrics.jsonl, each step once) and in its final
weights (bit for bit).

The killed process is ``main_ppo`` under a small wrapper that parks it at the chosen point (it
writes a marker file and sleeps) so that the kill lands exactly there; the resumed halves run in
this process, as ``test_main_ppo``'s resume test does."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import REPO, echo_launch
from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow

STEPS = 4
# Scores that differ between the samples of a prompt, so every step changes the weights.
REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" \
         "    return float(len(set(solution_str)))\n"
NOT_DETERMINISTIC = ("timing_s/", "perf/time_per_step", "perf/throughput", "perf/cpu_memory_used_gb", "perf/max_memory_")

PARKING = '''
import os, signal, sys, time
import torch
torch.set_num_threads(1)
point, at, marker = os.environ["PARK_AT"], int(os.environ["PARK_STEP"]), os.environ["PARK_MARKER"]
resume_after_signal = os.environ["PARK_SIGNALS"] == "1"  # else wait to be killed (or stopped at once)


def asked_to_stop():
    """Whether the run loop's handler (verl.trainer.stop.StopSignals) took a signal."""
    handler = signal.getsignal(signal.SIGINT)
    return getattr(getattr(handler, "__self__", None), "signum", None) is not None


def park():
    """Tell the test where this process is, then wait for its signal."""
    open(marker, "w").close()
    for _ in range(1200):
        time.sleep(0.05)
        if resume_after_signal and asked_to_stop():
            return


if point == "step":  # after the step's update, before it is logged or saved
    from verl.trainer.ppo.rl_trainer import RLTrainer
    train_step = RLTrainer.train_step

    def parked_step(self, prompts):
        metrics = train_step(self, prompts)
        if self.global_step == at:
            park()
        return metrics

    RLTrainer.train_step = parked_step
elif point == "save":  # half of state.pt written into the temporary folder
    import io
    from pathlib import Path
    import verl.checkpoint.manager as manager
    save = manager.torch.save

    def parked_save(obj, f):
        if isinstance(obj, dict) and obj.get("global_step") == at:
            buffer = io.BytesIO()
            save(obj, buffer)
            Path(f).write_bytes(buffer.getvalue()[:len(buffer.getvalue()) // 2])
            park()
        save(obj, f)

    manager.torch.save = parked_save
elif point == "export":  # the weights written into the temporary folder, the tokenizer not yet
    from transformers import PreTrainedTokenizerBase
    save_pretrained = PreTrainedTokenizerBase.save_pretrained

    def parked_save_pretrained(self, folder, *args, **kwargs):
        park()
        return save_pretrained(self, folder, *args, **kwargs)

    PreTrainedTokenizerBase.save_pretrained = parked_save_pretrained

from verl.trainer.main_ppo import main
sys.exit(main(sys.argv[1:]))
'''


def launch_args(model_dir, folder, *extra):
    return echo_launch(model_dir, folder, REWARD, steps=STEPS) + ["trainer.save_freq=1", "trainer.logger=[jsonl]",
                                                                  *extra]


def metrics(folder):
    return [json.loads(line) for line in (folder / "out" / "metrics.jsonl").read_text().splitlines()]


def deterministic(rows):
    return [{k: v for k, v in row.items() if not k.startswith(NOT_DETERMINISTIC)} for row in rows]


def weights(folder):
    return AutoModelForCausalLM.from_pretrained(folder / "out" / "huggingface").state_dict()


def run_parked(args, tmp_path, point, step, *signals):
    """Run main_ppo in a process of its own, parked at ``point`` of ``step``; send it ``signals`` there
    (SIGKILL to end it); return its exit code and output."""
    marker = tmp_path / f"parked-{point}-{step}"
    script = tmp_path / "parked_main_ppo.py"
    script.write_text(PARKING)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PARK_AT": point,
           "PARK_STEP": str(step), "PARK_MARKER": str(marker), "PARK_SIGNALS": str(len(signals))}
    job = subprocess.Popen([sys.executable, str(script), *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert job.poll() is None, job.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "never reached the parking point"
            time.sleep(0.05)
        for sig in signals:
            os.kill(job.pid, sig)
            time.sleep(0.2)
        output, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return job.returncode, output


@pytest.fixture(scope="module")
def straight(tiny_model_dir, tmp_path_factory):
    """The uninterrupted run: its metrics rows and final weights."""
    folder = tmp_path_factory.mktemp("straight")
    assert main(launch_args(tiny_model_dir, folder)) == 0
    rows = metrics(folder)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["actor/grad_norm"] > 0 for r in rows), "every step must change the weights"
    return deterministic(rows), weights(folder)


def assert_equals_straight(folder, straight):
    rows, final = straight
    assert deterministic(metrics(folder)) == rows  # each step once, with the same numbers
    resumed = weights(folder)
    for key in final:
        torch.testing.assert_close(resumed[key], final[key], rtol=0, atol=0)
    assert list((folder / "out").glob(".tmp-*")) == []


def test_sigkill_mid_step_then_resume_equals_the_uninterrupted_run(tiny_model_dir, tmp_path, straight):
    args = launch_args(tiny_model_dir, tmp_path)
    code, _ = run_parked(args, tmp_path, "step", 3, signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert [r["step"] for r in metrics(tmp_path)] == [1, 2]
    assert main(args) == 0
    assert_equals_straight(tmp_path, straight)


def test_sigkill_mid_save_leaves_the_previous_checkpoint_and_the_resume_drops_the_unsaved_step(
        tiny_model_dir, tmp_path, straight):
    args = launch_args(tiny_model_dir, tmp_path)
    code, _ = run_parked(args, tmp_path, "save", 3, signal.SIGKILL)
    assert code == -signal.SIGKILL
    out = tmp_path / "out"
    assert [p.name for p in out.glob(".tmp-*")] and not (out / "global_step_3").exists()
    assert [r["step"] for r in metrics(tmp_path)] == [1, 2, 3]  # step 3 was logged, never saved
    assert main(args) == 0
    assert_equals_straight(tmp_path, straight)


def test_sigkill_mid_export_leaves_a_temporary_folder_the_rerun_replaces(tiny_model_dir, tmp_path, straight):
    args = launch_args(tiny_model_dir, tmp_path)
    code, _ = run_parked(args, tmp_path, "export", 0, signal.SIGKILL)
    assert code == -signal.SIGKILL
    out = tmp_path / "out"
    assert [p.name for p in out.glob(".tmp-hf-*")] and not (out / "huggingface").exists()
    assert main(args) == 0  # resumes at the last step: nothing to train, the export again
    assert_equals_straight(tmp_path, straight)


def test_ctrl_c_saves_at_the_next_step_boundary_exits_130_and_the_resume_equals_the_uninterrupted_run(
        tiny_model_dir, tmp_path, straight):
    args = launch_args(tiny_model_dir, tmp_path, "trainer.save_freq=-1")  # the only checkpoint: Ctrl-C's
    code, output = run_parked(args, tmp_path, "step", 2, signal.SIGINT)
    assert code == 130, output[-3000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("global_step_*")) == ["global_step_2"]
    assert not (out / "huggingface").exists()
    assert "received SIGINT" in output and "interrupted: stopped after step 2" in output
    assert "Traceback" not in output
    assert main(args) == 0
    assert_equals_straight(tmp_path, straight)


def test_sigterm_during_a_save_stops_on_that_checkpoint_without_training_another_step(tiny_model_dir, tmp_path,
                                                                                     straight):
    """A preemption's SIGTERM (or Ctrl-C) that lands while step 2 is being saved: the save completes and the
    run stops there; it ran step 3 as well before (a whole step more within the scheduler's grace period)."""
    args = launch_args(tiny_model_dir, tmp_path)
    code, output = run_parked(args, tmp_path, "save", 2, signal.SIGTERM)
    assert code == 143, output[-3000:]
    assert sorted(p.name for p in (tmp_path / "out").glob("global_step_*")) == ["global_step_1", "global_step_2"]
    assert [r["step"] for r in metrics(tmp_path)] == [1, 2]
    assert "interrupted: stopped after step 2, its checkpoint saved" in output and "Traceback" not in output
    assert main(args) == 0
    assert_equals_straight(tmp_path, straight)


def test_sigterm_during_the_export_says_so_exits_143_and_the_rerun_exports(tiny_model_dir, tmp_path, straight):
    """Outside the steps (here the export after the last one) SIGTERM stops at once; it ended the process
    without a word (its default action), the loggers not closed."""
    args = launch_args(tiny_model_dir, tmp_path)
    code, output = run_parked(args, tmp_path, "export", 0, signal.SIGTERM)
    assert code == 143, output[-3000:]
    assert "interrupted: stopped at once by SIGTERM outside the training steps" in output and "Traceback" not in output
    assert main(args) == 0  # resumes at the last step: nothing to train, the export again
    assert_equals_straight(tmp_path, straight)


@pytest.mark.parametrize("signals, code, saved", [((signal.SIGTERM,), 143, ["global_step_1", "global_step_2"]),
                                                  ((signal.SIGINT, signal.SIGINT), 130, ["global_step_1"])],
                         ids=["sigterm", "ctrl-c-twice"])
def test_sigterm_saves_and_exits_143_and_a_second_ctrl_c_exits_at_once(tiny_model_dir, tmp_path, signals, code,
                                                                       saved):
    code_seen, output = run_parked(launch_args(tiny_model_dir, tmp_path), tmp_path, "step", 2, *signals)
    assert code_seen == code, output[-3000:]
    assert sorted(p.name for p in (tmp_path / "out").glob("global_step_*")) == saved


def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning_and_the_run_ends_as_the_uninterrupted_one(
        tiny_model_dir, tmp_path, straight, capsys, caplog):
    args = launch_args(tiny_model_dir, tmp_path)
    assert main(args + ["trainer.total_training_steps=3"]) == 0
    state = tmp_path / "out" / "global_step_3" / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])
    with caplog.at_level("WARNING", logger="verl.checkpoint.manager"):
        assert main(args) == 0
    assert "skipped global_step_3 (state.pt does not load" in caplog.text
    assert "resuming from global_step_2" in caplog.text
    assert_equals_straight(tmp_path, straight)

    # Nothing left that loads: a clear error (exit 2), and no run from step 0 over the checkpoints.
    for folder in (tmp_path / "out").glob("global_step_*"):
        (folder / "state.pt").write_bytes(b"")
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no checkpoint in") and "trainer.resume_mode=disable" in err


def test_under_torchrun_sigterm_stops_every_rank_after_the_same_step_with_its_checkpoint(tiny_model_dir, tmp_path):
    """torchrun passes the signal on to each rank at its own moment; the ranks agree on the step
    (no rank left waiting in a collective, no watchdog verdict), rank 0 saves it and says so once."""
    out = tmp_path / "out"
    args = echo_launch(tiny_model_dir, tmp_path, REWARD, steps=100000) + ["trainer.logger=[jsonl]"]
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                            "-m", "verl.trainer.main_ppo", *args], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True,
                           env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 240
        while not (out / "metrics.jsonl").exists() or len((out / "metrics.jsonl").read_text().splitlines()) < 2:
            assert job.poll() is None and time.monotonic() < deadline, "the job did not start training"
            time.sleep(0.1)
        os.kill(job.pid, signal.SIGTERM)  # to the launcher, as a scheduler would
        output, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    saved = int((out / "latest_checkpointed_iteration.txt").read_text())
    assert [r["step"] for r in metrics(tmp_path)] == list(range(1, saved + 1))
    assert (out / f"global_step_{saved}" / "state.pt").exists()
    assert output.count(f"interrupted: stopped after step {saved}, its checkpoint saved") == 1, output[-3000:]
    assert not [line for line in output.splitlines() if line.startswith("error: ")], output[-3000:]
