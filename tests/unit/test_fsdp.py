"""verl.distributed.fsdp: the fsdp_config sections are applied (FSDP2 on a one-rank group here)."""

import copy

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from verl.config import TrainerConfig
from verl.data.collate import collate_prompts
from verl.distributed.fsdp import (export_hf, full_state_dict, load_full_state_dict, parallelize, resolve_fsdp_size,
                                   transformer_blocks)
from verl.distributed.process_group import ensure_process_group
from verl.errors import VerlError
from verl.models.loading import load_causal_lm, load_tokenizer
from verl.models.logprob import compute_response_logprobs
from verl.models.tiny import ARCHITECTURES, make_tiny_model_folder
from verl.models.value_model import ValueModel
from verl.rollout import assemble_rollout
from verl.workers import optim as optim_module
from verl.workers.actor import Actor
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.critic import Critic

PAD, EOS, RESPONSE_LENGTH = 0, 2, 4
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def trainer_config(**fsdp_config):
    return TrainerConfig(
        data=dict(max_response_length=RESPONSE_LENGTH), trainer=dict(device=str(DEVICE)),
        actor_rollout_ref=dict(rollout=dict(n=2), actor=dict(
            ppo_mini_batch_size=2, ppo_epochs=1, shuffle=False, optim=dict(lr=1e-3), fsdp_config=fsdp_config)),
        critic=dict(optim=dict(lr=1e-3), fsdp_config=fsdp_config))


def actor_config(**fsdp_config):
    return trainer_config(**fsdp_config).actor_rollout_ref.actor


@pytest.fixture(scope="module")
def case(tiny_model_dir):
    """The tiny model and a 4-sample batch (responses of 4, 4, 1, 2 tokens) with old log-probs and advantages."""
    return micro_batch_case(load_causal_lm(str(tiny_model_dir)))


def micro_batch_case(model):
    torch.manual_seed(0)
    prompts = collate_prompts([dict(input_ids=ids, raw_prompt="", data_source="t", ground_truth="", extra_info={},
                                    index=i) for i, ids in enumerate([[10, 11, 12], [20, 21], [30], [40, 41, 42]])],
                              PAD)
    responses = torch.tensor([[50, 51, 52, 53], [60, 61, 62, 63], [EOS, 0, 0, 0], [70, EOS, 0, 0]])
    batch = assemble_rollout(prompts, responses, RESPONSE_LENGTH, [EOS], PAD)
    with torch.no_grad():
        old, _ = compute_response_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                           batch["responses"])
    batch["old_log_probs"] = old + 0.05 * torch.randn_like(old)
    batch["advantages"] = torch.randn(4, RESPONSE_LENGTH) * batch["response_mask"]
    batch["values"] = torch.zeros(4, RESPONSE_LENGTH)
    batch["returns"] = torch.randn(4, RESPONSE_LENGTH) * batch["response_mask"]
    return model, batch


def make_actor(model, cfg, wrap: bool = True):
    """An actor whose model is sharded by ``cfg.fsdp_config`` (over one rank too, where its builders
    leave it plain), or with ``wrap=False`` as its builders make it."""
    return Actor(parallelize(copy.deepcopy(model), cfg.fsdp_config, device=DEVICE, plain_when_alone=not wrap), cfg,
                 DEVICE, samples_per_mini_batch=4, total_steps=1)


def unwrapped_actor(model, cfg, monkeypatch):
    """The same Actor code on the plain model (and a plain optimiser)."""
    with monkeypatch.context() as patch:
        patch.setattr(optim_module, "parallelize_optimizer", lambda optimizer, fsdp_config: optimizer)
        return Actor(copy.deepcopy(model).to(DEVICE), cfg, DEVICE, samples_per_mini_batch=4, total_steps=1)


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in full_state_dict(model).items()}


def max_change(before, after) -> float:
    return max((after[k] - before[k]).abs().max().item() for k in before)


