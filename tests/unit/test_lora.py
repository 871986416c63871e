"""LoRA (verl.models.lora, with real PEFT) on the tiny model: only the adapters train, the reference
is the base model, every rollout engine decodes with the merged weights, the export and the adapter
folder reload, and a checkpoint resumes exactly."""

import dataclasses
import io
import re

import pytest
import torch

from verl.config import TrainerConfig
from verl.distributed.fsdp import full_state_dict
from verl.errors import ModelLoadError
from verl.models.loading import load_causal_lm
from verl.models.logprob import compute_response_logprobs
from verl.models.lora import apply_lora, merged_weights
from verl.rollout.seeding import with_prompt_seeds
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

from tests.unit.test_workers import prompt_batch

torch.set_num_threads(1)
RESPONSE_LENGTH = 6


def lora_config(tiny_model_dir, *, model=None, rollout=None, hybrid_engine=True):
    cfg = TrainerConfig(
        data=dict(max_response_length=RESPONSE_LENGTH), trainer=dict(device="cpu"),
        actor_rollout_ref=dict(model={"path": str(tiny_model_dir), "lora_rank": 4, "lora_alpha": 8, **(model or {})},
                               rollout=dict(n=2, **(rollout or {})), hybrid_engine=hybrid_engine,
                               actor=dict(ppo_mini_batch_size=2, use_kl_loss=True, optim=dict(lr=5e-2))))
    return cfg.actor_rollout_ref


def trained_worker(cfg) -> ActorRolloutRefWorker:
    """A LoRA worker after one PPO update (so its adapters are no longer zero)."""
    worker = ActorRolloutRefWorker(cfg)
    one_update(worker)
    return worker


def prompts(worker, draw=0):
    """The test prompts with their rollout seeds: what is sampled depends on the weights alone."""
    return with_prompt_seeds(prompt_batch(worker.tokenizer), 1, draw)


def one_update(worker, draw=0):
    gen = worker.generate_sequences(prompts(worker, draw))
    batch = gen.union(worker.compute_log_prob(gen)).union(worker.compute_ref_log_prob(gen))
    batch["advantages"] = torch.tensor([1.0, 1.0, -1.0, -1.0])[:, None] * gen["response_mask"]
    return worker.update_actor(batch)


def sampled(worker, draw=0):
    """A rollout with the engine's log-probs (temperature only: comparable with the actor's)."""
    params = dataclasses.replace(worker.sampling_params(), logprobs=True)
    return worker.generate_sequences(prompts(worker, draw), params)


@pytest.fixture(scope="module")
def worker(tiny_model_dir):
    return trained_worker(lora_config(tiny_model_dir))


def test_only_the_adapters_are_trainable_and_reach_the_optimiser(tiny_model_dir):
    worker = ActorRolloutRefWorker(lora_config(tiny_model_dir))
    model = worker.actor_model
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # all-linear: q, k, v, o, gate, up, down in each of the 2 layers, an A and a B each; not lm_head.
    assert len(trainable) == 2 * 7 * 2
    optimised = [p for group in worker.actor.optimizer.param_groups for p in group["params"]]
    assert len(optimised) == len(trainable) and all(p.requires_grad for p in optimised)
    assert worker.ref_model is model  # the reference is the actor with adapters off: no copy


def test_an_update_changes_the_adapters_only(tiny_model_dir):
    worker = ActorRolloutRefWorker(lora_config(tiny_model_dir))
    before = {k: v.clone() for k, v in full_state_dict(worker.actor_model).items()}
    metrics = one_update(worker)
    assert metrics["actor/grad_norm"] > 0
    after = full_state_dict(worker.actor_model)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_B." in k or ".lora_A." in k for k in changed), changed
    # B starts at zero, so the first step moves B (A's gradient is B^T times something, zero).
    assert any(".lora_B." in k for k in changed)


