"""``python -m verl.trainer.main_ppo`` with ``actor_rollout_ref.rollout.name=vllm``: GRPO steps on a CPU,
in one process, on two torchrun ranks (each rank with its own engine) and asynchronously (the engine in
the rollout process)."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from verl.data import write_parquet  # noqa: E402
from verl.models.tiny import make_tiny_model_folder  # noqa: E402
from zygote import run_module, run_torchrun  # noqa: E402

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # Graded, so that advantages are not all zero: the share of distinct characters.
    return len(set(solution_str)) / (1 + len(solution_str))
'''
STEPS = 3


def _rows(n):
    return [{"prompt": [{"role": "user", "content": f"say {i % 10}:"}], "data_source": "echo",
             "reward_model": {"style": "rule", "ground_truth": str(i % 10)}, "extra_info": {"index": i}}
            for i in range(n)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-main-ppo")
    model = make_tiny_model_folder(root / "model", num_layers=2, hidden_size=128, intermediate_size=256)
    write_parquet(_rows(16), root / "train.parquet")
    write_parquet(_rows(4), root / "val.parquet")
    (root / "reward.py").write_text(REWARD)
    return root, model


def _args(root, model, out):
    return [f"actor_rollout_ref.model.path={model}", f"data.train_files={root / 'train.parquet'}",
            f"data.val_files={root / 'val.parquet'}", f"custom_reward_function.path={root / 'reward.py'}",
            "data.train_batch_size=4", "data.max_prompt_length=16", "data.max_response_length=8",
            "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.calculate_log_probs=true", f"trainer.total_training_steps={STEPS}",
            f"trainer.test_freq={STEPS}", f"trainer.default_local_dir={out}", "trainer.progress_bar=false"]


def _run(args, out, torchrun=False):
    # ``python -m verl.trainer.main_ppo args`` (``torchrun args``), as a fork of a process past its imports
    # (tests/integration/zygote.py: vLLM's among them, ~4 s of every run's start), the checkout importable, one thread.
    done = run_torchrun(args) if torchrun else run_module("verl.trainer.main_ppo", args)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    by_step: dict[int, dict] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        by_step.setdefault(row["step"], {}).update(row)
    return by_step


@pytest.fixture(scope="module")
def one_process(setup):
    root, model = setup
    out = root / "one"
    return out, _run(_args(root, model, out), out)


def test_grpo_steps_with_the_vllm_rollout(one_process):
    out, metrics = one_process
    steps = [metrics[s] for s in range(1, STEPS + 1)]
    assert all("timing_s/gen" in m for m in steps)
    assert steps[0]["critic/advantages/max"] > 0, "a real learning signal"
    # The engine's log-probs against the actor's recomputation, every step: the weights are synced after each update.
    for m in steps:
        assert m["actor/rollout_log_prob_diff"] < 1e-4, m["actor/rollout_log_prob_diff"]
    assert any(k.startswith("val-core/echo/") for k in metrics[STEPS])
    assert (out / "huggingface" / "config.json").exists()


def test_two_ranks_each_with_an_engine_train_like_one_process(setup, one_process):
    root, model = setup
    out = root / "two"
    two = _run(["--standalone", "--nproc_per_node=2",
                "-m", "verl.trainer.main_ppo", *_args(root, model, out)], out, torchrun=True)
    one = one_process[1]
    assert sorted(one) == sorted(two)
    # Per-request seeds: each rank's engine draws the samples one process draws for those rows.
    for step in one:
        for key in ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/entropy"):
            if key in one[step]:
                assert two[step][key] == pytest.approx(one[step][key], rel=1e-4, abs=1e-5), (step, key)



def test_an_asynchronous_run_generates_with_vllm_in_a_process_of_its_own(setup, one_process):
    # Bound 0: the rollout process's engine gets the trainer's weights before every request and draws what the
    # trainer's own engine draws (per-request seeds): the one-process run. With partial rollouts (verl's
    # fully-async default) the weights come on their own and the rollout steps vLLM's engine itself, asking
    # between steps for new weights (none come mid-batch at bound 0). (Staleness, its stamps and the correction
    # do not depend on the engine: tests/integration/test_async_rl.py; a swap midway: test_vllm_rollout.py.)
    # The rollout's engine validates too (verl's fully-async default): the trainer builds no vLLM engine.
    root, model = setup
    out = root / "async"
    bound0 = _run([*_args(root, model, out),
                   "async_training.enable=true", "async_training.partial_rollout=true",
                   "async_training.use_trainer_do_validate=false"], out)
    one = one_process[1]
    validated = [k for k in one[STEPS] if k.startswith("val-")]
    assert validated and all(bound0[STEPS][k] == pytest.approx(one[STEPS][k], abs=1e-6) for k in validated)
    for step in range(1, STEPS + 1):
        assert bound0[step]["async/staleness_max"] == 0 and bound0[step]["actor/rollout_log_prob_diff"] < 1e-4
        for key in ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/entropy"):
            assert bound0[step][key] == pytest.approx(one[step][key], rel=1e-4, abs=1e-5), (step, key)


def test_lora_adapters_reach_the_vllm_engine_as_merged_weights(setup):
    # verl's LoRA keys with vLLM: the engine gets base + B A after every update, so its log-probs stay
    # the actor's (an engine left on the base weights would drift from step 2 on).
    pytest.importorskip("peft")
    root, model = setup
    out = root / "lora"
    metrics = _run([*_args(root, model, out),
                    "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
                    "actor_rollout_ref.actor.optim.lr=5e-2", f"trainer.test_freq={STEPS + 1}"], out)
    steps = [metrics[s] for s in range(1, STEPS + 1)]
    assert all(m["actor/grad_norm"] > 0 for m in steps), "the adapters train"
    for m in steps:
        assert m["actor/rollout_log_prob_diff"] < 1e-4, m["actor/rollout_log_prob_diff"]
    assert (out / "huggingface" / "lora_adapter").is_dir()


def test_multi_turn_rollouts_with_tool_calls_on_the_vllm_engine(tmp_path_factory):
    # The agent loop drives vLLM turn by turn from token ids: the memorized model calls the tool,
    # reads the spliced result and answers; vLLM's log-probs of the model's tokens are the actor's.
    from agent_models import TOOL_CONVERSATION, memorize, tool_task_args, write_tool_task

    # hidden 128: vLLM's CPU attention wants a head size of 32 or more
    _, _, model = memorize(tmp_path_factory, "tool-model", [TOOL_CONVERSATION], hidden_size=128)
    task = tmp_path_factory.mktemp("tool-task")
    write_tool_task(task)
    out = task / "out"
    metrics = _run([*tool_task_args(
        model, task, out, "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.rollout.temperature=0.5", "actor_rollout_ref.actor.optim.lr=1e-3",
        "trainer.total_training_steps=2")], out)
    assert metrics[0]["val-core/calc/reward/mean@1"] == 1.0  # greedy: call, result, answer
    for step in (1, 2):
        m = metrics[step]
        assert m["agent/tool_calls/mean"] > 0 and m["agent/num_turns/max"] == 2 and m["agent/tool_errors"] == 0
        assert m["actor/rollout_log_prob_diff"] < 1e-4, m["actor/rollout_log_prob_diff"]