# ---------------------------------------------------------------------------- wrapping
def test_parallelize_shards_each_decoder_layer_then_the_root(case):
    model = copy.deepcopy(case[0])
    blocks = transformer_blocks(model)
    assert [type(b).__name__ for b in blocks] == ["Qwen2DecoderLayer"] * 2
    assert list(blocks) == list(model.model.layers)

    parallelize(model, actor_config().fsdp_config, device=DEVICE, plain_when_alone=False)

    assert isinstance(model, FSDPModule) and isinstance(model, type(case[0]))
    assert all(isinstance(layer, FSDPModule) for layer in model.model.layers)
    assert sum(isinstance(m, FSDPModule) for m in model.modules()) == 3
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert dist.is_initialized() and dist.get_world_size() == 1


@pytest.mark.parametrize("fsdp_config,wrapped", [
    ({}, False), (dict(mixed_precision=dict(param_dtype="fp32", reduce_dtype="fp32")), False),
    (dict(optimizer_offload=True), False), (dict(param_offload=True), True),
    (dict(mixed_precision=dict(param_dtype="bf16")), True), (dict(mixed_precision=dict(reduce_dtype="bf16")), True),
], ids=["defaults", "fp32", "optimizer_offload", "param_offload", "bf16_compute", "bf16_gradients"])
def test_over_one_rank_fsdp_is_left_out_where_it_would_change_no_number(case, fsdp_config, wrapped):
    model = parallelize(copy.deepcopy(case[0]), actor_config(**fsdp_config).fsdp_config, device=DEVICE)
    assert isinstance(model, FSDPModule) == wrapped and isinstance(model, type(case[0]))
    assert all(isinstance(p, DTensor) == wrapped for p in model.parameters())
    assert all(p.device.type == DEVICE.type for p in model.parameters())


@pytest.mark.parametrize("weights,reduce_dtype,wrapped", [
    (torch.bfloat16, "fp32", False), (torch.bfloat16, "bf16", False), (torch.bfloat16, "fp16", True),
    (torch.float64, "fp32", True)], ids=["bf16_reduced_in_fp32", "bf16_in_bf16", "bf16_in_fp16", "fp64_in_fp32"])
def test_over_one_rank_gradients_reduced_in_a_dtype_that_rounds_them_keep_fsdp(case, weights, reduce_dtype, wrapped):
    # Over one rank the reduction is a cast there and back: lossless unless the dtype has a coarser step or a
    # smaller range than the weights' (fp16 for bf16: its range; fp32 for fp64: its step).
    model = copy.deepcopy(case[0]).to(weights)
    fsdp_config = actor_config(mixed_precision=dict(reduce_dtype=reduce_dtype)).fsdp_config
    assert isinstance(parallelize(model, fsdp_config, device=DEVICE), FSDPModule) == wrapped


def test_the_value_model_blocks_are_found_through_its_wrapped_causal_lm(case):
    value_model = ValueModel(copy.deepcopy(case[0]))
    assert transformer_blocks(value_model) == list(value_model.model.model.layers)


def test_without_hugging_face_hints_the_blocks_are_the_longest_module_list():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
            self.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])

    net = Net()
    assert transformer_blocks(net) == list(net.layers)


def test_the_one_rank_process_group_is_started_once_and_reused():
    ensure_process_group()
    group = dist.group.WORLD
    ensure_process_group()
    assert dist.group.WORLD is group and dist.get_world_size() == 1


def test_defaults_give_the_same_update_as_no_wrapping(case, monkeypatch):
    model, batch = case
    plain = unwrapped_actor(model, actor_config(), monkeypatch)
    wrapped = make_actor(model, actor_config())
    assert not isinstance(plain.model, FSDPModule) and isinstance(wrapped.model, FSDPModule)
    initial = weights(plain.model)

    metrics = {name: actor.update(batch) for name, actor in (("plain", plain), ("wrapped", wrapped))}

    assert max_change(initial, weights(plain.model)) > 1e-4
    for key, value in weights(plain.model).items():
        torch.testing.assert_close(weights(wrapped.model)[key], value, atol=1e-6, rtol=0, msg=key)
    assert metrics["wrapped"]["actor/grad_norm"] == pytest.approx(metrics["plain"]["actor/grad_norm"], rel=1e-5)


