"""async_training: the staleness bound it derives, what it refuses at start and what stale samples get
set (the rollout's log-probs, the correction); the checkpoint engine's backends, by hand."""

import pytest
import torch

from verl import TrainerConfig
from verl.distributed.weight_sync import WeightSender, unpack
from verl.errors import ConfigError
from verl.trainer.ppo.async_config import prepare_async_config


def _config(*keys):
    return TrainerConfig.from_cli(["async_training.enable=true", *keys])


@pytest.mark.parametrize("keys, bound", [
    ((), 0),                                                        # verl: staleness_threshold=0 is synchronous
    (("async_training.staleness_threshold=1.0",), 1),               # ~ one step off
    (("async_training.staleness_threshold=0.5",), 1),               # half a step ahead rounds up to a step
    (("async_training.staleness_threshold=0.1", "async_training.trigger_parameter_sync_step=4"), 4),  # 3 + ceil(0.4)
    (("async_training.trigger_parameter_sync_step=2",), 1),
    (("async_training.max_staleness=3", "async_training.staleness_threshold=1.0"), 3),  # the explicit bound wins
])
def test_the_bound_comes_from_max_staleness_or_verls_threshold(keys, bound):
    assert _config(*keys).async_training.staleness_bound() == bound


@pytest.mark.parametrize("keys, whole, part, head", [
    ((), 0, 0.0, 0),
    (("async_training.staleness_threshold=0.1",), 0, 0.1, 1),                 # ceil(0.1 x 8) = 1 prompt
    (("async_training.staleness_threshold=0.5",), 0, 0.5, 4),
    (("async_training.staleness_threshold=1.0",), 1, 0.0, 0),                 # a whole step: no part
    (("async_training.staleness_threshold=0.1", "async_training.trigger_parameter_sync_step=4"), 3, 0.4, 4),
    (("async_training.staleness_threshold=0.1", "rollout.n_gpus_per_node=2"), 0, 0.1, 2),  # one per process
    (("async_training.staleness_threshold=0.5", "async_training.max_staleness=2"), 2, 0.0, 0),  # whole steps
])
def test_verls_threshold_is_whole_steps_and_the_first_prompts_of_the_next(keys, whole, part, head):
    from verl.trainer.ppo.async_config import head_prompts

    config = _config("data.train_batch_size=8", *keys)
    got_whole, got_part = config.async_training.staleness_split()
    assert got_whole == whole and got_part == pytest.approx(part) and head_prompts(config) == head


def test_validating_on_the_rollout_is_said_and_between_two_syncs_is_refused():
    lines = prepare_async_config(_config("async_training.use_trainer_do_validate=false"))
    assert any(line.startswith("validation: on the rollout") for line in lines)
    assert not any("validation" in line for line in prepare_async_config(_config()))
    keys = ("async_training.use_trainer_do_validate=false", "async_training.trigger_parameter_sync_step=2",
            "async_training.max_staleness=1")
    with pytest.raises(ConfigError, match=r"trainer.test_freq=3 validates between two of them: set trainer.test_freq "
                                          r"to a multiple of 2 \(e.g. 4\) or async_training.use_trainer_do_validate=true"):
        prepare_async_config(_config(*keys, "trainer.test_freq=3"))
    for fine in ("trainer.test_freq=4", "trainer.test_freq=-1", "async_training.use_trainer_do_validate=true"):
        prepare_async_config(_config(*keys, "trainer.test_freq=3", fine))


def test_bound_zero_changes_nothing_and_stale_samples_get_the_rollouts_log_probs():
    config = _config()
    line, rewards = prepare_async_config(config)
    assert "ahead of the trainer by at most 0 step(s)" in line and "through shm" in line
    assert rewards.startswith("rewards: scored by the rollout")
    assert not config.actor_rollout_ref.rollout.calculate_log_probs
    assert not config.algorithm.rollout_correction.bypass_mode

    config = _config("async_training.max_staleness=2")
    lines = prepare_async_config(config)
    assert config.actor_rollout_ref.rollout.calculate_log_probs and config.algorithm.rollout_correction.bypass_mode
    assert "pi_old of the PPO ratio" in lines[-1]

    config = _config("async_training.max_staleness=1", "async_training.compute_prox_log_prob=true",
                     "async_training.rollout_placement=thread")
    lines = prepare_async_config(config)
    correction = config.algorithm.rollout_correction
    assert not correction.bypass_mode and correction.rollout_is == "token"
    assert "through memory" in lines[0] and "proximal policy" in lines[-1]

    config = _config("rollout.n_gpus_per_node=2", "async_training.checkpoint_engine.backend=broadcast")
    assert "runs in 2 processes of its own (rollout.n_gpus_per_node)" in prepare_async_config(config)[0]

    # DAPO's further draws are asked of the rollout inside the step (integration: test_async_rl).
    assert "ahead of the trainer" in prepare_async_config(_config("algorithm.filter_groups.enable=true"))[0]

    config = _config("actor_rollout_ref.hybrid_engine=false")  # verl's scripts of these modes set it
    lines = prepare_async_config(config)
    assert config.actor_rollout_ref.hybrid_engine and "hybrid_engine=false" in lines[0]


