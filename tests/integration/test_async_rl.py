"""Asynchronous RL (``async_training.enable``): the rollout runs in a process (or thread) of its own,
ahead of the trainer by at most ``max_staleness`` versions.

* bound 0 is the synchronous run exactly: the same metrics and weights;
* bound 1 (one step off): step s trains on samples of version s - 2, stamped so, corrected by the
  rollout's log-probs; a resume from the middle equals the uninterrupted run (the checkpoint holds
  the batches generated ahead);
* what else runs apart: a critic, multi-turn tools, LoRA adapters, DAPO, ReMax, distillation, rollout
  ranks, verl's fully-async command line (failures: test_async_failures.py).
"""

import os
import shutil
import subprocess
import sys

import pytest

from helpers import REPO, run_torchrun_module
from zygote import run_module
from agent_models import SCALE_OUT_KEYS, tool_task_args
from rl_compare import (ASYNC, GRPO, LOG_PROBS, ONE_STEP_OFF, PPO, RANKS, assert_same_metrics, assert_same_weights,
                        computed, make_data_dir, run_args, run_plain, step_metrics, without_async)

pytestmark = pytest.mark.slow

SLOW_TOOL = '''
import asyncio


async def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    await asyncio.sleep(1.5)
    return a * b
'''


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_data_dir(tmp_path_factory.mktemp("async-data"))


