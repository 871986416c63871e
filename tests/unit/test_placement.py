"""Resource pools and the role -> pool mapping of trainer.backend=ray, read from the config (no Ray needed)."""

import pytest

from verl.config import TrainerConfig
from verl.errors import ConfigError
from verl.trainer.ppo.placement import pool_specs, reward_in_driver, role_mapping


def _config(*overrides):
    return TrainerConfig.from_cli(["trainer.backend=ray", *overrides])


def test_the_global_pool_is_n_gpus_per_node_on_each_node_and_holds_every_role_by_default():
    cfg = _config("trainer.nnodes=2", "trainer.n_gpus_per_node=4", "algorithm.adv_estimator=gae")
    specs = pool_specs(cfg)
    assert specs == {"global_pool": [4, 4]}
    assert role_mapping(cfg, specs) == {"actor_rollout_ref": "global_pool", "critic": "global_pool", "reward": None}
    assert reward_in_driver(cfg)  # rule rewards need no device: they run in the driver


def test_a_role_moves_to_a_pool_of_its_own():
    cfg = _config("algorithm.adv_estimator=gae", "+trainer.resource_pools.critic_pool=[1]",
                  "+trainer.role_pools.critic=critic_pool")
    specs = pool_specs(cfg)
    assert specs == {"global_pool": [1], "critic_pool": [1]}
    assert role_mapping(cfg, specs)["critic"] == "critic_pool"


def test_verl_reward_model_pool_keys_give_the_reward_model_its_own_pool():
    cfg = _config("reward_model.enable=true", "reward_model.model.path=some/rm", "reward_model.enable_resource_pool=true",
                  "reward_model.n_gpus_per_node=2", "reward_model.nnodes=1")
    specs = pool_specs(cfg)
    assert specs["reward_pool"] == [2]
    assert role_mapping(cfg, specs)["reward"] == "reward_pool"
    assert not reward_in_driver(cfg)
    # Without a pool of its own the reward model joins the policy's devices.
    shared = _config("reward_model.enable=true", "reward_model.model.path=some/rm")
    assert role_mapping(shared, pool_specs(shared))["reward"] == "global_pool"


def test_under_the_default_backend_the_reward_always_runs_here():
    cfg = TrainerConfig.from_cli(["reward_model.enable=true", "reward_model.model.path=some/rm"])
    assert reward_in_driver(cfg)


@pytest.mark.parametrize("overrides, message", [
    (["+trainer.role_pools.critic=nowhere", "algorithm.adv_estimator=gae"],
     r"trainer.role_pools.critic=nowhere: no such pool; pools: global_pool"),
    (["+trainer.role_pools.actor=global_pool"], r"trainer.role_pools.actor: not a role that can move.*always on global_pool"),
    (["+trainer.resource_pools.big=[0]"], r"trainer.resource_pools.big=\[0\]: a pool is a list of ranks per node, each >= 1"),
    (["+trainer.resource_pools.global_pool=[2]"], r"trainer.resource_pools.global_pool: global_pool is already defined"),
])
def test_a_wrong_pool_setting_is_one_error_naming_the_key(overrides, message):
    cfg = _config(*overrides)
    with pytest.raises(ConfigError, match=message):
        role_mapping(cfg, pool_specs(cfg))


def test_a_backend_that_is_not_known_gets_a_did_you_mean():
    with pytest.raises(ConfigError, match=r"trainer.backend='Ray' is not one of auto, ray.*did you mean trainer.backend=ray"):
        TrainerConfig.from_cli(["trainer.backend=Ray"])


def _silent_port() -> int:
    """A loopback port nothing listens on."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("how", ["config", "env", "client"])
def test_an_unreachable_ray_address_is_one_line_naming_it_within_seconds(how, monkeypatch):
    """ray.init() would retry an address where nothing answers for minutes; the run stops at once."""
    pytest.importorskip("ray", reason="the ray extra")
    from verl.errors import VerlError
    from verl.trainer.ppo.placement import init_ray

    port = _silent_port()
    address = f"ray://127.0.0.1:{port}" if how == "client" else f"127.0.0.1:{port}"
    keys = ["trainer.backend=ray"]
    if how == "env":
        monkeypatch.setenv("RAY_ADDRESS", address)
    else:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        keys.append(f"+ray_kwargs.ray_init.address={address}")
    with pytest.raises(VerlError) as err:
        init_ray(TrainerConfig.from_cli(keys), total_ranks=1)
    text = str(err.value)
    source = "RAY_ADDRESS" if how == "env" else "ray_kwargs.ray_init.address"
    assert f"no Ray cluster answers at {address} (from {source})" in text and f"--port={port}" in text


def test_ranks_asked_of_a_plain_process_are_said_once_with_the_ways_to_start_them(caplog, monkeypatch):
    # verl's scripts set trainer.n_gpus_per_node=8 and let Ray start the ranks; a plain python run with
    # backend=auto is one process, which trains the same numbers on one device: said, not silent.
    from verl.trainer.ppo.build import warn_unstarted_ranks

    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    with caplog.at_level("WARNING", logger="verl.trainer.ppo.build"):
        warn_unstarted_ranks(TrainerConfig.from_cli(["trainer.nnodes=2", "trainer.n_gpus_per_node=4"]))
    (record,) = caplog.records
    assert record.getMessage().startswith("trainer.nnodes x trainer.n_gpus_per_node = 8 ranks, but this is one "
                                          "process (trainer.backend=auto, not under torchrun): it trains on one "
                                          "device, not 8")
    assert "torchrun --nproc_per_node=4 -m verl.trainer.main_ppo" in record.getMessage()
    assert "trainer.backend=ray" in record.getMessage()
    caplog.clear()
    with caplog.at_level("WARNING", logger="verl.trainer.ppo.build"):
        warn_unstarted_ranks(TrainerConfig())  # one rank asked: one process is what is meant
        warn_unstarted_ranks(_config("trainer.n_gpus_per_node=4"))  # Ray starts them
        monkeypatch.setenv("WORLD_SIZE", "4")  # torchrun started them
        warn_unstarted_ranks(TrainerConfig.from_cli(["trainer.n_gpus_per_node=4"]))
    assert caplog.records == []
