"""The tutorial's section 5 as written, under torchrun: ``examples/distributed/ppo_step.py`` (a
``PPOTrainer.step`` loop with the tutorial's ``fsdp_config``: all ranks, parameter and optimiser
offload, bf16 compute) runs on 2 CPU ranks and gives the losses of one process; only rank 0 prints."""

import json
import re

import pytest

from helpers import REPO
from zygote import run_script, run_torchrun

pytestmark = pytest.mark.slow
SCRIPT = REPO / "examples" / "distributed" / "ppo_step.py"
LINE = re.compile(r"step (\d): policy_loss (\S+) value_loss (\S+) grad_norm (\S+)")


def _run(torchrun: list[str], folder, cwd, script=SCRIPT) -> str:
    """``script folder`` in one process, or under torchrun with the options ``torchrun`` (its ranks forks of
    the zygote too)."""
    if torchrun:
        done = run_torchrun([*torchrun, script, folder], cwd=cwd, timeout=300)
    else:
        done = run_script(script, [folder], cwd=cwd, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "view tensor" not in done.stderr  # OPT's blocks are made safe for FSDP's backward hooks
    return done.stdout


def _losses(output: str) -> list[tuple[float, ...]]:
    return [tuple(float(x) for x in m.groups()) for m in LINE.finditer(output)]


def test_the_ppo_step_example_gives_one_process_losses_on_two_ranks(tmp_path):
    single = _losses(_run([], tmp_path / "tiny-opt", tmp_path))
    double = _losses(_run(["--standalone", "--nproc_per_node=2"], tmp_path / "tiny-opt-2", tmp_path))
    assert len(single) == 2 and len(double) == 2  # two steps, printed once (by rank 0)
    # The snippet computes in bf16, whose rounding differs with the split of the batch: the losses
    # agree to bf16 precision (exact equality in fp32 is tests/integration/test_torchrun_rl.py's).
    for (_, policy_a, value_a, norm_a), (_, policy_b, value_b, norm_b) in zip(single, double):
        assert policy_b == pytest.approx(policy_a, abs=2e-3)
        assert value_b == pytest.approx(value_a, rel=2e-3)
        assert norm_b == pytest.approx(norm_a, rel=1e-2)


UNEVEN = """
import json, sys
import torch
from verl import ActorRolloutRefWorker, TrainerConfig
from verl.distributed.process_group import is_main_process, leave_job
from verl.models.tiny import make_tiny_model_folder
from verl.trainer.ppo import PPOTrainer

torch.manual_seed(0)
path = str(make_tiny_model_folder(sys.argv[1], arch="qwen2"))
worker = ActorRolloutRefWorker(config=TrainerConfig(actor_rollout_ref=dict(
    model=dict(path=path), rollout=dict(name="dummy"), actor=dict(optim=dict(lr=1e-3)))).actor_rollout_ref)
ids = torch.randint(3, 200, (3, 12))
mask = torch.zeros(3, 12, dtype=torch.long)
mask[:, :8] = 1
batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), prompt_mask=mask, reward=torch.tensor([1.0, 0.0, 0.5]))
# The tutorial's mini_batch_size=1 (and here 3 rows) does not split over 2 ranks: each rank then
# trains on all of a mini-batch, a 1/W share of its loss, and the update is still the whole batch's.
trainer = PPOTrainer(actor_rollout_ref_worker=worker, config=dict(kl_coef=0.1, ppo_epochs=2, mini_batch_size=1))
losses = [{k: trainer.step(batch)[k] for k in ("policy_loss", "value_loss", "policy_grad_norm")} for _ in range(2)]
if is_main_process():
    print("LOSSES", json.dumps(losses), flush=True)
leave_job()
"""


def test_a_mini_batch_that_does_not_split_over_the_ranks_still_trains_like_one_process(tmp_path):
    script = tmp_path / "uneven.py"
    script.write_text(UNEVEN)
    single = _run([], tmp_path / "one", tmp_path, script=script)
    double = _run(["--standalone", "--nproc_per_node=2"], tmp_path / "two", tmp_path, script=script)
    (one,), (two,) = ([json.loads(line.split(" ", 1)[1]) for line in out.splitlines() if line.startswith("LOSSES")]
                      for out in (single, double))
    assert len(one) == 2 and one[1]["policy_loss"] != one[0]["policy_loss"]  # it trained
    for a, b in zip(one, two):  # fp32: equal up to the order of the sums
        assert b == pytest.approx(a, rel=1e-4, abs=1e-6)