@pytest.fixture(scope="module")
def sync_run(tiny_model_dir, data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("sync")
    run_plain(run_args(tiny_model_dir, data_dir, out, *GRPO, *LOG_PROBS))
    return out


@pytest.fixture(scope="module")
def one_step_off_run(tiny_model_dir, data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("one-step-off")
    done = run_plain(run_args(tiny_model_dir, data_dir, out, *GRPO, *ONE_STEP_OFF))
    return out, done.stdout


def test_bound_zero_is_the_synchronous_run(tiny_model_dir, data_dir, sync_run, tmp_path):
    # A process (weights through shared memory, a file, or a torch.distributed broadcast), a thread
    # (handed over in memory), a pool of two processes (each generates half of every step's prompts;
    # the broadcast reaches both). The thread and the pool also validate (verl's use_trainer_do_validate=false:
    # the trainer holds no engine), with the same figures.
    for placement, backend, processes, trainer_validates in (
            ("process", "shm", 1, True), ("process", "file", 1, True), ("process", "broadcast", 1, True),
            ("thread", "memory", 1, False), ("process", "broadcast", 2, False)):
        out = tmp_path / f"{placement}-{backend}-{processes}"
        done = run_plain(run_args(tiny_model_dir, data_dir, out, *GRPO, *LOG_PROBS, *ASYNC,
                                  f"async_training.rollout_placement={placement}",
                                  f"async_training.checkpoint_engine.backend={backend}",
                                  f"rollout.n_gpus_per_node={processes}",
                                  f"async_training.use_trainer_do_validate={trainer_validates}"))
        where = "2 processes of its own (rollout.n_gpus_per_node)" if processes == 2 else f"a {placement} of its own"
        assert f"the rollout runs in {where}, ahead of the trainer by at most 0 step" in done.stdout
        assert ("validation: on the rollout" in done.stdout) != trainer_validates
        assert f"through {backend}" in done.stdout
        assert not (out / "weight_sync").exists() or not list((out / "weight_sync").iterdir())  # files read, gone
        metrics = step_metrics(out)
        for step in (1, 2, 3):
            assert metrics[step]["async/staleness_max"] == 0 and metrics[step]["async/trainer_version"] == step - 1
        assert metrics[1]["async/weight_sync_bytes"] > 0  # the first request carries the weights
        # The rewards: scored by a rollout process as it generates (by the trainer, beside a rollout thread).
        scorer = "trainer" if placement == "thread" else "rollout"
        assert f"rewards: scored by the {scorer}" in done.stdout
        for step in (1, 2, 3):
            assert ("timing_s/reward" in metrics[step]) == (scorer == "trainer")
            assert (metrics[step]["async/rollout_reward_s"] > 0) == (scorer == "rollout")
        assert_same_metrics(step_metrics(sync_run), without_async(metrics))
        assert_same_weights(sync_run / "huggingface", out / "huggingface", tiny_model_dir)
        # The rollout generated every step with the weights the trainer then trained from: its
        # log-probs are the trainer's (to float rounding), so each sync reached it.
        for step in (2, 3):
            assert metrics[step]["actor/rollout_log_prob_diff"] < 1e-5


def test_a_critic_and_multi_turn_tool_calls_run_apart_as_in_one_process_and_lora_adapters_reach_the_rollout(
        rl_inputs, plain_run, tool_run, tmp_path):
    model, data = rl_inputs
    ppo = tmp_path / "ppo"
    run_plain(run_args(model, data, ppo, *PPO, *ASYNC))
    assert_same_metrics(step_metrics(plain_run(*PPO)), without_async(step_metrics(ppo)))
    # Multi-turn: the rollout process runs the agent loop and the tool calls (validation's too: the trainer holds
    # no engine, nor an agent loop); bound 0 is the one-process run.
    tool_model, task, one = tool_run
    turns = tmp_path / "turns"
    run_plain(tool_task_args(tool_model, task, turns, *SCALE_OUT_KEYS, *ASYNC,
                             "async_training.use_trainer_do_validate=false"))
    assert any(k.startswith("val-core/") for k in step_metrics(turns)[0])
    assert_same_metrics(step_metrics(one), without_async(step_metrics(turns)))
    assert_same_weights(one / "huggingface", turns / "huggingface", tool_model)
    # One step off with partial rollouts and a tool that takes 1.5 s: the trainer publishes while the
    # second batch is in flight (within a turn or while its tools run: where exactly is a race between the two
    # processes; test_agent_loop pins a swap between turns), and its unfinished responses go on under the new
    # weights. Only the first batch is drawn by the memorized weights alone, so it alone must call the tool: after
    # one update at lr 1e-2, whether a sample still calls it depends on where the swap fell.
    slow_tools = tmp_path / "slow_tools.py"
    slow_tools.write_text(SLOW_TOOL)
    stale = tmp_path / "turns-stale"
    run_plain(tool_task_args(tool_model, task, stale, *SCALE_OUT_KEYS, *ONE_STEP_OFF,
                             "async_training.partial_rollout=true",
                             f"actor_rollout_ref.rollout.multi_turn.tool_functions={slow_tools}"))
    metrics = step_metrics(stale)
    assert metrics[1]["agent/tool_calls/mean"] > 0 and metrics[1]["async/partial_frac"] == 0
    assert max(m["async/staleness_max"] for m in metrics.values() if "async/staleness_max" in m) == 1
    partial = [m for m in metrics.values() if m.get("async/partial_frac", 0) > 0]
    assert partial, "no batch took new weights mid-generation"
    assert all(m["async/staleness_last_mean"] < m["async/staleness_mean"] for m in partial)
    # LoRA: by default (verl's lora.merge=false) the rollout gets the adapters alone, the base weights once
    # with its first weights, and merges them itself; with lora.merge=true it gets merged weights. Either
    # way its log-probs follow the trainer's after every update, and the two are the same run (the first validated
    # by the rollout, from its adapters, the second by the trainer).
    lora = {}
    for merge, said in (("false", "the adapters alone"), ("true", "the weights with the adapters merged in")):
        lora[merge] = tmp_path / f"lora-merge-{merge}"
        done = run_plain(run_args(model, data, lora[merge], *GRPO, *LOG_PROBS, *ASYNC,
                                  "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
                                  f"actor_rollout_ref.model.lora.merge={merge}",
                                  f"async_training.use_trainer_do_validate={merge == 'true'}"))
        assert f"LoRA: the rollout gets {said}" in done.stdout
        metrics = step_metrics(lora[merge])
        assert all(metrics[step]["actor/rollout_log_prob_diff"] < 1e-5 for step in (2, 3))
        assert metrics[3]["actor/pg_loss"] != 0
    assert_same_metrics(computed(lora["true"]), computed(lora["false"]))
    assert_same_weights(lora["true"] / "huggingface", lora["false"] / "huggingface", model)
    sent = {merge: [step_metrics(out)[step]["async/weight_sync_bytes"] for step in (1, 2, 3)]
            for merge, out in lora.items()}
    assert sent["false"][0] > sent["true"][0]  # the base weights and the adapters, once
    assert sent["false"][1] == sent["false"][2] < sent["true"][1] / 4, sent  # then the adapters alone
    # Two torchrun ranks: each gathers the adapters' shards alone (not the whole model) for the rollout of rank 0.
    ranks = tmp_path / "lora-two-ranks"
    done = run_torchrun_module("verl.trainer.main_ppo", run_args(
        model, data, ranks, *GRPO, *LOG_PROBS, *ASYNC, "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora_alpha=16"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_metrics(computed(lora["false"]), computed(ranks))
    assert_same_weights(lora["false"] / "huggingface", ranks / "huggingface", model)


def test_one_step_off_trains_each_step_on_the_previous_versions_samples(one_step_off_run, sync_run, tmp_path):
    out, stdout = one_step_off_run
    assert "ahead of the trainer by at most 1 step(s)" in stdout
    assert "the rollout's log-probs are pi_old of the PPO ratio" in stdout
    metrics = step_metrics(out)
    # Step 1 and 2 were generated with the initial weights (version 0), step 3 with version 1.
    assert [metrics[s]["async/rollout_version"] for s in (1, 2, 3)] == [0, 0, 1]
    assert [metrics[s]["async/staleness_max"] for s in (1, 2, 3)] == [0, 1, 1]
    # The rollout worked ahead: step 2's batch was already there (or on its way) when step 1 ended.
    assert metrics[1]["async/in_flight"] + metrics[1]["async/queue_depth"] >= 1
    # The gap between the rollout's log-probs and the trainer's, over the update's two mini-batches: at
    # step 1 only the second mini-batch's (one optimiser step on), at step 2 a whole version more.
    assert 0 < metrics[1]["async/mismatch_kl"] < metrics[2]["async/mismatch_kl"]
    # The same samples as the synchronous run at step 1 (same weights), other ones after.
    sync = step_metrics(sync_run)
    assert metrics[1]["response_length/mean"] == sync[1]["response_length/mean"]


def test_one_step_off_is_the_same_run_in_a_thread_and_after_a_resume(tiny_model_dir, data_dir, one_step_off_run,
                                                                      tmp_path):
    reference, _ = one_step_off_run
    thread = tmp_path / "thread"
    run_plain(run_args(tiny_model_dir, data_dir, thread, *GRPO, *ONE_STEP_OFF,
                       "async_training.rollout_placement=thread"))
    assert_same_metrics(computed(reference), computed(thread))
    # Resumed from step 2, whose checkpoint holds step 3's batch (generated with version 1).
    resumed = tmp_path / "resumed"
    shutil.copytree(reference / "global_step_2", resumed / "global_step_2")
    done = run_plain(run_args(tiny_model_dir, data_dir, resumed, *GRPO, *ONE_STEP_OFF))
    assert done.stdout.count("Resumed from") == 1
    assert_same_metrics({3: computed(reference)[3]}, {3: computed(resumed)[3]})
    assert_same_weights(reference / "huggingface", resumed / "huggingface", tiny_model_dir)
    # A tighter bound than the one the checkpoint's batches were generated under is refused, naming both.
    tighter = tmp_path / "tighter"
    shutil.copytree(reference / "global_step_2", tighter / "global_step_2")
    done = run_module("verl.trainer.main_ppo",
                      run_args(tiny_model_dir, data_dir, tighter, *GRPO, *ASYNC, "async_training.max_staleness=0"))
    assert done.returncode != 0
    assert "holds the batch of step 3, generated with policy version 1" in done.stderr
    assert "resume with max_staleness >= 1" in done.stderr
    # A synchronous resume of it is told what it leaves out.
    plain = tmp_path / "plain"
    shutil.copytree(reference / "global_step_2", plain / "global_step_2")
    done = run_plain(run_args(tiny_model_dir, data_dir, plain, *GRPO))
    assert "holds 1 batch(es) generated ahead (steps [3])" in done.stderr


def test_a_fractional_staleness_threshold_sends_part_of_the_next_step_early_and_resumes_exactly(
        tiny_model_dir, data_dir, tmp_path):
    # verl's staleness_threshold=0.5 with a sync every step: the first half of each step's prompts is
    # generated one version early, the rest on the current weights (max_staleness would make it whole steps).
    keys = (*GRPO, *ASYNC, "async_training.staleness_threshold=0.5")
    out = tmp_path / "half"
    done = run_plain(run_args(tiny_model_dir, data_dir, out, *keys))
    assert "ahead of the trainer by at most 0 step(s) and the first 2 of the next step's 4 prompts" in done.stdout
    metrics = step_metrics(out)
    assert [metrics[step]["async/staleness_max"] for step in (1, 2, 3)] == [0, 1, 1]
    assert [metrics[step]["async/staleness_mean"] for step in (2, 3)] == [0.5, 0.5]  # 2 of 4 prompts, n=2 each
    # The checkpoint of step 2 holds step 3 (its head of version 1, its tail of version 2) and step 4's head,
    # with step 4's other prompts: the resumed run is the same run.
    resumed = tmp_path / "resumed"
    shutil.copytree(out / "global_step_2", resumed / "global_step_2")
    done = run_plain(run_args(tiny_model_dir, data_dir, resumed, *keys))
    assert done.stdout.count("Resumed from") == 1
    assert_same_metrics({3: computed(out)[3]}, {3: computed(resumed)[3]})
    assert_same_weights(out / "huggingface", resumed / "huggingface", tiny_model_dir)


def test_an_asynchronous_run_resumes_a_synchronous_checkpoint(tiny_model_dir, data_dir, sync_run, tmp_path):
    out = tmp_path / "from-sync"
    shutil.copytree(sync_run / "global_step_2", out / "global_step_2")
    done = run_plain(run_args(tiny_model_dir, data_dir, out, *GRPO, *LOG_PROBS, *ASYNC))
    assert done.stdout.count("Resumed from") == 1
    assert_same_metrics({3: step_metrics(sync_run)[3]},
                        {3: without_async(step_metrics(out))[3]})
    assert_same_weights(sync_run / "huggingface", out / "huggingface", tiny_model_dir)


def test_two_torchrun_ranks_train_asynchronously_exactly_like_one_process(tiny_model_dir, data_dir, sync_run,
                                                                          one_step_off_run, tmp_path):
    # Rank 0 holds the rollout; both ranks gather the weights for it and get every batch from it.
    # At bound 0 the rollout also validates (rank 0 sends the prompts, both ranks gather the weights and score).
    for name, keys, reference in (("bound0", (*LOG_PROBS, *ASYNC, "async_training.use_trainer_do_validate=false"),
                                   sync_run),
                                  ("bound1", ONE_STEP_OFF, one_step_off_run[0])):
        out = tmp_path / name
        done = run_torchrun_module("verl.trainer.main_ppo", run_args(tiny_model_dir, data_dir, out, *GRPO, *keys))
        assert done.returncode == 0, done.stderr[-4000:]
        assert done.stdout.count("Asynchronous RL: the rollout runs in a process") == 1  # said by rank 0
        ours = computed(out)
        if name == "bound0":
            ours = without_async(ours)
        assert_same_metrics(computed(reference) if name == "bound1" else step_metrics(reference), ours)
        assert_same_weights(reference / "huggingface", out / "huggingface", tiny_model_dir)



# Coarse, so that some groups of two responses score the same (DAPO drops them) and some differ.
COARSE_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(set(solution_str)) >= 5)
'''


def test_dynamic_sampling_draws_its_further_batches_from_the_rollout(tiny_model_dir, data_dir, tmp_path):
    reward = tmp_path / "coarse.py"
    reward.write_text(COARSE_REWARD)
    keys = (*GRPO, *LOG_PROBS, "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=3",
            f"custom_reward_function.path={reward}")
    sync = tmp_path / "sync"
    run_plain(run_args(tiny_model_dir, data_dir, sync, *keys))
    drawn = [m["filter_groups/num_gen_batches"] for m in step_metrics(sync).values()
             if "filter_groups/kept_groups" in m]
    assert len(drawn) == 3 and max(drawn) > 1  # the filter dropped groups and drew more
    # Bound 0 on two torchrun ranks: rank 0 asks the rollout for each further batch and passes it on;
    # the run is the synchronous one.
    bound0 = tmp_path / "bound0"
    done = run_torchrun_module("verl.trainer.main_ppo", run_args(tiny_model_dir, data_dir, bound0, *keys, *ASYNC))
    assert done.returncode == 0, done.stderr[-4000:]
    assert_same_metrics(step_metrics(sync), without_async(step_metrics(bound0)))
    assert_same_weights(sync / "huggingface", bound0 / "huggingface", tiny_model_dir)
    # One step off: a step's batch was generated ahead, one version old; the batches drawn to refill it
    # are generated when the step needs them, with the weights published last, so they are on-policy.
    off = tmp_path / "off"
    run_plain(run_args(tiny_model_dir, data_dir, off, *keys, *ONE_STEP_OFF, "trainer.save_freq=1"))
    metrics = step_metrics(off)
    refilled = 0
    for step in (2, 3):
        m = metrics[step]
        assert m["async/staleness_max"] <= 1 and m["async/trainer_version"] == step - 1
        assert m["filter_groups/trained_groups"] == 4 or m["filter_groups/cap_hit"] == 1
        if m["filter_groups/num_gen_batches"] > 1 and not m["filter_groups/cap_hit"]:
            # The first batch kept fewer than 4 groups: the rest are refills, staleness 0 (e.g. 3 stale
            # groups and 1 refilled: a mean of 0.75).
            refilled += 1
            mean = m["async/staleness_mean"]
            assert mean < 1 and mean * 4 == round(mean * 4)
    assert refilled, metrics
    # A resume from step 1 (its checkpoint holds step 2's batch, generated ahead) draws the refills from
    # where the loader stood: the same steps 2 and 3.
    resumed = tmp_path / "resumed"
    shutil.copytree(off / "global_step_1", resumed / "global_step_1")
    done = run_plain(run_args(tiny_model_dir, data_dir, resumed, *keys, *ONE_STEP_OFF, "trainer.save_freq=1"))
    assert done.stdout.count("Resumed from") == 1
    assert_same_metrics({s: computed(off)[s] for s in (2, 3)}, {s: computed(resumed)[s] for s in (2, 3)})
    assert_same_weights(off / "huggingface", resumed / "huggingface", tiny_model_dir)



def test_remax_baselines_are_generated_by_the_rollout_with_each_steps_samples(tiny_model_dir, data_dir, tmp_path):
    # ReMax's baseline (each prompt's greedy response, scored) is asked of the rollout right after the
    # step's samples, so it is generated with the same weights. Bound 0: the synchronous run.
    keys = ("algorithm.adv_estimator=remax", *LOG_PROBS)
    sync = tmp_path / "sync"
    run_plain(run_args(tiny_model_dir, data_dir, sync, *keys))
    bound0 = tmp_path / "bound0"
    run_plain(run_args(tiny_model_dir, data_dir, bound0, *keys, *ASYNC))
    assert_same_metrics(step_metrics(sync), without_async(step_metrics(bound0)))
    assert_same_weights(sync / "huggingface", bound0 / "huggingface", tiny_model_dir)
    # Half a step ahead: a step's head and tail each come with their baselines; a resume from step 2 (whose
    # checkpoint holds step 3's head and its baseline) is the same run.
    half = tmp_path / "half"
    keys = (*keys, *ASYNC, "async_training.staleness_threshold=0.5")
    run_plain(run_args(tiny_model_dir, data_dir, half, *keys))
    assert [step_metrics(half)[step]["async/staleness_mean"] for step in (2, 3)] == [0.5, 0.5]
    resumed = tmp_path / "resumed"
    shutil.copytree(half / "global_step_2", resumed / "global_step_2")
    run_plain(run_args(tiny_model_dir, data_dir, resumed, *keys))
    assert_same_metrics({3: computed(half)[3]}, {3: computed(resumed)[3]})
    assert_same_weights(half / "huggingface", resumed / "huggingface", tiny_model_dir)



UNGUARDED_SCRIPT = """
import sys
from verl.trainer.main_ppo import main

print("script ran", flush=True)  # spawn would run it again in the rollout process: once only
sys.exit(main(sys.argv[1:]))
"""


def test_a_script_without_a_main_guard_runs_an_asynchronous_distillation_like_one_process(tiny_model_dir, data_dir,
                                                                                          tmp_path):
    # python script.py with no `if __name__ == "__main__":` (spawn would start training again in the rollout
    # process, and fail there); on-policy distillation, whose teacher scores on the trainer's side.
    keys = (*GRPO, "distillation.enabled=true",
            f"distillation.teacher_models.teacher_model.model_path={tiny_model_dir}",
            "distillation.distillation_loss.use_task_rewards=false", "trainer.total_training_steps=2")
    sync = tmp_path / "sync"
    run_plain(run_args(tiny_model_dir, data_dir, sync, *keys))
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED_SCRIPT)
    out = tmp_path / "async"
    done = subprocess.run([sys.executable, str(script), *run_args(tiny_model_dir, data_dir, out, *keys, *ASYNC)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("script ran") == 1
    metrics = step_metrics(out)
    assert all("actor/distillation/loss" in metrics[step] for step in (1, 2))
    assert_same_metrics(step_metrics(sync), without_async(metrics))



def test_rollout_ranks_of_a_torchrun_job_train_exactly_like_one_process(tiny_model_dir, data_dir, sync_run,
                                                                          one_step_off_run, tmp_path):
    # The job's last rollout.n_gpus_per_node ranks generate, the first ones train: 1 + 2 ranks at bound 0 (a
    # pool of two rollout ranks, weights by broadcast, which validate too), 2 + 1 ranks one step off (weights in
    # shared memory).
    for name, rollout_ranks, keys, reference in (
            ("1+2", 2, (*LOG_PROBS, *ASYNC, *RANKS, "async_training.checkpoint_engine.backend=broadcast",
                        "rollout.n_gpus_per_node=2", "async_training.use_trainer_do_validate=false"), sync_run),
            ("2+1", 1, (*ONE_STEP_OFF, *RANKS), one_step_off_run[0])):
        out = tmp_path / name
        done = run_torchrun_module("verl.trainer.main_ppo", run_args(tiny_model_dir, data_dir, out, *GRPO, *keys),
                                   nproc=3)
        assert done.returncode == 0, done.stderr[-4000:]
        assert done.stdout.count(f"the rollout runs in the torchrun job's last {rollout_ranks} rank(s)") == 1
        ours = computed(out)
        if name == "1+2":
            ours = without_async(ours)
        assert_same_metrics(computed(reference) if name == "2+1" else step_metrics(reference), ours)
        assert_same_weights(reference / "huggingface", out / "huggingface", tiny_model_dir)


def test_verls_fully_async_command_line_streams_samples_with_partial_rollouts(tiny_model_dir, data_dir, tmp_path):
    out = tmp_path / "fully-async"
    base = [a for a in run_args(tiny_model_dir, data_dir, out, *GRPO)
            if not a.startswith(("data.train_batch_size=", "trainer.total_training_steps="))]
    # As verl's fully-async scripts write it: streaming sizes, samples in all, syncs every 2 updates;
    # partial rollouts (weights taken mid-generation) are its default.
    verl_keys = ["data.train_batch_size=0", "data.gen_batch_size=1", "rollout.total_rollout_steps=12",
                 "async_training.require_batches=1", "async_training.trigger_parameter_sync_step=2",
                 "async_training.staleness_threshold=0.1", "async_training.use_rollout_log_probs=True",
                 # weights sent by broadcast: one the partial rollout replaces before loading is still received;
                 # a rollout pool of two processes (verl's rollout resources), each taking every broadcast
                 "async_training.checkpoint_engine.backend=broadcast", "rollout.n_gpus_per_node=2"]
    done = run_module("verl.experimental.fully_async_policy.fully_async_main", [*base, *verl_keys])
    assert done.returncode == 0, done.stderr[-3000:]
    # 1 x 2 prompts per mini-batch x 2 updates per sync = 4 prompts a step; 12 prompts = 3 steps
    assert "= 4 prompts (data.train_batch_size)" in done.stdout
    assert "not read: data.train_batch_size=0 data.gen_batch_size=1" in done.stdout
    # verl's staleness_threshold=0.1: a tenth of a step's prompts one version early, at least one per process
    assert "trainer.total_training_steps=3" in done.stdout
    assert "at most 0 step(s) ahead and generates the first 10% of the next step's prompts one version early" \
        in done.stdout
    assert "ahead of the trainer by at most 0 step(s) and the first 2 of the next step's 4 prompts" in done.stdout
    assert "partial rollouts: weights published mid-generation are taken at once" in done.stdout
    assert "the rollout runs in 2 processes of its own" in done.stdout
    # as verl's trainer: a step takes the first prompts done, each process answering its prompts one by one
    assert "streaming: a step trains on the first 4 prompts whose samples are all generated" in done.stdout
    # verl's use_trainer_do_validate=false: the rollout pool validates (before training and after step 3)
    assert "validation: on the rollout" in done.stdout
    metrics = step_metrics(out)
    assert all(any(k.startswith("val-core/echo/") for k in metrics[step]) for step in (0, 3))
    assert all("async/dropped" in metrics[step] for step in (1, 2, 3))
    # The bound holds on the oldest version of every row (a request may start on weights newer than those it
    # went out with: timing); a row finished under newer weights is fresher (its last token), never older.
    assert metrics[1]["async/staleness_max"] == 0 and all(metrics[step]["async/staleness_max"] <= 1 for step in (2, 3))
    for step in (1, 2, 3):
        m = metrics[step]
        assert 0 <= m["async/partial_frac"] <= 1
        assert m["async/staleness_last_mean"] <= m["async/staleness_mean"]
        assert (m["async/partial_frac"] > 0) == (m["async/staleness_last_mean"] < m["async/staleness_mean"])
    assert metrics[3]["perf/total_num_tokens"] > 0 and 4 not in metrics


STREAM = ("async_training.stream_samples=true",)


def test_streamed_prompts_at_bound_zero_are_the_synchronous_run_and_one_step_off_keep_the_bound(
        tiny_model_dir, data_dir, sync_run, tmp_path):
    """verl's fully-async trainer: a step takes the first prompts whose samples are done, whichever step's
    request they came with. At bound 0 only the step's own prompts are out: the synchronous run. One step
    off, no trained sample is older than the bound, and a resume from step 2 trains on the prompts its
    checkpoint holds (generated by version 1; generated again they would be version 2's)."""
    out = tmp_path / "bound0"
    # validated by the rollout too, each prompt answered on its own (the figures are the synchronous run's)
    done = run_plain(run_args(tiny_model_dir, data_dir, out, *GRPO, *LOG_PROBS, *ASYNC, *STREAM,
                              "async_training.use_trainer_do_validate=false"))
    assert "streaming: a step trains on the first 4 prompts" in done.stdout
    assert "validation: on the rollout" in done.stdout
    metrics = step_metrics(out)
    assert all(metrics[step]["async/dropped"] == 0 for step in (1, 2, 3))
    assert_same_metrics(step_metrics(sync_run), without_async(metrics))
    assert_same_weights(sync_run / "huggingface", out / "huggingface", tiny_model_dir)

    off = tmp_path / "off"
    keys = (*GRPO, *ONE_STEP_OFF, *STREAM)
    run_plain(run_args(tiny_model_dir, data_dir, off, *keys))
    metrics = step_metrics(off)
    for step in (1, 2, 3):
        assert metrics[step]["async/staleness_max"] <= 1 and metrics[step]["async/trainer_version"] == step - 1
    assert metrics[3]["async/rollout_version"] == 1
    assert_streamed_prompts_resume(tiny_model_dir, data_dir, off, tmp_path / "resumed", keys, run_plain)


def assert_streamed_prompts_resume(tiny_model_dir, data_dir, saved, out, keys, run):
    """Resumed from step 2 of a streamed run one step off, under bound 0: the checkpoint's prompts (step 3's,
    generated by version 1) are too old for step 3 (trained at version 2), so all 4 are dropped and sent again
    with version 2's weights, which the rollout, started afresh, does not hold yet."""
    shutil.copytree(saved / "global_step_2", out / "global_step_2")  # that checkpoint alone
    done = run(run_args(tiny_model_dir, data_dir, out, *keys, "async_training.max_staleness=0"))
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("Resumed from") == 1
    again = step_metrics(out)[3]
    assert again["async/dropped"] == 4 and again["async/staleness_max"] == 0 and again["async/rollout_version"] == 2


def test_streamed_prompts_on_two_torchrun_ranks_are_sent_again_with_weights_every_rank_gathers(
        tiny_model_dir, data_dir, tmp_path):
    # Rank 0 takes the prompts; when it sends dropped ones again with new weights, both ranks gather them.
    keys = (*GRPO, *ONE_STEP_OFF, *STREAM)
    off = tmp_path / "off"
    done = run_torchrun_module("verl.trainer.main_ppo", run_args(tiny_model_dir, data_dir, off, *keys))
    assert done.returncode == 0, done.stderr[-4000:]
    assert all(m["async/staleness_max"] <= 1 for m in step_metrics(off).values() if "async/staleness_max" in m)
    assert_streamed_prompts_resume(tiny_model_dir, data_dir, off, tmp_path / "resumed", keys,
                                   lambda args: run_torchrun_module("verl.trainer.main_ppo", args))