@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if a != "qwen2"])
def test_other_architectures_update_as_without_wrapping(arch, tmp_path_factory, monkeypatch):
    folder = make_tiny_model_folder(tmp_path_factory.mktemp(arch), arch=arch, num_layers=2, hidden_size=64,
                                    intermediate_size=128)
    model = load_causal_lm(str(folder))
    _, batch = micro_batch_case(model)
    plain = unwrapped_actor(model, actor_config(), monkeypatch)
    wrapped = make_actor(model, actor_config())
    assert len(transformer_blocks(wrapped.model)) == 2
    initial = weights(plain.model)
    for actor in (plain, wrapped):
        torch.manual_seed(0)  # the same dropout masks (OPT trains with dropout)
        actor.update(batch)
    assert max_change(initial, weights(plain.model)) > 1e-4
    for key, value in weights(plain.model).items():
        torch.testing.assert_close(weights(wrapped.model)[key], value, atol=1e-6, rtol=0, msg=key)


# ---------------------------------------------------------------------------- each option, applied
@pytest.mark.parametrize("option", [dict(param_offload=True), dict(optimizer_offload=True),
                                    dict(mixed_precision=dict(param_dtype="bf16"))],
                         ids=["param_offload", "optimizer_offload", "bf16"])
def test_one_ppo_update_changes_the_weights_with_each_option(case, option):
    model, batch = case
    actor = make_actor(model, actor_config(**option))
    initial = weights(actor.model)

    metrics = actor.update(batch)

    assert max_change(initial, weights(actor.model)) > 1e-4
    assert metrics["actor/grad_norm"] > 0 and torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))


def test_param_offload_keeps_parameters_and_gradients_on_cpu(case):
    model, batch = case
    actor = make_actor(model, actor_config(param_offload=True))
    for module in actor.model.modules():
        if isinstance(module, FSDPModule):
            # FSDP2 exposes no public getter for the policy a module was sharded with.
            assert isinstance(module._get_fsdp_state()._fsdp_param_group.offload_policy, CPUOffloadPolicy)
    loss, _ = actor.ppo_loss(batch, *compute_response_logprobs(
        actor.model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["responses"],
        with_entropy=True), dict(global_tokens=batch["response_mask"].sum(), global_seqs=len(batch)))
    loss.backward()
    assert all(p.to_local().device.type == "cpu" for p in actor.model.parameters())
    assert all(p.grad.to_local().device.type == "cpu" for p in actor.model.parameters())