@pytest.mark.parametrize("keys, message", [
    (("async_training.require_batches=4",), "require_batches"),
    (("actor_rollout_ref.rollout.name=sglang",), "rollout.name=sglang (the rollout process runs hf, native or vllm"),
    (("actor_rollout_ref.rollout.name=vllm", "async_training.rollout_placement=thread",
      "async_training.checkpoint_engine.backend=memory"), "rollout.name=vllm with rollout_placement=thread"),
    (("rollout.nnodes=2",), "rollout.nnodes=2 (the rollout's processes run on the trainer's machine"),
    (("rollout.n_gpus_per_node=2", "async_training.rollout_placement=thread"), "a thread is one rollout"),
    (("rollout.n_gpus_per_node=2", "async_training.checkpoint_engine.backend=file"), "a file is read once"),
    (("rollout.n_gpus_per_node=3", "data.train_batch_size=2"), "at most 2 processes"),
    (("async_training.trigger_parameter_sync_step=3", "async_training.max_staleness=1"), "set max_staleness >= 2"),
    (("async_training.checkpoint_engine.backend=memory",), "with rollout_placement=process use shm, file or broadcast"),
    (("async_training.checkpoint_engine.backend=broadcast", "async_training.rollout_placement=thread"),
     "with rollout_placement=thread use memory"),
    (("async_training.max_staleness=1", "async_training.use_rollout_log_probs=false"), "nothing corrects for it"),
    (("async_training.rollout_placement=ranks",), "rollout_placement=ranks outside a torchrun job"),
    (("actor_rollout_ref.model.lora.merge=maybe",), "lora.merge='maybe': true"),
    (("async_training.stream_samples=true", "algorithm.adv_estimator=remax"), "greedy baselines are asked with"),
    (("async_training.stream_samples=true", "algorithm.filter_groups.enable=true"), "DAPO's refills are asked per"),
])
def test_what_it_cannot_do_is_refused_at_start_naming_the_key(keys, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        prepare_async_config(_config(*keys))



@pytest.mark.parametrize("keys, where, said", [
    ((), "rollout", "scored by the rollout as each batch is generated"),
    (("async_training.rollout_placement=thread", "async_training.checkpoint_engine.backend=memory"), "trainer",
     "(the rollout is a thread of the trainer)"),
    (("reward_model.enable=true",), "trainer", "(the reward model is the trainer's)"),
    (("async_training.reward_placement=trainer",), "trainer", "(async_training.reward_placement=trainer)"),
    (("async_training.reward_placement=rollout", "async_training.rollout_placement=thread",
      "async_training.checkpoint_engine.backend=memory"), "rollout", "scored by the rollout"),
])
def test_the_rewards_are_scored_by_the_rollout_unless_a_reward_model_or_a_thread_says_otherwise(keys, where, said):
    config = _config(*keys)
    lines = prepare_async_config(config)
    assert config.async_training.reward_placement == where
    assert any(line.startswith("rewards: ") and said in line for line in lines), lines


def test_a_reward_model_cannot_be_asked_to_score_in_the_rollout():
    with pytest.raises(ConfigError, match="reward_placement=rollout with reward_model.enable=true: the reward model "
                                          "is loaded by the trainer"):
        prepare_async_config(_config("async_training.reward_placement=rollout", "reward_model.enable=true"))


def test_verls_fully_async_command_line_with_vllm_keeps_verls_partial_rollouts():
    from verl.experimental.fully_async_policy.fully_async_main import load_fully_async_config

    for engine in ("native", "vllm"):
        config, said = load_fully_async_config([f"actor_rollout_ref.rollout.name={engine}"])
        assert config.async_training.partial_rollout, "verl's default, whatever the engine"
        assert not any("partial_rollout" in s for s in said)
        assert any("partial rollouts" in s for s in prepare_async_config(config))
    config, _ = load_fully_async_config(["actor_rollout_ref.rollout.name=vllm", "async_training.partial_rollout=false"])
    assert not config.async_training.partial_rollout
    prepare_async_config(config)


def test_verls_newer_fully_async_keys_are_read_and_lending_the_trainers_gpus_is_refused():
    # verl's fully_async_ppo_trainer.yaml of 2026: dynamic resource scheduling and the standalone pool's vLLM share
    config = _config("async_training.use_dynamic_resource_scheduling=false", "async_training.dynamic_schedule_policy=default",
                     "async_training.dynamic_schedule_deactivate_ratio=0.3", "async_training.concurrent_samples_per_replica=16",
                     "async_training.dynamic_schedule_enable_rebalance=true",
                     "actor_rollout_ref.rollout.standalone_gpu_memory_utilization=null")
    assert "ahead of the trainer" in prepare_async_config(config)[0]
    with pytest.raises(ConfigError, match="use_dynamic_resource_scheduling=true is not supported here: the trainer's "
                                          "devices are not lent"):
        _config("async_training.use_dynamic_resource_scheduling=true")


@pytest.fixture
def torchrun_env(monkeypatch):
    """What torchrun sets for a rank, on one machine of ``world`` ranks."""
    monkeypatch.setenv("VERL_ROLLOUT_RANKS", "")  # restored as it was after the test (split_job sets it)

    def launched(rank: int, world: int, nodes: int = 1):
        for key, value in (("RANK", rank), ("WORLD_SIZE", world), ("LOCAL_RANK", rank), ("GROUP_WORLD_SIZE", nodes)):
            monkeypatch.setenv(key, str(value))
        monkeypatch.delenv("VERL_ROLLOUT_RANKS", raising=False)
    return launched


def test_rollout_ranks_are_the_jobs_last_ranks_and_the_trainers_world_is_the_rest(torchrun_env):
    import os

    from verl.distributed.rollout_ranks import split_job

    config = _config("async_training.rollout_placement=ranks", "rollout.n_gpus_per_node=2")
    torchrun_env(rank=4, world=5)
    assert split_job(config) == 1 and os.environ["WORLD_SIZE"] == "5"  # the second rollout rank; nothing changed
    torchrun_env(rank=1, world=5)
    assert split_job(config) is None and os.environ["WORLD_SIZE"] == "3" and os.environ["VERL_ROLLOUT_RANKS"] == "2"
    assert split_job(config) is None and os.environ["WORLD_SIZE"] == "3"  # once: a second run in this process
    lines = prepare_async_config(config)  # now in a job split for it
    assert "the torchrun job's last 2 rank(s)" in lines[0] and "through shm" in lines[0]
    torchrun_env(rank=0, world=4, nodes=2)  # over two machines: shared memory cannot reach them
    split_job(config)
    assert config.async_training.weight_backend() == "broadcast"
    torchrun_env(rank=0, world=2)
    with pytest.raises(ConfigError, match=r"the torchrun job has 2 rank\(s\) and the rollout takes the last 2"):
        split_job(config)
    torchrun_env(rank=0, world=3)
    split_job(config)
    with pytest.raises(ConfigError, match="backend=memory .* with rollout_placement=ranks use shm"):
        prepare_async_config(_config("async_training.rollout_placement=ranks",
                                     "async_training.checkpoint_engine.backend=memory"))


def test_under_ray_rollout_ranks_are_actors_of_their_own_pool_fed_by_broadcast(monkeypatch):
    monkeypatch.delenv("VERL_ROLLOUT_RANKS", raising=False)
    config = _config("trainer.backend=ray", "async_training.rollout_placement=ranks", "rollout.n_gpus_per_node=3")
    line = prepare_async_config(config)[0]
    assert "the rollout runs in 3 Ray actor(s) of a pool of its own" in line and "through broadcast" in line
    config = _config("trainer.backend=ray", "async_training.rollout_placement=ranks",
                     "async_training.checkpoint_engine.backend=shm")  # chosen: kept (one machine)
    assert "through shm" in prepare_async_config(config)[0]


def test_rollout_ranks_outside_torchrun_name_the_command(monkeypatch):
    from verl.distributed.rollout_ranks import split_job

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match=r"not started by torchrun: start it with torchrun --nproc_per_node=T\+1"):
        split_job(_config("async_training.rollout_placement=ranks"))


