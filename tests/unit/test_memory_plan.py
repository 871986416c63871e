"""The memory plan (verl.trainer.ppo.memory_plan): parts worked out by hand on a small shape, the
peaks measured on a GPU, the refusal and its fixes, and ``main_ppo --plan``."""

import dataclasses
import shlex
from pathlib import Path

import pytest
import torch
from transformers import Gemma2Config, MixtralConfig, Qwen2Config, Qwen2MoeConfig, Qwen3Config

from verl.config import TrainerConfig
from verl.errors import VerlError
from verl.models.loading import flash_attention_missing
from verl.trainer.main_ppo import load_config, main
from verl.trainer.ppo.memory_check import check_fits, check_memory_plan
from verl.trainer.ppo.memory_plan import GiB, ModelShape, plan_memory

SMALL = Qwen2Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, tie_word_embeddings=False)
SMALL_RUN = ["data.train_batch_size=4", "actor_rollout_ref.rollout.n=2", "data.max_prompt_length=8",
             "data.max_response_length=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.use_kl_loss=true",
             "algorithm.adv_estimator=grpo"]


def small_plan(*keys, ranks=1, device="cuda", available=None):
    return plan_memory(TrainerConfig.from_cli(SMALL_RUN + list(keys)), SMALL, ranks=ranks, device=device,
                       available=available)


def test_parts_of_a_small_qwen2_match_the_hand_count():
    # parameters: embed 100x32; per layer q 32x32+32, k and v 32x16+16, o 32x32, MLP 3 x 32x64, 2 norms of 32;
    # final norm 32; lm_head 100x32  ->  3200 + 2 x 9344 + 32 + 3200
    assert ModelShape.of(SMALL).params == 25120
    plan = small_plan()
    size = lambda role, part: plan.parts[role, part][0]
    assert size("actor", "weights") == size("actor", "gradients") == size("reference", "weights") == 25120 * 4
    assert size("actor", "optimizer") == 2 * 25120 * 4  # AdamW: exp_avg and exp_avg_sq
    # per token and layer in fp32: 2 norms x (4 + 2x4) x 32 + attention 5 x 4 x 32 + MLP 4 x 4 x 64 = 2432 bytes;
    # micro-batch 4 rows x 16 tokens, 2 layers; logits 4 rows x 100 x (16 x 4 + 12 x 8)
    assert size("actor", "activations") == 64 * 2 * 2432 + 4 * 100 * 160
    # KV cache: 8 rows x 16 tokens x 2 layers x (keys, values) x 2 kv heads x 8 dims x 4 bytes
    assert size("rollout", "KV cache") == 8 * 16 * 2 * 2 * 2 * 8 * 4
    # weights, gradients, AdamW's two states and the reference's weights, with the activations
    assert plan.phases["update"] == 5 * 25120 * 4 + size("actor", "activations")
    assert plan.peak == plan.phases["update"]


def test_sharding_offload_lora_and_checkpointing_lower_what_they_should():
    plain = small_plan()
    two = small_plan(ranks=2)
    assert two.parts["actor", "optimizer"][0] == plain.parts["actor", "optimizer"][0] // 2
    assert two.parts["rollout", "KV cache"][0] == plain.parts["rollout", "KV cache"][0] // 2  # half the rows
    # the engine decodes at most max_num_seqs rows at once (the others wait for a slot): 8 rows -> 3
    capped = small_plan("actor_rollout_ref.rollout.max_num_seqs=3")
    assert capped.parts["rollout", "KV cache"][0] == plain.parts["rollout", "KV cache"][0] * 3 // 8
    offload = small_plan("actor_rollout_ref.actor.fsdp_config.param_offload=true")
    assert offload.parts["actor", "weights"][0] == offload.parts["actor", "optimizer"][0] == 0
    assert small_plan("actor_rollout_ref.actor.fsdp_config.param_offload=true",
                      device="cpu").parts["actor", "weights"][0] > 0  # on a CPU, CPU memory is the memory
    lora = small_plan("actor_rollout_ref.model.lora_rank=4")
    assert lora.parts["actor", "gradients"][0] < plain.parts["actor", "gradients"][0] / 4
    assert ("reference", "weights") not in lora.parts  # the reference is the base weights under LoRA
    ckpt = small_plan("actor_rollout_ref.model.enable_gradient_checkpointing=true")
    # every layer's input (4 x 32 bytes a token), and one layer's activations with their gradients
    assert ckpt.parts["actor", "activations"][0] == 64 * (2 * 4 * 32 + 2 * 2432) + 4 * 100 * 160
    bf16 = small_plan("actor_rollout_ref.model.dtype=bf16")
    assert bf16.parts["actor", "weights"][0] == plain.parts["actor", "weights"][0] // 2
    no_ref = small_plan("actor_rollout_ref.actor.use_kl_loss=false")
    assert ("reference", "weights") not in no_ref.parts
    gae = small_plan("algorithm.adv_estimator=gae")
    # the value model: the policy without its LM head (100 x 32), with a value head (32 + a bias)
    assert gae.parts["critic", "state"][0] == 4 * (25120 - 3200 + 33) * 4


