"""Silent numeric failures become loud: huge rewards keep finite advantages (float64 group statistics),
a NaN/inf update is skipped and counted, a run of them stops the trainer, non-finite weights are never
saved, and greedy decoding under a group baseline is warned about."""

import logging
import math
from types import SimpleNamespace

import pytest
import torch

from verl.algorithms import compute_advantage, masked_whiten
from verl.config import ConfigError, TrainerConfig
from verl.config.schema_actor import FSDPConfig, OptimConfig
from verl.errors import VerlError
from verl.trainer.flat_rewards import FlatRewards
from verl.protocol import Batch
from verl.trainer.ppo.rl_trainer import RLTrainer
from verl.workers.engine import TrainingEngine

CPU = torch.device("cpu")
HALF_SQRT2 = 1 / math.sqrt(2)  # 0.70710678...


def _outcome(scores: list[float], length: int = 2) -> dict:
    """One token reward per response, on its last token; all responses in one group."""
    rewards = torch.zeros(len(scores), length)
    rewards[:, -1] = torch.tensor(scores)
    return {"token_level_rewards": rewards, "response_mask": torch.ones(len(scores), length),
            "group_index": ["p"] * len(scores)}


# ------------------------------------------------------------------ huge but finite rewards
def test_grpo_of_a_1e30_score_equals_the_hand_computed_advantages():
    # Group [1e30, 0]: mean 5e29, unbiased std sqrt(2 * (5e29)^2 / 1) = 5e29 * sqrt(2), so
    # A = +-5e29 / (5e29 * sqrt(2)) = +-0.7071 -- as for [1, 0]. In float32 the squares (2.5e59) overflow.
    adv, _ = compute_advantage("grpo", **_outcome([1e30, 0.0]))
    assert adv.dtype == torch.float32
    assert torch.allclose(adv, torch.tensor([[HALF_SQRT2] * 2, [-HALF_SQRT2] * 2]), atol=1e-6)
    small, _ = compute_advantage("grpo", **_outcome([1.0, 0.0]))
    assert torch.allclose(adv, small, atol=1e-5)  # epsilon 1e-6 matters only at scale 1


def test_rloo_and_dr_grpo_of_a_1e30_score_stay_finite_and_exact():
    adv, _ = compute_advantage("rloo", **_outcome([1e30, 0.0]))  # A_i = R_i - R_other
    assert adv[:, -1].tolist() == pytest.approx([1e30, -1e30], rel=1e-6)
    adv, _ = compute_advantage("grpo", norm_adv_by_std_in_grpo=False, **_outcome([1e30, 0.0]))  # R_i - mean
    assert adv[:, -1].tolist() == pytest.approx([5e29, -5e29], rel=1e-6)


@pytest.mark.parametrize("name", ["reinforce_plus_plus_baseline", "gpg", "reinforce_plus_plus"])
def test_other_group_and_whitened_estimators_of_a_1e30_score_are_finite(name):
    adv, _ = compute_advantage(name, **_outcome([1e30, 0.0, 0.0, 0.0]))
    assert torch.isfinite(adv).all() and adv.abs().max() > 0


def test_gdpo_of_a_1e30_component_equals_the_hand_computed_advantages():
    # Per component: +-0.7071 (as GRPO above); whitened over 2 tokens: mean 0, unbiased var 1 -> unchanged.
    adv, _ = compute_advantage("gdpo", reward_components=torch.tensor([[1e30], [0.0]]),
                               response_mask=torch.ones(2, 1), token_level_rewards=torch.zeros(2, 1),
                               group_index=["p", "p"])
    assert torch.allclose(adv, torch.tensor([[HALF_SQRT2], [-HALF_SQRT2]]), atol=1e-5)


def test_masked_whiten_of_huge_values_is_finite_and_keeps_the_dtype():
    # [1e30, -1e30, pad]: mean 0, unbiased var 2e60 / 1, so +-1e30 / sqrt(2e60) = +-0.7071; padding 0.
    out = masked_whiten(torch.tensor([[1e30, -1e30, 7.0]]), torch.tensor([[1, 1, 0]]))
    assert out.dtype == torch.float32
    assert torch.allclose(out, torch.tensor([[HALF_SQRT2, -HALF_SQRT2, 0.0]]), atol=1e-6)