def _state():
    torch.manual_seed(0)
    return {"w": torch.randn(3, 4), "b": torch.randn(4).to(torch.bfloat16)}


def test_memory_and_shm_hand_over_a_copy_the_trainer_cannot_change(tmp_path):
    for backend in ("memory", "shm"):
        state = _state()
        message, cost = WeightSender(backend).pack(state, version=5)
        assert message.version == 5 and cost.nbytes == 3 * 4 * 4 + 4 * 2 == message.nbytes
        state["w"].add_(1.0)  # the trainer's next update
        got = unpack(message)
        assert torch.equal(got["w"] + 1.0, state["w"]) and got["b"].dtype == torch.bfloat16
        assert all(t.is_shared() for t in got.values()) == (backend == "shm")


def test_the_file_backend_writes_aside_renames_and_the_reader_deletes(tmp_path):
    state = _state()
    state["tied"] = state["w"]  # tied weights (embeddings and lm_head) share memory
    message, _ = WeightSender("file", tmp_path / "sync").pack(state, version=2)
    assert message.path.endswith("weights_v2.safetensors") and not list((tmp_path / "sync").glob("*.tmp"))
    got = unpack(message)
    assert all(torch.equal(got[k], state[k]) for k in state)
    assert not list((tmp_path / "sync").iterdir())


