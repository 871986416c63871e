"""The memory plan at the sizes users train: configs of published models built from their hyper-parameters
(no weights; parameters counted on the meta device), with parts checked against counts worked out by hand."""

import pytest
import torch
from transformers import Gemma2Config, LlamaConfig, Qwen2Config

from verl import doctor
from verl.config import TrainerConfig
from verl.errors import VerlError
from verl.trainer.main_ppo import main
from verl.trainer.ppo.memory_check import check_fits
from verl.trainer.ppo.memory_plan import GiB, ModelShape, plan_memory

QWEN25_7B = Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                        num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)
QWEN25_05B = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
QWEN25_15B = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
LLAMA3_8B = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False)
LLAMA3_70B = LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                         num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False)
GEMMA2_9B = Gemma2Config(hidden_size=3584, intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16,
                         num_key_value_heads=8, head_dim=256, vocab_size=256000, tie_word_embeddings=True)
RUN = ["trainer.backend=ray", "actor_rollout_ref.model.dtype=bf16", "data.train_batch_size=128",
       "data.max_prompt_length=1024", "data.max_response_length=1024", "actor_rollout_ref.rollout.n=8",
       "actor_rollout_ref.actor.ppo_mini_batch_size=32", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
       "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
       "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4"]


def hand_count(c, *, qkv_bias: bool = False, norms_per_layer: int = 2) -> int:
    """Embedding (and an untied lm_head), q/k/v/o with grouped keys and values, a gated MLP, the norms."""
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    q, kv = c.num_attention_heads * head_dim, c.num_key_value_heads * head_dim
    layer = 2 * c.hidden_size * q + 2 * c.hidden_size * kv + 3 * c.hidden_size * c.intermediate_size
    layer += (q + 2 * kv) * qkv_bias + norms_per_layer * c.hidden_size
    return (c.num_hidden_layers * layer + c.hidden_size
            + c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2))


@pytest.mark.parametrize("config, bias, norms, published", [
    (QWEN25_7B, True, 2, 7.62e9), (QWEN25_05B, True, 2, 0.494e9), (QWEN25_15B, True, 2, 1.54e9),
    (LLAMA3_8B, False, 2, 8.03e9), (LLAMA3_70B, False, 2, 70.6e9), (GEMMA2_9B, False, 4, 9.24e9)])
def test_parameters_of_published_models_match_the_hand_count_and_the_published_one(config, bias, norms, published):
    params = ModelShape.of(config).params
    assert params == hand_count(config, qkv_bias=bias, norms_per_layer=norms)
    assert abs(params - published) / published < 0.005


def plan(config, *keys, ranks):
    return plan_memory(TrainerConfig.from_cli(RUN + list(keys)), config, ranks=ranks, device="cuda:0",
                       available=80 * GiB)


def test_fsdp_size_shards_each_roles_state_over_its_own_group_not_all_ranks():
    # Llama-3-8B on 2 nodes x 8 GPUs, the actor sharded within a node (HSDP), the reference over all 16 ranks
    params = ModelShape.of(LLAMA3_8B).params
    hsdp = plan(LLAMA3_8B, "actor_rollout_ref.actor.fsdp_config.fsdp_size=8", ranks=16)
    size = lambda role, part: hsdp.parts[role, part][0]
    assert size("actor", "weights") == size("actor", "gradients") == params * 2 // 8  # 1.87 GiB, not 0.93
    assert size("actor", "optimizer") == 2 * params * 2 // 8
    assert "1/8 of the model" in hsdp.parts["actor", "weights"][1]
    assert size("reference", "weights") == params * 2 // 16
    full = plan(LLAMA3_8B, ranks=16)
    assert full.parts["actor", "weights"][0] == params * 2 // 16
    # fsdp_size=1: every rank holds the whole model, and the rollout gathers nothing
    whole = plan(LLAMA3_8B, "actor_rollout_ref.actor.fsdp_config.fsdp_size=1", ranks=16)
    assert whole.parts["actor", "weights"][0] == params * 2
    assert ("rollout", "gathered") not in whole.parts


def test_an_fsdp_size_that_does_not_divide_the_ranks_is_refused_by_the_plan_before_any_weight_loads():
    with pytest.raises(VerlError, match=r"actor_rollout_ref.actor.fsdp_config.fsdp_size=3 does not divide the "
                                        r"world size 16 .*\[1, 2, 4, 8, 16\]"):
        plan(LLAMA3_8B, "actor_rollout_ref.actor.fsdp_config.fsdp_size=3", ranks=16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="plans a GPU run from a machine without one")