# ------------------------------------------------------------------ skipped updates
def _engine(model, **optim) -> TrainingEngine:
    optim = OptimConfig(**{"lr": 0.1, "weight_decay": 0.0, **optim})
    return TrainingEngine(model, optim, FSDPConfig(), CPU, grad_clip=1.0, total_steps=4, metric_prefix="actor")


def _nan_for_rows_at_or_above(threshold: float):
    def loss(model, mb: Batch, counts: dict):
        out = model(mb["x"]).sum() / counts["rows"]
        poisoned = (mb["x"][:, 0] >= threshold).any()
        return (out * float("nan") if poisoned else out), {}
    return loss


def test_a_nan_mini_batch_is_skipped_counted_and_leaves_the_weights_as_they_were():
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    engine = _engine(model)
    batch = Batch({"x": torch.tensor([[0.0, 1.0], [1.0, 1.0], [2.0, 1.0], [3.0, 1.0]])})
    counts_fn = lambda mini: {"rows": len(mini)}  # noqa: E731
    before = [p.detach().clone() for p in model.parameters()]
    # Mini-batches of 2 rows: the first (x0 = 0, 1) is finite and steps, the second (x0 = 2, 3) is NaN.
    metrics = engine.train_batch(batch, _nan_for_rows_at_or_above(2.0), counts_fn=counts_fn, mini_batch_size=2)
    assert metrics["actor/num_nonfinite_skipped"] == 1
    assert math.isnan(metrics["actor/grad_norm"])
    after_first = [p.detach().clone() for p in model.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, after_first))  # the finite one stepped
    metrics = engine.train_batch(batch, _nan_for_rows_at_or_above(0.0), counts_fn=counts_fn, mini_batch_size=2)
    assert metrics["actor/num_nonfinite_skipped"] == 2
    assert all(torch.equal(a, p) for a, p in zip(after_first, model.parameters()))  # nothing stepped
    assert all(p.grad is None for p in model.parameters())  # and nothing carries over to the next step
    metrics = engine.train_batch(batch, _nan_for_rows_at_or_above(9.0), counts_fn=counts_fn, mini_batch_size=2)
    assert metrics["actor/num_nonfinite_skipped"] == 0 and math.isfinite(metrics["actor/grad_norm"])


def test_weights_holding_nan_or_inf_are_never_handed_out_for_saving():
    model = torch.nn.Linear(2, 1)
    engine = _engine(model)
    assert set(engine.state_dict()) == {"model", "optimizer", "lr_scheduler", "generator"}
    with torch.no_grad():
        model.bias.fill_(float("inf"))
    with pytest.raises(VerlError, match=r"refusing to save the actor weights: 1 of its weight tensors hold NaN or "
                                        r"inf \(first: bias\).*Lower optim.lr"):
        engine.state_dict()


# ------------------------------------------------------------------ the trainer's bookkeeping
class _Tracker:
    def __init__(self):
        self.rows = []

    def log(self, metrics, step):
        self.rows.append((step, dict(metrics)))


def _trainer(limit: int):
    from verl.trainer.nonfinite import NonfiniteGuard
    from verl.trainer.ppo.rl_trainer import NONFINITE_STAGES

    config = SimpleNamespace(trainer=SimpleNamespace(max_nonfinite_steps=limit))
    return SimpleNamespace(config=config, tracker=_Tracker(), global_step=0, is_main=True,
                           nonfinite=NonfiniteGuard(limit, NONFINITE_STAGES), flat_rewards=FlatRewards())


def _step(trainer, actor: int, critic: int | None = None) -> None:
    trainer.global_step += 1
    metrics = {"actor/num_nonfinite_skipped": actor}
    if critic is not None:
        metrics["critic/num_nonfinite_skipped"] = critic
    RLTrainer.watch_step(trainer, metrics)