def test_optimizer_offload_keeps_the_optimizer_state_on_cpu_also_after_loading(case):
    # On a CPU-only machine the model lives on the CPU too; the check bites where DEVICE is a GPU.
    model, batch = case
    actor = make_actor(model, actor_config(optimizer_offload=True))
    actor.update(batch)
    state = [v for s in actor.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert state and all(v.device.type == "cpu" for v in state)
    assert all(p.device.type == DEVICE.type for p in actor.model.parameters())

    actor.load_state_dict(actor.state_dict())
    assert all(v.device.type == "cpu" for s in actor.optimizer.state.values() for v in s.values())


def test_bf16_mixed_precision_computes_in_bf16_and_keeps_fp32_master_weights(case):
    model, batch = case
    actor = make_actor(model, actor_config(mixed_precision=dict(param_dtype="bf16")))
    seen = []
    actor.model.model.layers[0].register_forward_hook(lambda m, args, out: seen.append(out[0].dtype))

    actor.update(batch)

    assert seen and set(seen) == {torch.bfloat16}
    assert {p.dtype for p in actor.model.parameters()} == {torch.float32}
    assert {v.dtype for s in actor.optimizer.state.values() for k, v in s.items() if k != "step"} == {torch.float32}
    assert {v.dtype for v in full_state_dict(actor.model).values()} == {torch.float32}


@pytest.mark.parametrize("reduce_dtype", ["fp32", "bf16"])
def test_reduce_dtype_is_the_precision_gradients_arrive_in(case, reduce_dtype):
    model, batch = case
    fsdp_config = actor_config(mixed_precision=dict(reduce_dtype=reduce_dtype)).fsdp_config
    wrapped = parallelize(copy.deepcopy(model), fsdp_config, device=DEVICE, plain_when_alone=False)
    wrapped(input_ids=batch["input_ids"].to(DEVICE), labels=batch["input_ids"].to(DEVICE)).loss.backward()
    grads = [p.grad.full_tensor() for p in wrapped.parameters()]

    assert {g.dtype for g in grads} == {torch.float32}  # stored in the master weights' dtype
    in_bf16 = all(torch.equal(g, g.bfloat16().float()) for g in grads)
    assert in_bf16 == (reduce_dtype == "bf16")


def test_buffer_dtype_casts_floating_point_buffers(case):
    model = copy.deepcopy(case[0])
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    parallelize(model, actor_config(mixed_precision=dict(buffer_dtype="bf16")).fsdp_config, device=DEVICE)
    assert model.model.rotary_emb.inv_freq.dtype == torch.bfloat16


def test_the_critic_and_reference_are_sharded_by_their_own_sections(tiny_model_dir, case):
    model, batch = case
    config = trainer_config()
    config.actor_rollout_ref.model.path = str(tiny_model_dir)
    config.actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype = "bf16"
    worker = ActorRolloutRefWorker(config.actor_rollout_ref, device=DEVICE)
    # The actor's section asks for nothing FSDP does over one rank: it stays plain; the reference computes in bf16.
    assert not isinstance(worker.actor_model, FSDPModule) and isinstance(worker.ref_model, FSDPModule)
    seen = {"actor": set(), "ref": set()}
    for name, m in (("actor", worker.actor_model), ("ref", worker.ref_model)):
        m.model.layers[0].register_forward_hook(lambda mod, args, out, name=name: seen[name].add(out[0].dtype))
    worker.compute_log_prob(batch)
    worker.compute_ref_log_prob(batch)
    assert seen == {"actor": {torch.float32}, "ref": {torch.bfloat16}}

    critic_cfg = trainer_config(param_offload=True).critic
    critic = Critic(parallelize(ValueModel(copy.deepcopy(model)), critic_cfg.fsdp_config, device=DEVICE), critic_cfg,
                    DEVICE, samples_per_mini_batch=4, ppo_epochs=1, total_steps=1)
    assert isinstance(critic.model, FSDPModule)
    initial = weights(critic.model)
    critic.update(batch)
    assert max_change(initial, weights(critic.model)) > 1e-4


# ---------------------------------------------------------------------------- fsdp_size
def test_fsdp_size_minus_one_is_all_ranks_and_a_divisor_is_kept():
    assert resolve_fsdp_size(-1, 8) == 8
    assert resolve_fsdp_size(2, 8) == 2


@pytest.mark.parametrize("size, world, shown", [(3, 4, "4 % 3 = 1"), (8, 4, "4 % 8 = 4"), (0, 2, "world size 2")])
def test_fsdp_size_that_does_not_divide_the_world_size_is_rejected_with_the_numbers(size, world, shown):
    with pytest.raises(VerlError, match=f"fsdp_size={size} does not divide the world size {world}") as err:
        resolve_fsdp_size(size, world)
    assert shown in str(err.value) and "-1" in str(err.value)


def test_an_fsdp_size_larger_than_this_one_process_fails_when_the_actor_is_built(case):
    with pytest.raises(VerlError, match=r"actor_rollout_ref\.actor\.fsdp_config\.fsdp_size=2 does not divide "
                                        r"the world size 1"):
        make_actor(case[0], actor_config(fsdp_size=2))


# ---------------------------------------------------------------------------- state dicts
def test_full_state_dict_of_a_wrapped_model_loads_into_an_unwrapped_one_and_back(case):
    model = case[0]
    wrapped = parallelize(copy.deepcopy(model), actor_config().fsdp_config, device=DEVICE, plain_when_alone=False)
    state = full_state_dict(wrapped)
    assert state.keys() == model.state_dict().keys()  # the unwrapped model's names
    assert not any(isinstance(v, DTensor) for v in state.values())
    assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])  # tied

    with torch.no_grad():
        for p in wrapped.parameters():
            p.add_(1.0)
    plain = copy.deepcopy(model)
    plain.load_state_dict(full_state_dict(wrapped))
    assert max_change(weights(model), weights(plain)) == pytest.approx(1.0)

    fresh = parallelize(copy.deepcopy(model), actor_config().fsdp_config, device=DEVICE, plain_when_alone=False)
    load_full_state_dict(fresh, plain.state_dict())
    assert all(isinstance(p, DTensor) for p in fresh.parameters())
    assert max_change(weights(plain), weights(fresh)) == 0.0