def test_the_reference_is_the_base_model_exactly_and_the_actor_differs_from_it(worker, tiny_model_dir):
    gen = sampled(worker)
    ref = worker.compute_ref_log_prob(gen)["ref_log_prob"]
    base = load_causal_lm(str(tiny_model_dir)).eval()
    with torch.no_grad():
        expected, _ = compute_response_logprobs(base, gen["input_ids"], gen["attention_mask"], gen["position_ids"],
                                                gen["responses"], share_prompts=worker.ref.share_prompts)
    assert torch.equal(ref, expected)
    actor = worker.compute_log_prob(gen)["old_log_probs"]
    assert (actor - ref).abs().max() > 1e-3  # the trained adapters act outside the reference


@pytest.mark.parametrize("rollout, hybrid", [("hf", True), ("native", True), ("hf", False)],
                         ids=["hf-hybrid", "native-hybrid", "hf-copy"])
def test_after_an_update_the_rollout_decodes_with_the_merged_weights(tiny_model_dir, rollout, hybrid):
    worker = trained_worker(lora_config(tiny_model_dir, rollout=dict(name=rollout), hybrid_engine=hybrid))
    gen = sampled(worker, draw=1)
    mask = gen["response_mask"].bool()
    actor = worker.compute_log_prob(gen)["old_log_probs"]
    ref = worker.compute_ref_log_prob(gen)["ref_log_prob"]
    torch.testing.assert_close(gen["rollout_log_probs"][mask], actor[mask], atol=1e-5, rtol=0)
    assert (gen["rollout_log_probs"][mask] - ref[mask]).abs().max() > 1e-3  # not the base weights


def test_merged_weights_equal_peft_merge_and_unload(worker):
    state = full_state_dict(worker.actor_model)
    merged = merged_weights(worker.actor_model, state)
    # PEFT's own merge of the same adapters, on an unsharded copy: the same names and numbers.
    peft_model = apply_lora(load_causal_lm(worker.model_path), worker.config.model)
    peft_model.load_state_dict(state)
    reference = peft_model.merge_and_unload().state_dict()
    assert set(merged) == set(reference)
    for key, value in reference.items():
        torch.testing.assert_close(merged[key], value, atol=1e-6, rtol=0)



def test_a_rollout_sent_the_adapters_alone_merges_exactly_the_trainers_merged_weights(tiny_model_dir, worker):
    from verl.errors import VerlError
    from verl.models.lora_sync import AdapterMerger
    from verl.workers.rollout_worker import RolloutWorker

    fresh = ActorRolloutRefWorker(lora_config(tiny_model_dir))
    rollout = AdapterMerger()
    with pytest.raises(VerlError, match="LoRA adapters without the base weights"):
        rollout.weights(fresh.rollout_weights("adapters"))
    # The first weights carry the base; later ones the adapters alone, which the rollout merges into it.
    first = {name: tensor.clone() for name, tensor in fresh.rollout_weights("adapters+base").items()}  # as sent
    assert all(torch.equal(a, b) for a, b in zip(rollout.weights(first).values(),
                                                  fresh.rollout_weights("merged").values()))
    one_update(fresh)
    adapters = {name: tensor.clone() for name, tensor in fresh.rollout_weights("adapters").items()}
    assert all(".lora_" in name for name in adapters)
    merged, expected = rollout.weights(adapters), fresh.rollout_weights("merged")
    assert merged.keys() == expected.keys() and all(torch.equal(merged[k], expected[k]) for k in expected)
    assert any(not torch.equal(merged[k], v) for k, v in rollout.weights(first).items())  # the update moved them
    # Through the rollout worker of an asynchronous run: it decodes with the trainer's weights.
    copy = RolloutWorker(fresh.config, device="cpu", max_response_length=RESPONSE_LENGTH)
    copy.load_weights(first, 0)
    copy.load_weights(adapters, 1)
    params = dataclasses.replace(fresh.sampling_params(), logprobs=True)
    gen = copy.generate_sequences(prompts(fresh, 1), params)
    mask = gen["response_mask"].bool()
    actor = fresh.compute_log_prob(gen)["old_log_probs"]
    torch.testing.assert_close(gen["rollout_log_probs"][mask], actor[mask], atol=1e-5, rtol=0)
    # A model without LoRA sends its full weights whatever is asked.
    plain = ActorRolloutRefWorker(lora_config(tiny_model_dir, model={"lora_rank": 0}))
    assert plain.rollout_weights("adapters").keys() == plain.rollout_weights("merged").keys()