def _receive_in_a_process(address, rank, versions, out):
    """A rollout process's side of the broadcast backend: join, receive every message in order, report."""
    from verl.distributed.weight_sync import BroadcastChannel

    channel = BroadcastChannel.join(address, rank)
    for message in iter(versions.get, None):
        state = unpack(message, channel)
        out.put({k: v.clone() for k, v in state.items()})
    # torch shares a tensor put on a queue through this process (a file descriptor it hands out):
    # stay until the test has read them all, or the read finds no one to ask (FileNotFoundError)
    versions.get()


def test_the_broadcast_backend_sends_without_waiting_and_each_rollout_process_receives_each_version_in_order():
    import torch.multiprocessing as mp

    from verl.distributed.weight_sync import BroadcastChannel, flatten, unflatten

    state = _state()
    state["i"] = torch.arange(5)
    layout, buffers = flatten(state)  # one flat buffer per dtype, each tensor at its offset
    assert len(buffers) == 3 and {b.dtype for b in buffers} == {torch.float32, torch.bfloat16, torch.int64}
    rebuilt = unflatten(layout, lambda empty: [e.copy_(b) for e, b in zip(empty, buffers)])
    assert all(torch.equal(rebuilt[k], state[k]) for k in state)

    ctx = mp.get_context("spawn")
    channel = BroadcastChannel.open(timeout_s=60, members=2)  # a pool of two rollout processes
    queues = [(ctx.Queue(), ctx.Queue()) for _ in range(2)]
    processes = [ctx.Process(target=_receive_in_a_process, args=(channel.address, rank, *queues[rank - 1]),
                             daemon=True) for rank in (1, 2)]
    for process in processes:
        process.start()
    try:
        channel.connect(lambda: None if all(p.is_alive() for p in processes) else "died")
        sender = WeightSender("broadcast", channel=channel)
        sent = []
        for version in (1, 2, 3):  # sent before the rollout reads any: nothing waits on the receiver
            message, cost = sender.pack(state, version)
            assert message.tensors is None and message.layout and cost.nbytes == message.nbytes
            sent.append({k: v.clone() for k, v in state.items()})
            state["w"].add_(1.0)  # the trainer's next update: what was sent stays as it was
            for versions, _ in queues:
                versions.put(message)
        for versions, out in queues:
            versions.put(None)
            for expected in sent:
                got = out.get(timeout=60)
                assert all(torch.equal(got[k], expected[k]) for k in expected) and got["b"].dtype == torch.bfloat16
            versions.put("read")
    finally:
        for process in processes:
            process.join(timeout=30)
        channel.close()
    assert [p.exitcode for p in processes] == [0, 0]


def test_a_rollout_that_dies_before_joining_the_broadcast_is_said_at_once():
    from verl.distributed.weight_sync import BroadcastChannel
    from verl.errors import VerlError

    channel = BroadcastChannel.open(timeout_s=600)
    with pytest.raises(VerlError, match="died .* before joining the weight broadcast"):
        channel.connect(lambda: "died (exited with code 1)")


def test_a_backend_that_does_not_exist_is_named():
    with pytest.raises(ValueError, match="choose one of"):
        WeightSender("nccl")