def test_plan_ahead_of_a_torchrun_job_on_8_gpus_from_a_machine_without_one(tmp_path, capsys):
    # `--plan` runs in a plain process, before torchrun starts the 8 ranks it plans (it planned 1, and
    # trainer.device=cuda was refused: no GPU here)
    QWEN25_7B.save_pretrained(tmp_path / "qwen2.5-7b")  # config.json alone: nothing loads
    keys = [f"actor_rollout_ref.model.path={tmp_path / 'qwen2.5-7b'}", "trainer.n_gpus_per_node=8"] + RUN[1:]
    params = ModelShape.of(QWEN25_7B).params
    assert main(["--plan", *keys, "trainer.device=cuda"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("Memory plan per rank (cuda, 8 ranks, 7,615.6M parameters)")
    assert f"actor      weights         {params * 2 / 8 / GiB:5.2f} GiB  16-bit, 1/8 of the model" in printed
    assert "no GPU here: compare the peak with the memory of one of the 8 GPUs" in printed
    assert main(["--plan", *keys]) == 0  # a CPU run: 8 ranks too
    assert capsys.readouterr().out.startswith("Memory plan per rank (cpu, 8 ranks,")
    check, plan = doctor.check_memory_plan(keys + ["trainer.device=cuda"])
    assert (check.status, plan.ranks, plan.available) == ("INFO", 8, None)
    assert check.data["parts"]["actor/weights"] == params * 2 // 8


def test_a_sleeping_vllm_engine_counts_in_the_rollout_only_so_the_usual_7b_grpo_recipe_fits_an_h100():
    # verl's Qwen2.5-7B GRPO recipe on 8 x H100 80GB: vLLM at gpu_memory_utilization=0.5, 4096-token rows, micro-batch
    # 4 with gradient checkpointing. The engine sleeps between rollouts (free_cache_engine, the default): its
    # 40 GiB are free while the actor trains. Counted in every phase, the update planned 90.1 GiB: refused.
    keys = ("actor_rollout_ref.rollout.name=vllm", "data.max_prompt_length=1024", "data.max_response_length=3072",
            "actor_rollout_ref.model.enable_gradient_checkpointing=true",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4")
    awake = plan(QWEN25_7B, *keys, ranks=8)
    size = lambda role, part: awake.parts[role, part][0]
    state = size("actor", "weights") + size("actor", "optimizer") + size("reference", "weights")
    assert size("rollout", "vLLM") == 40 * GiB
    assert awake.phases["rollout"] == state + 40 * GiB
    assert awake.phases["update"] == state + size("actor", "gradients") + size("actor", "activations")
    assert awake.peak < 60 * GiB and "asleep between rollouts" in awake.parts["rollout", "vLLM"][1]
    kept = plan(QWEN25_7B, *keys, "actor_rollout_ref.rollout.free_cache_engine=false", ranks=8)
    assert kept.phases["update"] == awake.phases["update"] + 40 * GiB > 80 * GiB  # an engine that stays awake


QWEN25_32B = Qwen2Config(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
                         num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False)


def test_a_vllm_engine_whose_weights_fill_its_share_of_the_gpu_is_refused_with_the_fix():
    # Qwen2.5-32B in bf16 is 61.0 GiB; vLLM's share of an 80 GiB H100 at 0.5 is 40 GiB: vLLM cannot start. The plan
    # counted 40 GiB and said it fits (peak 62.9 GiB).
    keys = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.model.enable_gradient_checkpointing=true",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
    weights = ModelShape.of(QWEN25_32B).params * 2
    one = plan(QWEN25_32B, *keys, ranks=8)
    assert one.parts["rollout", "vLLM"][0] == weights  # 61.0 GiB, more than the 40 GiB share
    assert "61.0 GiB per GPU at tensor_model_parallel_size=1" in one.engine_problem
    with pytest.raises(VerlError, match=r"vLLM on cuda:0: its weights alone, 61.0 GiB .* vLLM cannot start.*"
                                        r"a larger actor_rollout_ref.rollout.tensor_model_parallel_size"):
        check_fits(one)
    # split over 2 GPUs: 30.5 GiB each, inside the share, which is what the engine takes
    two = plan(QWEN25_32B, *keys, "actor_rollout_ref.rollout.tensor_model_parallel_size=2", ranks=8)
    assert two.engine_problem is None and two.parts["rollout", "vLLM"][0] == 40 * GiB
    check_fits(two)
    # Qwen2.5-1.5B (2.9 GiB) on one 24 GiB GPU at 0.1: 2.4 GiB, though the whole run fits
    tenth = TrainerConfig.from_cli(RUN + list(keys) + ["actor_rollout_ref.rollout.gpu_memory_utilization=0.1"])
    small = plan_memory(tenth, QWEN25_15B, ranks=1, device="cuda:0", available=24 * GiB)
    assert small.engine_problem and small.peak < 24 * GiB  # the total alone would have let it through
    with pytest.raises(VerlError, match="vLLM cannot start"):
        check_fits(small)


def test_plan_ahead_makes_the_runs_config_checks_over_the_ranks_it_plans_first(tmp_path, capsys):
    # 2 nodes x 8 GPUs: 32 prompts x 8 samples = 16 per rank, which a micro-batch of 3 does not divide. The run
    # refuses it; `--plan` printed a plan of it.
    QWEN25_7B.save_pretrained(tmp_path / "qwen2.5-7b")
    keys = [f"actor_rollout_ref.model.path={tmp_path / 'qwen2.5-7b'}", "trainer.nnodes=2", "trainer.n_gpus_per_node=8",
            *RUN[1:], "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"]
    assert main(["--plan", *keys]) == 2
    captured = capsys.readouterr()
    assert "Memory plan" not in captured.out
    assert ("(16 per rank over 16 ranks) is not divisible by actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"
            in captured.err)
    check, plan = doctor.check_memory_plan(keys)
    assert check.status == "FAIL" and "16 per rank over 16 ranks" in check.summary and plan is None