def test_export_is_a_plain_merged_model_and_the_adapter_reloads(worker, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    worker.export_hf(tmp_path / "hf")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    gen = sampled(worker)
    with torch.no_grad():
        expected = worker.actor_model(input_ids=gen["input_ids"], attention_mask=gen["attention_mask"]).logits
        got = exported(input_ids=gen["input_ids"], attention_mask=gen["attention_mask"]).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)

    # The adapter folder continues training from where this worker is (lora_adapter_path).
    assert (tmp_path / "hf" / "lora_adapter" / "adapter_config.json").is_file()
    resumed = ActorRolloutRefWorker(lora_config(tiny_model_dir, model=dict(
        lora_rank=0, lora_adapter_path=str(tmp_path / "hf" / "lora_adapter"))))
    torch.testing.assert_close(resumed.compute_log_prob(gen)["old_log_probs"],
                               worker.compute_log_prob(gen)["old_log_probs"], atol=1e-6, rtol=0)
    torch.testing.assert_close(resumed.compute_ref_log_prob(gen)["ref_log_prob"],
                               worker.compute_ref_log_prob(gen)["ref_log_prob"], atol=0, rtol=0)
    assert any(p.requires_grad for p in resumed.actor_model.parameters())  # loaded trainable


def test_resuming_from_a_checkpoint_gives_identical_weights(tiny_model_dir):
    cfg = lora_config(tiny_model_dir)
    first = trained_worker(cfg)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    second = ActorRolloutRefWorker(cfg)
    second.load_state_dict(torch.load(buffer, weights_only=False))
    # One more step each: the optimiser state came along, so the weights stay bit-identical.
    one_update(first, draw=1), one_update(second, draw=1)
    a, b = full_state_dict(first.actor_model), full_state_dict(second.actor_model)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # And the resumed rollout decodes with the resumed weights.
    assert torch.equal(sampled(first)["responses"], sampled(second)["responses"])


def test_target_and_exclude_modules_pick_the_adapted_layers(tiny_model_dir):
    section = TrainerConfig(actor_rollout_ref=dict(model=dict(
        lora_rank=2, target_modules=["q_proj", "v_proj"], exclude_modules=".*layers\\.1\\..*"))).actor_rollout_ref.model
    model = apply_lora(load_causal_lm(str(tiny_model_dir)), section)
    adapted = sorted({n.split(".lora_")[0] for n, p in model.named_parameters() if p.requires_grad})
    assert adapted == ["base_model.model.model.layers.0.self_attn.q_proj",
                       "base_model.model.model.layers.0.self_attn.v_proj"]


def test_a_bad_adapter_path_or_target_is_a_clear_error(tiny_model_dir, tmp_path):
    section = TrainerConfig(actor_rollout_ref=dict(model=dict(lora_adapter_path=str(tmp_path)))).actor_rollout_ref.model
    with pytest.raises(ModelLoadError, match="no adapter_config.json"):
        apply_lora(load_causal_lm(str(tiny_model_dir)), section)
    section = TrainerConfig(actor_rollout_ref=dict(model=dict(lora_rank=2, target_modules=["embed_tokens"]))) \
        .actor_rollout_ref.model
    with pytest.raises(ModelLoadError, match="linear layers"):
        apply_lora(load_causal_lm(str(tiny_model_dir)), section)