def test_the_critic_is_planned_as_the_value_model_it_is_of_its_own_model_and_with_lora(tmp_path):
    """The critic was planned as the whole policy: its LM head (vocab x hidden: ~7% of a 7B Qwen2) counted, a
    critic.model.path of another size ignored, and LoRA's frozen base weights given gradients and AdamW state."""
    tied = dataclasses.replace(SMALL)
    tied.tie_word_embeddings = True
    assert ModelShape.of(tied).params == 25120 - 3200 and ModelShape.of(tied).head_params == 0
    plan = plan_memory(TrainerConfig.from_cli(SMALL_RUN + ["algorithm.adv_estimator=gae"]), tied, device="cuda")
    assert plan.parts["critic", "state"][0] == 4 * (25120 - 3200 + 33) * 4  # the embeddings stay, a head is added
    # a critic of its own model: a Qwen2 twice as deep (2 x 9344 more), untied
    bigger = Qwen2Config(**{**SMALL.to_dict(), "num_hidden_layers": 4, "layer_types": None})
    bigger.save_pretrained(tmp_path / "critic")
    own = small_plan("algorithm.adv_estimator=gae", f"critic.model.path={tmp_path / 'critic'}")
    assert own.parts["critic", "state"][0] == 4 * (25120 + 2 * 9344 - 3200 + 33) * 4
    assert "critic.model.path's model" in own.parts["critic", "state"][1]
    gae = small_plan("algorithm.adv_estimator=gae")
    assert own.parts["actor", "weights"][0] == 25120 * 4  # the policy's plan is its own
    # activations of 4 layers, not 2 (per token and layer 2432 bytes; no critic micro-batch size: the mini-batch,
    # 4 prompts x 2 samples = 8 rows x 16 tokens)
    assert own.parts["critic", "activations"][0] == 8 * 16 * 4 * 2432
    assert gae.parts["critic", "activations"][0] == 8 * 16 * 2 * 2432
    # LoRA rank 4 on the critic: its weights, and gradients and AdamW state of the adapters and the value head;
    # per layer rank x (in + out) of q (32, 32), k and v (32, 16), o (32, 32), gate and up (32, 64), down (64, 32)
    lora = small_plan("algorithm.adv_estimator=gae", "critic.model.lora_rank=4")
    adapters = 2 * 4 * (64 + 2 * 48 + 64 + 3 * 96)
    assert lora.parts["critic", "state"][0] == ((25120 - 3200 + 33) + 3 * (adapters + 33)) * 4


QWEN3 = Qwen3Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)
GEMMA2 = Gemma2Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, tie_word_embeddings=False)