def test_an_answer_that_cannot_be_read_is_said_as_the_rollouts_end():
    # A stand-in for the error path alone: a rollout process killed just after answering leaves an
    # answer whose shared tensors went with it; reading it fails (ConnectionRefusedError, EOFError).
    from verl.distributed.rollout_stream import RolloutStream
    from verl.errors import VerlError

    class Killed(RolloutStream):
        def _get(self, timeout):
            raise ConnectionRefusedError(111, "Connection refused")

        def _gone(self):
            return "died (was killed by signal 9)"

        def describe(self):
            return "process (pid 7)"

    stream = Killed(timeout_s=5)
    stream.submitted = [3]
    with pytest.raises(VerlError, match=r"process \(pid 7\) died \(was killed by signal 9\) while generating step 3 "
                                        r"\(its last answer could not be read: ConnectionRefusedError"):
        stream.result()


@pytest.mark.parametrize("keys", [("rollout.n_gpus_per_node=2",), ("rollout.nnodes=2", "rollout.n_gpus_per_node=4"),
                                  ("async_training.rollout_placement=ranks",)])
def test_a_rollout_pool_in_a_synchronous_run_is_refused_not_ignored(keys):
    config = TrainerConfig.from_cli(list(keys))
    given = " ".join(k for k in keys)
    with pytest.raises(ConfigError, match=f"{given} sizes or places the rollout of an asynchronous run, and "
                       f"async_training.enable is false.*drop {given}"):
        config.validate()
    TrainerConfig.from_cli(["async_training.enable=true", *keys]).validate()  # where they mean something


def _schedule(whole, head, prompts, steps):
    """The requests a controller sends over a run of ``steps`` steps, as (published version, step, part):
    after each version is published, everything :func:`next_request` allows, in step order."""
    from verl.trainer.ppo.async_rollouts import next_request

    sent, tails, step = [], set(), 1
    for published in range(steps):
        while step <= steps:
            action = next_request(step, published, whole, head, prompts, step in tails)
            if action is None:
                break
            sent.append((published, step, action))
            if action == "head":
                tails.add(step)
                break
            tails.discard(step)
            step += 1
    return sent


def test_the_schedule_sends_whole_steps_a_head_ahead_and_its_tail_one_version_later():
    # one step off: steps 1 and 2 on version 0, then one step per version
    assert _schedule(1, 0, 4, 3) == [(0, 1, "whole"), (0, 2, "whole"), (1, 3, "whole")]
    # staleness_threshold=0.5, 4 prompts: half of the next step one version early, its rest on the next version
    assert _schedule(0, 2, 4, 3) == [(0, 1, "whole"), (0, 2, "head"), (1, 2, "tail"), (1, 3, "head"), (2, 3, "tail")]
    # a head of all the prompts (0.99 x 4 rounds up to 4) is the whole step, one further ahead
    assert _schedule(0, 4, 4, 3) == [(0, 1, "whole"), (0, 2, "whole"), (1, 3, "whole")]
    # bound 0: the synchronous order
    assert _schedule(0, 0, 4, 3) == [(0, 1, "whole"), (1, 2, "whole"), (2, 3, "whole")]


def _answer(key, version):
    from verl.distributed.rollout_stream import RolloutResult

    return RolloutResult(0, None, version, key=key)


def test_a_streamed_step_takes_the_first_fresh_prompts_in_their_order_and_drops_the_stale():
    from verl.trainer.ppo.async_rollouts import choose

    # (sample_key, first version) in the order they arrived; the step trains at version 2, bound 1
    pool = [_answer(*kv) for kv in ((5, 0), (2, 1), (9, 2), (1, 0), (3, 2))]
    taken, stale, left = choose(pool, 2, trained_at=2, bound=1)
    assert [a.key for a in taken] == [2, 9]  # the first two fresh ones to arrive, in prompt order
    assert [a.key for a in stale] == [5, 1]  # version 0 is 2 versions old
    assert [a.key for a in left] == [3]
    taken, stale, left = choose(pool, 4, trained_at=2, bound=1)
    assert taken is None and [a.key for a in left] == [2, 9, 3] and [a.key for a in stale] == [5, 1]
    # bound 0 at version 0: every prompt of the step, in its order (the synchronous batch)
    taken, stale, left = choose([_answer(k, 0) for k in (3, 0, 2, 1)], 4, trained_at=0, bound=0)
    assert [a.key for a in taken] == [0, 1, 2, 3] and not stale and not left


def test_verls_fully_async_command_line_streams_samples_and_says_so():
    from verl.experimental.fully_async_policy.fully_async_main import load_fully_async_config

    config, _ = load_fully_async_config([])
    assert config.async_training.stream_samples
    lines = prepare_async_config(config)
    assert any(line.startswith("streaming: a step trains on the first") for line in lines), lines
    config, _ = load_fully_async_config(["async_training.stream_samples=false"])
    assert not any(line.startswith("streaming") for line in prepare_async_config(config))