def test_a_mistyped_target_module_is_refused_naming_the_layers_not_left_out_quietly(tiny_model_dir):
    # PEFT adapts the names that match and says nothing of one that matches none: a typo beside a good
    # name would train fewer layers than asked.
    def lora(target):
        section = TrainerConfig(actor_rollout_ref=dict(model=dict(lora_rank=2, target_modules=target))) \
            .actor_rollout_ref.model
        return apply_lora(load_causal_lm(str(tiny_model_dir)), section)

    with pytest.raises(ModelLoadError, match=re.escape(
            "actor_rollout_ref.model.target_modules=['q_prj', 'v_proj'] names 'q_prj', which no layer of "
            "Qwen2ForCausalLM has: LoRA would leave it out. The model's linear layers are named down_proj, gate_proj, "
            "k_proj, lm_head, o_proj, q_proj, up_proj, v_proj (did you mean q_prj -> q_proj?); or give "
            "target_modules=all-linear")):
        lora(["q_prj", "v_proj"])
    with pytest.raises(ModelLoadError, match=r"target_modules='q_prj'.*not found in the base model.* The model's "
                                             r"linear layers are named .*did you mean q_prj -> q_proj\?"):
        lora("q_prj")  # one name: PEFT's own error, with the names added
    lora(["self_attn.q_proj", "v_proj"])  # a dotted suffix matches, as in PEFT


@pytest.mark.parametrize("arch", ["mixtral", "gpt2"])
def test_all_linear_adapts_the_linear_layers_of_moe_and_conv1d_models_and_merges_exactly(arch, tmp_path, caplog):
    """all-linear on Mixtral (transformers 5: its experts are one fused 3-D parameter, its router a module of
    its own) adapts the attention's linear layers and leaves the experts frozen, saying so; it was refused
    (PEFT's all-linear picked the experts and the router). GPT-2's Conv1D layers are adapted. Either way
    the merged weights give the PEFT model's logits."""
    from verl.models.tiny import make_tiny_model_folder

    folder = make_tiny_model_folder(tmp_path / arch, arch=arch, num_layers=1, hidden_size=32, intermediate_size=64)
    section = TrainerConfig(actor_rollout_ref=dict(model=dict(lora_rank=2))).actor_rollout_ref.model
    with caplog.at_level("WARNING", logger="verl.models.lora"):
        model = apply_lora(load_causal_lm(str(folder)), section)
    adapted = sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n, p in model.named_parameters() if p.requires_grad})
    expected = {"mixtral": ["k_proj", "o_proj", "q_proj", "v_proj"], "gpt2": ["c_attn", "c_fc", "c_proj"]}[arch]
    assert adapted == expected
    assert ("MixtralExperts hold stacked" in caplog.text) == (arch == "mixtral")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.5)
        ids = torch.tensor([[5, 9, 40, 41, 7, 3]])
        adapted_logits = model(input_ids=ids).logits
        plain = load_causal_lm(str(folder)).eval()
        base_logits = plain(input_ids=ids).logits
        plain.load_state_dict(merged_weights(model, model.state_dict()))
        merged_logits = plain(input_ids=ids).logits
    assert (adapted_logits - base_logits).abs().max() > 1e-3  # the adapters do something
    torch.testing.assert_close(merged_logits, adapted_logits, atol=1e-5, rtol=0)


def test_upstream_verls_lora_checkpoint_of_gpt2_merges_its_square_conv1d_layer_exactly(tmp_path):
    """upstream verl's FSDP checkpoint of a GPT-2 PEFT model (one rank's DTensor state dict, the config in
    huggingface/, r and alpha in lora_train_meta.json) merges as PEFT does. Conv1D stores its weight [in, out]:
    the merger told that from the shapes, and GPT-2's attention output projection (c_proj, hidden x hidden) got
    the untransposed update."""
    import copy
    import json

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from verl.distributed.process_group import ensure_process_group
    from verl.model_merger.verl_format import verl_model
    from verl.models.tiny import build_tiny_config

    config = build_tiny_config(259, "gpt2", num_layers=1, hidden_size=32, intermediate_size=64)
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_config(config),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"]))
    with torch.no_grad():  # trained: the adapters' B away from zero
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    folder = tmp_path / "global_step_1" / "actor"
    config.save_pretrained(folder / "huggingface")
    (folder / "lora_train_meta.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "task_type": "CAUSAL_LM"}))
    ensure_process_group()  # one rank: its shard is the whole tensor, a DTensor all the same
    fully_shard(model, mesh=init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",)))
    torch.save(model.state_dict(), folder / "model_world_size_1_rank_0.pt")
    merged = verl_model(folder, None)[0].state_dict()
    assert merged.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(merged[name], expected[name], atol=1e-6, rtol=0, msg=name)
