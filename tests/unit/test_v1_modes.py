"""verl's V1 trainer modes (trainer.v1.trainer_mode) onto the asynchronous RL settings, as docs/async.md says."""

import logging

import pytest

from verl import TrainerConfig
from verl.errors import ConfigError
from verl.trainer.ppo.v1_modes import apply_v1_mode

SEPARATE = ("trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=2", "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2")  # 8 = parameter_sync_step 4 x 2


def _applied(*keys):
    config = TrainerConfig.from_cli(list(keys))
    return config, apply_v1_mode(config)


def test_sync_and_the_default_change_nothing():
    for keys in ((), ("trainer.v1.trainer_mode=sync",)):
        config, said = _applied(*keys)
        assert said == [] and config.async_training == TrainerConfig().async_training


def test_colocate_async_runs_ahead_by_the_warmup_batches_on_the_trainers_devices_with_partial_rollouts(capsys):
    config, said = _applied("trainer.v1.trainer_mode=colocate_async")
    a = config.async_training
    assert (a.enable, a.max_staleness, a.partial_rollout, a.rollout_placement) == (True, 1, True, "process")
    assert "1 step(s) ahead (num_warmup_batches=1, max_off_policy_threshold=8)" in said[0]
    assert "strategy=drop" in said[-1] and said[0] in capsys.readouterr().out
    # the threshold caps the warm-up; a bound given outright wins
    config, _ = _applied("trainer.v1.trainer_mode=colocate_async", "trainer.v1.colocate_async.num_warmup_batches=3",
                         "trainer.v1.sampler.max_off_policy_threshold=2")
    assert config.async_training.max_staleness == 2
    config, said = _applied("trainer.v1.trainer_mode=colocate_async", "async_training.max_staleness=0",
                            "trainer.v1.sampler.max_off_policy_strategy=wait")
    assert config.async_training.max_staleness == 0 and not any("drop" in line for line in said)
    # the vllm engine takes new weights midway too (its engine stepped by the rollout)
    config, said = _applied("trainer.v1.trainer_mode=colocate_async", "actor_rollout_ref.rollout.name=vllm")
    assert config.async_training.enable and config.async_training.partial_rollout
    assert said[0].endswith("with partial rollouts")


def test_separate_async_puts_the_rollout_on_its_own_devices_one_sync_a_step():
    config, said = _applied(*SEPARATE, "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl")
    a, rollout = config.async_training, config.actor_rollout_ref.rollout
    assert (a.rollout_placement, a.trigger_parameter_sync_step, a.checkpoint_engine.backend) == ("ranks", 1, "broadcast")
    assert (config.rollout.nnodes, config.rollout.n_gpus_per_node) == (1, 2)
    assert (rollout.nnodes, rollout.n_gpus_per_node) == (0, None)  # moved, so not warned about as unused
    assert "parameter_sync_step=4 mini-batches of 2" in said[1] and "backend=nccl" in said[2]
    config, _ = _applied(*SEPARATE)  # verl's naive engine: the backend stays this project's choice
    assert config.async_training.checkpoint_engine.backend == "auto"
    config = TrainerConfig.from_cli(list(SEPARATE))
    apply_v1_mode(config)
    assert apply_v1_mode(config) == [] and config.rollout.n_gpus_per_node == 2  # once per config


@pytest.mark.parametrize("keys, message", [
    (("trainer.v1.trainer_mode=separate_async",), "actor_rollout_ref.rollout.nnodes=0, n_gpus_per_node=None gives "
                                                  "it none: set both"),
    ((*SEPARATE, "data.train_batch_size=6"), r"data.train_batch_size=6 must be trainer.v1.separate_async."
                                             r"parameter_sync_step=4 x actor_rollout_ref.actor.ppo_mini_batch_size=2"),
    (("trainer.v1.separate_async.hybrid_rollout.enable_switch=true",), "the trainer's devices are not lent"),
    (("trainer.v1.sampler.custom_sampler.path=my_sampler.py",), "the sampler is built in here"),
])
def test_what_v1_asks_and_cannot_be_done_is_refused_naming_the_keys(keys, message):
    with pytest.raises(ConfigError, match=message):
        _applied(*keys)


def test_without_use_v1_the_mode_is_not_read_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.trainer"):
        config, said = _applied("trainer.use_v1=false", "trainer.v1.trainer_mode=colocate_async")
    assert said == [] and not config.async_training.enable
    assert "has no effect with trainer.use_v1=false" in caplog.text
