"""`logging.basicConfig(level=logging.INFO)` shows the data flow on the `verl.dataflow` logger:
each worker call with the bytes handed over and returned, and every device move of a Batch."""

import logging
import subprocess
import sys

import pytest
import torch

from verl.distributed.worker_group import LocalWorkerGroup
from verl.models.loading import load_tokenizer
from verl.protocol import Batch
from verl.rewards import RuleRewardManager
from verl.workers.reward import RewardWorker


def dataflow_messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "verl.dataflow"]


def small_batch():
    return Batch({"responses": torch.ones(2, 4, dtype=torch.long), "response_mask": torch.ones(2, 4),
                  "values": torch.zeros(2, 4, dtype=torch.float16)})


def test_moving_a_batch_logs_devices_bytes_and_time(caplog):
    batch = small_batch()
    with caplog.at_level(logging.INFO, logger="verl.dataflow"):
        moved = batch.to("meta")  # a real move to another device, without needing a GPU
    assert moved["responses"].device.type == "meta"
    [message] = dataflow_messages(caplog)
    assert message.startswith("Batch.to: cpu -> meta, 3 of 3 tensors, ")
    assert f", {batch.nbytes()} bytes, " in message and message.endswith("s")


def test_a_batch_already_on_the_device_logs_nothing_and_is_not_copied(caplog):
    batch = small_batch()
    with caplog.at_level(logging.INFO, logger="verl.dataflow"):
        same = batch.to("cpu")
    assert dataflow_messages(caplog) == []
    assert same["responses"] is batch["responses"]


def test_only_tensors_that_move_are_counted(caplog):
    batch = small_batch()
    batch["values"] = batch["values"].to("meta")
    with caplog.at_level(logging.INFO, logger="verl.dataflow"):
        batch.to("meta")
    [message] = dataflow_messages(caplog)
    moved_bytes = batch["responses"].nbytes + batch["response_mask"].nbytes
    assert "cpu -> meta, 2 of 3 tensors" in message and f"{moved_bytes} bytes" in message


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_moving_a_batch_to_the_gpu_and_back_is_logged(caplog):
    batch = small_batch()
    with caplog.at_level(logging.INFO, logger="verl.dataflow"):
        batch.to("cuda").to("cpu")
    messages = dataflow_messages(caplog)
    assert len(messages) == 2
    assert messages[0].startswith("Batch.to: cpu -> cuda") and messages[1].startswith("Batch.to: cuda:0 -> cpu")


def test_a_worker_call_logs_the_bytes_handed_over_and_returned(tiny_model_dir, caplog):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    worker = RewardWorker(RuleRewardManager(tokenizer, lambda data_source, solution_str, ground_truth, extra_info: 1.0))
    group = LocalWorkerGroup(worker, "reward")
    batch = Batch({"responses": torch.tensor(tokenizer(["12", "7"], padding=True)["input_ids"]),
                   "response_mask": torch.tensor(tokenizer(["12", "7"], padding=True)["attention_mask"])},
                  {"data_source": ["x", "x"]})
    with caplog.at_level(logging.INFO, logger="verl.dataflow"):
        out = group.run("score", batch)
    [message] = dataflow_messages(caplog)
    t_resp = batch["responses"].shape[1]
    assert message.startswith(f"reward.score: sent 2 rows [responses[2, {t_resp}], response_mask[2, {t_resp}]] "
                              f"{batch.nbytes()} bytes on cpu -> returned 2 rows "
                              f"[token_level_scores[2, {t_resp}]] {out.nbytes()} bytes on cpu, ")
    assert (group.bytes_sent, group.bytes_received) == (batch.nbytes(), out.nbytes())
    group.run("score", batch)
    assert group.bytes_sent == 2 * batch.nbytes()


def test_a_call_that_returns_metrics_counts_no_returned_bytes(caplog):
    class MetricsWorker:
        def update(self, batch):
            return {"actor/pg_loss": 0.1}

    group = LocalWorkerGroup(MetricsWorker(), "actor")
    with caplog.at_level(logging.INFO, logger="verl.dataflow"):
        group.run("update", small_batch())
    [message] = dataflow_messages(caplog)
    assert "-> returned dict" in message
    assert (group.bytes_sent, group.bytes_received) == (small_batch().nbytes(), 0)


def test_basic_config_at_info_prints_the_move_and_at_warning_prints_nothing():
    proc = subprocess.run([sys.executable, "-c",
                           "import logging, torch\n"
                           "from verl.protocol import Batch\n"
                           "logging.basicConfig(level=logging.WARNING)\n"
                           "Batch({'x': torch.ones(2)}).to('meta')\n"
                           "logging.getLogger().setLevel(logging.INFO)\n"
                           "Batch({'x': torch.ones(2)}).to('meta')\n"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("INFO:verl.dataflow:Batch.to: cpu -> meta, 1 of 1 tensors, 8 bytes, ")


class _Echo:
    def echo(self, batch):
        return batch


def test_a_local_group_returns_private_columns_and_traffic_counts_only_what_crossed():
    # One process: a private column comes back like any other (the controller holds every worker),
    # and nothing crossed between processes; Traffic reports the counters' growth since its start.
    from verl.distributed.worker_group import Traffic

    group = LocalWorkerGroup(_Echo(), "echo")
    group.bytes_to_workers, group.bytes_from_workers = 100, 40  # an earlier step's bytes
    traffic = Traffic([group, None])
    out = group.run("echo", small_batch(), private=("values",))
    assert "values" in out and "sample_id" not in out
    group.end_step()
    assert traffic.metrics() == {"perf/bytes_to_workers": 0, "perf/bytes_from_workers": 0, "perf/bytes_moved": 0}
    group.bytes_to_workers += 7
    group.bytes_from_workers += 5
    assert traffic.metrics() == {"perf/bytes_to_workers": 7, "perf/bytes_from_workers": 5, "perf/bytes_moved": 12}