def test_the_run_stops_after_max_nonfinite_steps_in_a_row_with_the_step_stage_and_fix(caplog):
    trainer = _trainer(limit=2)
    with caplog.at_level(logging.WARNING, logger="verl.trainer.nonfinite"):
        _step(trainer, 1)
        _step(trainer, 2)
        _step(trainer, 0)  # a clean step ends the run of skips
        _step(trainer, 0, critic=1)
        _step(trainer, 1, critic=1)
        assert trainer.tracker.rows == []
        with pytest.raises(VerlError) as err:
            _step(trainer, 1)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 4
    assert warnings[0].startswith("step 1: update_actor skipped 1 optimiser step because the loss or gradient norm "
                                  "was NaN or inf")
    assert warnings[3].startswith("step 5: update_critic skipped 1 optimiser step, update_actor skipped 1")
    msg = str(err.value)
    assert msg.startswith("step 6: update_actor skipped 1 optimiser step because the loss or gradient norm was NaN "
                          "or inf, 3 steps in a row (steps 4-6; trainer.max_nonfinite_steps=2)")
    assert "lower the learning rate (actor_rollout_ref.actor.optim.lr" in msg and "\n" not in msg
    assert trainer.tracker.rows == [(6, {"actor/num_nonfinite_skipped": 1})]  # the failing step is on record


def test_max_nonfinite_steps_0_stops_at_the_first_skip():
    trainer = _trainer(limit=0)
    _step(trainer, 0, critic=0)
    with pytest.raises(VerlError) as err:
        _step(trainer, 0, critic=2)
    assert str(err.value).startswith("step 2: update_critic skipped 2 optimiser steps because the loss or gradient "
                                     "norm was NaN or inf, 1 step in a row (step 2; trainer.max_nonfinite_steps=0)")
    assert "lower the learning rate (critic.optim.lr)" in str(err.value)


def test_max_nonfinite_steps_defaults_to_3_and_must_not_be_negative():
    assert TrainerConfig().trainer.max_nonfinite_steps == 3
    with pytest.raises(ConfigError, match="max_nonfinite_steps"):
        TrainerConfig(trainer=dict(max_nonfinite_steps=-1))


# ------------------------------------------------------------------ greedy groups
def _warnings_of(caplog, **rollout) -> list[str]:
    cfg = TrainerConfig(actor_rollout_ref=dict(rollout=dict(n=4, **rollout)))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="verl.config"):
        cfg.validate()
    return [r.getMessage() for r in caplog.records if "decodes greedily" in r.getMessage()]


@pytest.mark.parametrize("rollout, named", [(dict(temperature=0.0), "rollout.temperature=0"),
                                            (dict(do_sample=False), "rollout.do_sample=false")])
def test_greedy_decoding_under_a_group_baseline_is_warned_about(caplog, rollout, named):
    (message,) = _warnings_of(caplog, **rollout)
    assert message.startswith(f"algorithm.adv_estimator=grpo with actor_rollout_ref.{named} decodes greedily: "
                              f"the 4 samples of a prompt are the same response, so their advantages are all 0")
    assert "actor_rollout_ref.rollout.temperature=1.0, do_sample=true" in message


def test_sampling_or_an_estimator_without_a_group_baseline_is_not_warned_about(caplog):
    assert _warnings_of(caplog) == []
    cfg = TrainerConfig(algorithm=dict(adv_estimator="reinforce_plus_plus"),
                        actor_rollout_ref=dict(rollout=dict(n=4, temperature=0.0)))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="verl.config"):
        cfg.validate()
    assert not [r for r in caplog.records if "decodes greedily" in r.getMessage()]


def test_an_sft_run_whose_updates_keep_failing_stops_with_the_offline_lr_key(tmp_path, tiny_model_dir):
    from verl.trainer.sft.trainer import SFTTrainer

    rows = tmp_path / "sft.jsonl"
    rows.write_text("".join(f'{{"prompt": "q{i}", "response": "a{i}"}}\n' for i in range(8)))
    trainer = SFTTrainer(dict(model=dict(path=str(tiny_model_dir)), data=dict(train_files=str(rows), train_batch_size=4),
                              optim=dict(lr=1e30), trainer=dict(max_nonfinite_steps=0, total_training_steps=4,
                                                                default_local_dir=str(tmp_path / "out"),
                                                                val_before_train=False, progress_bar=False)))
    with pytest.raises(VerlError, match=r"update skipped 1 optimiser step because the loss or gradient norm was NaN "
                                        r"or inf, 1 step in a row .*lower the learning rate \(optim.lr\)"):
        trainer.fit()


def test_a_learning_rate_that_overflows_adamw_is_one_error_naming_the_key():
    from verl.workers.optim import clip_and_step

    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e39)
    model(torch.ones(2, 3)).sum().backward()
    with pytest.raises(VerlError, match=r"overflowed with learning rate 1e\+39 .*set optim.lr"):
        clip_and_step(model, optimizer, 1.0)