@pytest.mark.parametrize("option,wrap,resume_wrapped", [
    ({}, True, True), (dict(optimizer_offload=True), True, True), (dict(param_offload=True), True, True),
    ({}, False, False), ({}, False, True), ({}, True, False)],
    ids=["defaults", "optimizer_offload", "param_offload", "plain", "plain_then_wrapped", "wrapped_then_plain"])
def test_an_actor_checkpoint_resumes_exactly(case, option, wrap, resume_wrapped, tmp_path):
    # Over one rank the builders leave the model plain: its checkpoints and a wrapped model's are the same files.
    model, batch = case
    straight = make_actor(model, actor_config(**option), wrap)
    straight.update(batch)
    torch.save(straight.state_dict(), tmp_path / "actor.pt")
    saved = torch.load(tmp_path / "actor.pt", weights_only=False)
    assert not any(isinstance(v, DTensor) for s in saved["optimizer"]["state"].values() for v in s.values())

    resumed = make_actor(model, actor_config(**option), resume_wrapped)
    resumed.load_state_dict(saved)
    straight.update(batch)
    resumed.update(batch)

    assert max_change(weights(straight.model), weights(resumed.model)) == 0.0


def test_a_checkpoint_of_an_unwrapped_actor_resumes_a_wrapped_one_exactly(case, monkeypatch, tmp_path):
    model, batch = case
    plain = unwrapped_actor(model, actor_config(), monkeypatch)
    plain.update(batch)
    torch.save(plain.state_dict(), tmp_path / "actor.pt")
    wrapped = make_actor(model, actor_config())
    wrapped.load_state_dict(torch.load(tmp_path / "actor.pt", weights_only=False))
    plain.update(batch)
    wrapped.update(batch)
    for key, value in weights(plain.model).items():
        torch.testing.assert_close(weights(wrapped.model)[key], value, atol=1e-6, rtol=0, msg=key)


def test_a_wrapped_model_exports_a_normal_hugging_face_folder(case, tiny_model_dir, tmp_path):
    model, batch = case
    actor = make_actor(model, actor_config(mixed_precision=dict(param_dtype="bf16")))
    actor.update(batch)

    export_hf(actor.model, load_tokenizer(str(tiny_model_dir)), tmp_path / "hf")

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert type(loaded) is type(model)
    expected = weights(actor.model)
    assert max_change(expected, weights(loaded)) == 0.0
    assert max_change(weights(model), expected) > 1e-4


def test_a_wrapped_model_generates_what_the_unwrapped_model_generates(case):
    model = case[0]
    wrapped = parallelize(copy.deepcopy(model), actor_config().fsdp_config, device=DEVICE, plain_when_alone=False)
    prompt = torch.tensor([[10, 11, 12, 13]], device=DEVICE)
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=PAD)
    with torch.no_grad():
        assert torch.equal(wrapped.generate(input_ids=prompt, **kwargs),
                           copy.deepcopy(model).to(DEVICE).generate(input_ids=prompt, **kwargs))