def test_attention_width_qk_norms_and_gemma2s_norms_eager_attention_and_soft_caps_count():
    """Qwen3's attention is heads x head_dim = 64 wide (not hidden 32) with per-head q/k norms; Gemma 2 has four
    norms a layer, runs eager attention by default (no sdpa) and soft-caps scores and logits. fp32 (c = 4),
    micro-batch 4 rows x 16 tokens, 2 layers."""
    size = lambda plan: plan.parts["actor", "activations"][0]
    # Qwen3 per token and layer: norms 2 x 12 x 32 + q/k norms 8 x (64 + 32) + attention 5 x 4 x 64 + MLP 16 x 64
    qwen3 = plan_memory(TrainerConfig.from_cli(SMALL_RUN), QWEN3, ranks=1, device="cuda")
    assert size(qwen3) == 64 * 2 * (768 + 768 + 1280 + 1024) + 4 * 100 * 160
    # Gemma 2: norms 4 x 12 x 32; attention 5 x 4 x 32 + probabilities (fp32 softmax 4 + tanh 4) x 4 heads x 16
    # tokens; MLP 16 x 64; logits 4 rows x 100 x (2 x 16 x 4 + 12 x 8)
    gemma2 = plan_memory(TrainerConfig.from_cli(SMALL_RUN), GEMMA2, ranks=1, device="cuda")
    assert size(gemma2) == 64 * 2 * (1536 + 640 + 512 + 1024) + 4 * 100 * 224
    assert gemma2.parts["log-prob", "forward"][0] == 8 * (16 * ModelShape.of(GEMMA2).forward_bytes(4)
                                                        + 100 * (2 * 16 * 4 + 8 * 8))
    # bf16 (c = 2): the fp32 copies of the response's logits get one more, the cast (a no-op in fp32)
    bf16 = plan_memory(TrainerConfig.from_cli(SMALL_RUN + ["actor_rollout_ref.model.dtype=bf16"]), QWEN3, ranks=1,
                       device="cuda")
    per_layer = 2 * 8 * 32 + 6 * 96 + 5 * 2 * 64 + 8 * 64
    assert size(bf16) == 64 * 2 * per_layer + 4 * 100 * (16 * 2 + 16 * 8)
    assert bf16.parts["log-prob", "forward"][0] == 8 * (16 * ModelShape.of(QWEN3).forward_bytes(2)
                                                      + 100 * (16 * 2 + 12 * 8))
    sdpa = plan_memory(TrainerConfig.from_cli(SMALL_RUN + ["actor_rollout_ref.model.attn_implementation=sdpa"]),
                       QWEN3, ranks=1, device="cuda")
    assert size(sdpa) == size(qwen3)  # Qwen3 has sdpa: no probabilities either way
    if flash_attention_missing("flash_attention_2"):  # Gemma 2 then loads its default, eager: counted as such
        flash = plan_memory(TrainerConfig.from_cli(SMALL_RUN + ["actor_rollout_ref.model.attn_implementation="
                                                                "flash_attention_2"]), GEMMA2, ranks=1, device="cuda")
        assert size(flash) == size(gemma2)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "gemma2", "mixtral", "qwen2_moe", "opt", "gpt2", "gpt_neox",
                                    "falcon", "stablelm"])
