"""verl.workers.engine: the one training loop, on a linear model (no FSDP, one process)."""

import copy
import logging
import math

import pytest
import torch

from verl.config.schema_actor import FSDPConfig, OptimConfig
from verl.protocol import Batch
from verl.workers.engine import TrainingEngine

CPU = torch.device("cpu")


def make_engine(model, **optim):
    optim = OptimConfig(**{"lr": 0.1, "weight_decay": 0.0, "eps": 1.0, **optim})
    return TrainingEngine(model, optim, FSDPConfig(), CPU, grad_clip=math.inf, total_steps=4, seed=3,
                          metric_prefix="test")


def regression_batch(n=6) -> Batch:
    torch.manual_seed(0)
    return Batch({"x": torch.randn(n, 3), "y": torch.randn(n), "weight": torch.tensor([1.0, 2, 0, 1, 3, 1])[:n]})


def counts(mini: Batch) -> dict:
    return {"weight": mini["weight"].sum()}


def loss(model, mb: Batch, counts: dict):
    """Weighted squared error, divided by the mini-batch's total weight: a share of its mean."""
    err = (model(mb["x"]).squeeze(-1) - mb["y"]) ** 2
    value = (err * mb["weight"]).sum() / counts["weight"]
    return value, {"test/loss": value.detach(), "test/rows": len(mb), "test/total_weight": counts["weight"]}


def train(micro, mini=None, epochs=1, shuffle=False):
    torch.manual_seed(1)
    engine = make_engine(torch.nn.Linear(3, 1))
    metrics = engine.train_batch(regression_batch(), loss, counts_fn=counts, additive={"test/loss"},
                                 micro_batch_size=micro, mini_batch_size=mini, epochs=epochs, shuffle=shuffle)
    return engine, metrics


def test_micro_batches_sum_to_the_mini_batch_loss_and_gradient():
    whole, whole_metrics = train(None)
    micro, micro_metrics = train(2)
    for a, b in zip(whole.model.parameters(), micro.model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=0)
    assert micro_metrics["test/loss"] == pytest.approx(whole_metrics["test/loss"], rel=1e-6)  # summed
    assert micro_metrics["test/rows"] == 2 and whole_metrics["test/rows"] == 6  # averaged
    assert micro_metrics["test/total_weight"] == whole_metrics["test/total_weight"] == 8  # counts of the whole
    assert whole_metrics["test/lr"] == 0.1 and whole_metrics["test/grad_norm"] > 0


def test_one_step_per_mini_batch_and_one_schedule_step_per_call():
    engine, metrics = train(1, mini=3, epochs=2)
    assert engine.optimizer.state_dict()["state"][0]["step"] == 4  # 2 epochs x 2 mini-batches
    assert engine.lr_scheduler.last_epoch == 1
    assert metrics["test/total_weight"] == pytest.approx((3 + 5) / 2)  # mean over the two mini-batches


def test_a_checkpoint_of_another_model_is_refused_naming_a_weight_that_does_not_fit():
    # The same default_local_dir with another model.path: said before torch's copy fails deep in the load.
    engine, _ = train(1, mini=2, shuffle=False)
    state = engine.state_dict()
    wider = make_engine(torch.nn.Linear(3, 2))
    before = [p.detach().clone() for p in wider.model.parameters()]
    with pytest.raises(ValueError, match=r"^this checkpoint of the test was written for another model: 2 weights differ "
                                         r"in shape, 0 are missing and 0 are not in the model \(first: weight: \[1, 3\] in "
                                         r"the checkpoint, \[2, 3\] in the model\)\. Resume with the model.path the run "
                                         r"was started with, or start a new run"):
        wider.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(before, wider.model.parameters()))  # nothing loaded
    deeper = make_engine(torch.nn.Sequential(torch.nn.Linear(3, 1)))
    with pytest.raises(ValueError, match=r"0 weights differ in shape, 2 are missing and 2 are not in the model "
                                         r"\(first: 0.bias is not in the checkpoint\)"):
        deeper.load_state_dict(state)


def test_state_dict_resumes_exactly_including_the_shuffle():
    engine, _ = train(2, mini=2, shuffle=True)
    resumed = make_engine(copy.deepcopy(engine.model))
    resumed.load_state_dict(copy.deepcopy(engine.state_dict()))
    for e in (engine, resumed):
        e.train_batch(regression_batch(), loss, counts_fn=counts, additive={"test/loss"}, micro_batch_size=1,
                      mini_batch_size=2, shuffle=True)
    for a, b in zip(engine.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(engine.generator.get_state(), resumed.generator.get_state())


def test_a_resume_under_a_longer_cosine_schedule_goes_on_decaying_without_a_second_warm_up(caplog):
    """trainer.total_training_steps raised from 4 to 12 to train longer, the warm-up a ratio of it. Before: the
    resumed step 5 trained at the old schedule's last lr (0), step 6 went back into warm-up (the new 6 steps)
    and then to the peak, with no word said."""
    def engine(total_steps):
        optim = OptimConfig(lr=0.1, warmup_style="cosine", lr_warmup_steps_ratio=0.5)
        return TrainingEngine(torch.nn.Linear(3, 1), optim, FSDPConfig(), CPU, grad_clip=math.inf,
                              total_steps=total_steps, seed=3, metric_prefix="actor")

    saved = engine(4)
    for _ in range(4):
        saved.train_batch(regression_batch(), loss, counts_fn=counts)
    state = saved.state_dict()
    with caplog.at_level(logging.WARNING, logger="verl.workers.engine"):
        engine(4).load_state_dict(copy.deepcopy(state))  # the same settings: nothing said
        assert caplog.text == ""
        longer = engine(12)
        longer.load_state_dict(copy.deepcopy(state))
    lrs = [longer.train_batch(regression_batch(), loss, counts_fn=counts)["actor/lr"] for _ in range(8)]
    # The checkpoint's 2 warm-up steps are done; the cosine decays to step 12 from step 5 on.
    assert lrs == pytest.approx([0.05 * (1 + math.cos(math.pi * (step - 2) / 10)) for step in range(4, 12)])
    assert lrs == sorted(lrs, reverse=True)
    assert ("resuming the actor: the learning-rate schedule is not the checkpoint's (2 warm-up steps, then cosine to "
            "0 x lr at step 4) but 2 warm-up steps, then cosine to 0 x lr at step 12: the next step, 5, trains at lr "
            "0.09045 where the checkpoint's schedule gives 0") in caplog.text