def test_a_layers_planned_activations_are_within_15_percent_of_what_autograd_keeps(family):
    """What the Hugging Face forward saves for its backward (every saved tensor's storage, once), bf16, 256 tokens.
    LayerNorms and plain MLPs (OPT's ReLU, GPT-NeoX's and Falcon's GELU) keep less than RMSNorms and gated MLPs:
    OPT's, Falcon's and GPT-NeoX's were planned at 2.2, 2.1 and 1.7 times it."""
    import transformers
    from transformers import AutoModelForCausalLM

    sizes = dict(vocab_size=512, hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=8,
                 num_key_value_heads=2)
    config = {"qwen2": lambda: Qwen2Config(**sizes), "qwen3": lambda: Qwen3Config(head_dim=64, **sizes),
              "gemma2": lambda: Gemma2Config(head_dim=64, query_pre_attn_scalar=64, **sizes),
              # Mixtures of experts: each token runs through num_experts_per_tok experts (and Qwen2-MoE's shared one).
              "mixtral": lambda: MixtralConfig(num_local_experts=8, num_experts_per_tok=2, **sizes),
              "qwen2_moe": lambda: Qwen2MoeConfig(num_experts=8, num_experts_per_tok=4, moe_intermediate_size=192,
                                                  shared_expert_intermediate_size=768, **sizes),
              # LayerNorm, a plain MLP: ReLU (OPT), GPT-2's gelu_new, GELU (GPT-NeoX, Falcon); StableLM's gated
              "opt": lambda: transformers.OPTConfig(vocab_size=512, hidden_size=256, ffn_dim=768, num_hidden_layers=2,
                                                    num_attention_heads=8, word_embed_proj_dim=256, dropout=0.0),
              "gpt2": lambda: transformers.GPT2Config(vocab_size=512, n_embd=256, n_inner=768, n_layer=2, n_head=8,
                                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
              "gpt_neox": lambda: transformers.GPTNeoXConfig(rotary_pct=0.25, **sizes),
              "falcon": lambda: transformers.FalconConfig(vocab_size=512, hidden_size=256, num_hidden_layers=2,
                                                          num_attention_heads=8),
              "stablelm": lambda: transformers.StableLmConfig(**sizes)}[family]()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).train()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = {}

    def keep(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model.base_model(input_ids=torch.randint(0, 512, (1, 256)))
    measured = sum(size for pointer, size in kept.items() if pointer not in weights)
    shape = ModelShape.of(config)
    planned = 256 * 2 * shape.layer_activation_bytes(2, 256, eager=shape.default_attention == "eager")
    assert abs(planned / measured - 1) <= 0.15, (planned, measured)


# Peak max_memory_allocated of scripts/gpu_check.sh on one H200 (docs/performance.md): a 358M Qwen2 of
# Qwen2-0.5B's shape with the byte-level tokenizer, GRPO with a reference, 64 prompts x 8, micro-batch 64.
GPU_SHAPE = Qwen2Config(vocab_size=259, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                        tie_word_embeddings=True)
GPU_RUN = ["data.train_batch_size=64", "data.max_prompt_length=32", "data.max_response_length=256",
           "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
           "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=128",
           "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=128", "actor_rollout_ref.actor.use_kl_loss=true",
           "algorithm.adv_estimator=grpo"]


@pytest.mark.parametrize("dtype,extra,measured_gib", [
    ("bf16", [], 27.37),
    ("bf16", ["actor_rollout_ref.model.enable_gradient_checkpointing=true"], 5.55),
    ("fp32", [], 51.74),
], ids=["bf16", "bf16_checkpointing", "fp32"])
def test_the_plan_is_within_15_percent_of_the_peaks_measured_on_a_gpu(dtype, extra, measured_gib):
    keys = [f"actor_rollout_ref.model.dtype={dtype}", f"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype={dtype}",
            f"actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype={dtype}"]
    plan = plan_memory(TrainerConfig.from_cli(GPU_RUN + keys + extra), GPU_SHAPE, ranks=1, device="cuda")
    assert ModelShape.of(GPU_SHAPE).params == pytest.approx(358e6, rel=0.01)
    assert plan.peak_phase == "update"
    assert abs(plan.peak / GiB / measured_gib - 1) <= 0.15, plan.table()


def test_a_plan_over_the_memory_names_the_largest_part_and_its_fixes():
    plan = small_plan(available=10**9)
    check_fits(plan)  # fits: nothing raised
    tight = small_plan("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "data.train_batch_size=8",
                       available=plan.peak)
    with pytest.raises(VerlError) as err:
        check_fits(tight)
    text = str(err.value)
    assert "per rank at its peak (update)" in text and "actor activations" in text
    assert "ppo_micro_batch_size_per_gpu" in text and "enable_gradient_checkpointing=true" in text
    assert "--plan" in text and "trainer.memory_check=false" in text


def test_a_plan_that_fits_with_little_headroom_is_warned_about(caplog):
    plan = small_plan("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "data.train_batch_size=8")
    for available, warned in ((int(plan.peak / 0.95), True), (int(plan.peak / 0.85), False), (plan.peak, True)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="verl.trainer.ppo.memory_plan"):
            check_fits(dataclasses.replace(plan, available=available))  # fits: nothing raised
        assert bool(caplog.records) == warned, available
        if warned:
            text = caplog.records[0].getMessage()
            assert "per rank at its peak (update)" in text and "may still run out of memory" in text
            assert "ppo_micro_batch_size_per_gpu" in text  # the first fix of the largest part


def test_the_documented_plan_command_prints_the_table_and_trains_nothing(tmp_path, monkeypatch, capsys):
    """docs/performance.md's `--plan` block, as written."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "performance.md"
    command = next(line for line in doc.read_text().splitlines() if line.startswith("python -m verl.trainer.main_ppo --plan"))
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(command)[3:]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("Memory plan per rank (cpu, 1 rank,") and "actor      activations" in printed
    assert "reference  weights" in printed and "peak" in printed and not (tmp_path / "outputs").exists()


def test_a_run_that_cannot_fit_stops_before_loading_and_memory_check_false_lets_it_through(tmp_path, capsys):
    huge = ["sft_warmstart.enable=false", "data.max_response_length=60000", "data.train_batch_size=4096",
            "trainer.total_training_steps=1", f"trainer.default_local_dir={tmp_path / 'run'}"]
    assert main(huge) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: this run needs about") and "rollout KV cache" in err
    assert not (tmp_path / "run").exists()
    config = load_config(huge + ["trainer.memory_check=false"])
    check_memory_plan(config, torch.device("cpu"))  # the plan is printed, the run is not refused
    assert "peak" in capsys.readouterr().out


def test_offload_switches_on_a_cpu_run_are_said_to_change_nothing(caplog, capsys):
    config = load_config(["sft_warmstart.enable=false", "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
                          "critic.fsdp_config.param_offload=true"])
    with caplog.at_level("WARNING", logger="verl.trainer.ppo.memory_plan"):
        check_memory_plan(config, torch.device("cpu"))
    [record] = caplog.records
    assert ("actor_rollout_ref.actor.fsdp_config.optimizer_offload=true, critic.fsdp_config.param_offload=true"
            in record.getMessage() and "changes nothing" in record.getMessage())
    caplog.clear()
    with caplog.at_level("WARNING", logger="verl.trainer.ppo.memory_plan"):
        check_memory_plan(load_config(["sft_warmstart.enable=false"]), torch.device("cpu"))
    assert not caplog.records


def test_the_rollouts_own_weights_count_in_every_phase_and_gathered_ones_in_the_rollout_only():
    plain = small_plan()
    assert ("rollout", "weights") not in plain.parts  # the hybrid engine decodes with the actor's weights
    for keys in (["actor_rollout_ref.rollout.name=vllm"], ["actor_rollout_ref.hybrid_engine=false"]):
        copy = small_plan(*keys, device="cpu")
        assert copy.parts["rollout", "weights"][0] == 25120 * 4
        runtime = copy.parts["process", "runtime"][0]
        assert copy.phases["update"] - runtime == plain.phases["update"] + 25120 * 4
    two = small_plan(ranks=2)
    assert two.parts["rollout", "gathered"][0] == 25120 * 4  # full weights on every rank while it decodes
    assert two.phases["rollout"] - two.phases["log_prob"] == (two.parts["rollout", "KV cache"][0] + 25120 * 4
                                                              - two.parts["log-prob", "forward"][0])
    # vLLM on a GPU takes its share of the GPU's memory, whatever the model
    gpu = small_plan("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
                     available=80 * GiB)
    assert gpu.parts["rollout", "vLLM"][0] == int(0.4 * 80 * GiB) and gpu.peak > 32 * GiB


def test_an_asynchronous_rollout_counts_its_copy_kv_cache_and_process_in_every_phase():
    plain, apart = small_plan(), small_plan("async_training.enable=true")
    assert apart.parts["async", "weights"][0] == 25120 * 4  # its own copy of the weights, all along
    # the KV cache of a whole step's generation: 8 rows x 16 tokens x 2 layers x 2 x 2 kv heads x 8 dims x 4 bytes
    assert apart.parts["async", "KV cache"][0] == 8 * 16 * 2 * 2 * 2 * 8 * 4
    for phase in plain.phases:  # it generates while the trainer does anything
        assert apart.phases[phase] == plain.phases[phase] + 25120 * 4 + 8 * 16 * 2 * 2 * 2 * 8 * 4
    assert ("async", "sync copy") not in apart.parts  # on a GPU the copy in flight is host memory
    cpu, cpu_plain = small_plan("async_training.enable=true", device="cpu"), small_plan(device="cpu")
    assert cpu.parts["async", "sync copy"][0] == 25120 * 4
    # the rollout process's own runtime: the same imports as this one
    assert cpu.parts["async", "runtime"][0] > 0.1 * GiB
    assert cpu.phases["update"] - cpu_plain.phases["update"] == pytest.approx(
        2 * 25120 * 4 + 8 * 16 * 2 * 2 * 2 * 8 * 4 + cpu.parts["async", "runtime"][0], abs=64 * 2**20)
    thread = small_plan("async_training.enable=true", "async_training.rollout_placement=thread", device="cpu")
    assert ("async", "runtime") not in thread.parts  # a thread of this process
    # Rollout ranks: on GPUs their copy and KV cache are on devices of their own; on a CPU, in this machine's memory.
    ranks = ("async_training.enable=true", "async_training.rollout_placement=ranks")
    assert small_plan(*ranks).phases == plain.phases
    assert small_plan(*ranks, device="cpu").parts["async", "weights"] == cpu.parts["async", "weights"]
    # vLLM in the rollout process on the trainer's GPU takes its share of that GPU beside the trainer's own engine.
    engines = small_plan("async_training.enable=true", "actor_rollout_ref.rollout.name=vllm",
                         "actor_rollout_ref.rollout.gpu_memory_utilization=0.3", available=80 * GiB)
    assert engines.parts["async", "vLLM"][0] == engines.parts["rollout", "vLLM"][0] == int(0.3 * 80 * GiB)
    assert ("async", "weights") not in engines.parts and engines.peak > 48 * GiB
    # The rollout validating too (verl's fully-async default), the trainer holds no engine: one vLLM share, not two.
    one = small_plan("async_training.enable=true", "actor_rollout_ref.rollout.name=vllm",
                     "actor_rollout_ref.rollout.gpu_memory_utilization=0.3", "async_training.use_trainer_do_validate=false",
                     available=80 * GiB)
    assert ("rollout", "vLLM") not in one.parts and one.parts["async", "vLLM"] == engines.parts["async", "vLLM"]
    assert one.phases["rollout"] == engines.phases["rollout"] - int(0.3 * 80 * GiB)
    # the trainer's engine sleeps between its rollouts (free_cache_engine): the rollout process's does not
    assert one.phases["update"] == engines.phases["update"] > int(0.3 * 80 * GiB)


@pytest.mark.parametrize("flags, cap, isa", [
    ({"amx_bf16", "avx512_bf16"}, None, "AMX"), ({"amx_bf16", "avx512_bf16"}, "AVX512_CORE_BF16", "AVX512_BF16"),
    ({"amx_bf16", "avx512_bf16"}, "AVX2", "none"), ({"avx512_bf16"}, None, "AVX512_BF16"), (set(), None, "none"),
])
def test_a_cpu_run_in_bf16_counts_the_weight_copies_onednn_keeps_for_its_matrix_units(monkeypatch, flags, cap, isa):
    # Measured on an AMX machine (benchmarks/bench_memory_plan.py, bf16, a 55M model and its reference): peak RSS
    # 1.33 GiB with AMX, 1.16-1.24 with ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16, 1.12 with AVX2 (the plan without copies).
    from verl.trainer.ppo import memory_plan

    monkeypatch.setattr(memory_plan, "_cpu_flags", lambda: flags)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert memory_plan.onednn_isa() == isa
    bf16 = ("actor_rollout_ref.model.dtype=bf16",)
    plan, fp32 = small_plan(*bf16, device="cpu"), small_plan(device="cpu")
    copies = {"AMX": 1.0, "AVX512_BF16": 0.5}.get(isa, 0.0)
    weights = plan.parts["actor", "weights"][0] + plan.parts["reference", "weights"][0]  # 2 bytes a parameter each
    assert weights == 2 * 25120 * 2
    assert plan.parts.get(("process", "oneDNN"), (0, ""))[0] == int(copies * weights)
    assert ("process", "oneDNN") not in fp32.parts  # fp32 matmuls keep no such copies
    assert ("process", "oneDNN") not in small_plan(*bf16).parts  # nor does a GPU
    apart = small_plan(*bf16, "async_training.enable=true", device="cpu")  # the rollout process multiplies its own
    assert apart.parts.get(("process", "oneDNN"), (0, ""))[0] == int(copies * 3 * 25120 * 2)
