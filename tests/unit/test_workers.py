"""verl.workers: the actor/rollout/reference worker on the tiny model, and the actor's micro-batching."""

import copy

import pytest
import torch

from verl.algorithms.utils import AGG_MODES
from verl.config import TrainerConfig
from verl.distributed.fsdp import full_state_dict, parallelize
from verl.data.collate import collate_prompts
from verl.models.loading import load_causal_lm
from verl.models.logprob import compute_response_logprobs
from verl.protocol import Batch
from verl.rollout import HFRollout, SamplingParams, assemble_rollout
from verl.workers.actor import Actor
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

PAD, EOS = 0, 2
RESPONSE_LENGTH = 4


def worker_config(tiny_model_dir, **arr):
    """2 responses per prompt, 4-token responses; one mini-batch of 2 prompts (4 samples)."""
    cfg = TrainerConfig(
        data=dict(max_response_length=RESPONSE_LENGTH),
        actor_rollout_ref=dict(model=dict(path=str(tiny_model_dir)), rollout=dict(n=2),
                               actor=dict(ppo_mini_batch_size=2, optim=dict(lr=1e-3))),
    )
    cfg.actor_rollout_ref.update(arr)
    return cfg.actor_rollout_ref


def prompt_batch(tokenizer, texts=("12+34=", "5+6=")):
    items = [dict(input_ids=tokenizer(t)["input_ids"], raw_prompt=t, data_source="test", ground_truth="0",
                  extra_info={}, index=i) for i, t in enumerate(texts)]
    return collate_prompts(items, tokenizer.pad_token_id)


def snapshot(model):
    return {k: v.detach().clone() for k, v in full_state_dict(model).items()}


def max_diff(model, state):
    return max((v - state[k]).abs().max().item() for k, v in full_state_dict(model).items())


def rollout_step(worker):
    """generate -> old log-probs -> ref log-probs, with +1/-1 advantages on the two prompts' samples."""
    torch.manual_seed(0)
    gen = worker.generate_sequences(prompt_batch(worker.tokenizer))
    batch = gen.union(worker.compute_log_prob(gen)).union(worker.compute_ref_log_prob(gen))
    batch["advantages"] = torch.tensor([1.0, 1.0, -1.0, -1.0])[:, None] * gen["response_mask"]
    return batch


def test_worker_pipeline_shapes_and_old_log_probs_equal_ref_before_any_update(tiny_model_dir):
    worker = ActorRolloutRefWorker(worker_config(tiny_model_dir))
    prompts = prompt_batch(worker.tokenizer)
    torch.manual_seed(0)
    gen = worker.generate_sequences(prompts)
    old = worker.compute_log_prob(gen)
    ref = worker.compute_ref_log_prob(gen)

    P = prompts["input_ids"].shape[1]
    assert len(gen) == 4
    assert gen["responses"].shape == gen["response_mask"].shape == (4, RESPONSE_LENGTH)
    assert gen["input_ids"].shape == gen["attention_mask"].shape == gen["position_ids"].shape == (4, P + 4)
    assert old["old_log_probs"].shape == old["entropys"].shape == ref["ref_log_prob"].shape == (4, 4)
    assert (old["old_log_probs"] <= 0).all() and (old["entropys"] >= 0).all()
    assert torch.equal(old["old_log_probs"], ref["ref_log_prob"])


def test_update_actor_changes_the_actor_but_not_the_reference_and_the_hybrid_rollout_decodes_with_it(tiny_model_dir):
    worker = ActorRolloutRefWorker(worker_config(tiny_model_dir))
    # The hybrid rollout's model is an empty twin: it gets the actor's gathered weights per rollout.
    assert all(p.is_meta for p in worker.rollout.model.parameters())
    batch = rollout_step(worker)
    initial = snapshot(worker.actor_model)

    metrics = worker.update_actor(batch)

    assert max_diff(worker.actor_model, initial) > 1e-4
    assert max_diff(worker.ref_model, initial) == 0.0
    assert metrics["actor/grad_norm"] > 0
    after = worker.compute_log_prob(batch)["old_log_probs"]
    assert not torch.equal(after, worker.compute_ref_log_prob(batch)["ref_log_prob"])
    # The next rollout samples from the updated weights: the same draws as a plain copy of them.
    plain = load_causal_lm(str(tiny_model_dir))
    plain.load_state_dict(full_state_dict(worker.actor_model))
    prompts = prompt_batch(worker.tokenizer)
    prompts = Batch(dict(prompts.tensors, rollout_seed=torch.tensor([3, 4])), prompts.non_tensors)
    params = SamplingParams(max_new_tokens=6, n=2)
    ours = worker.generate_sequences(prompts, params)
    theirs = HFRollout(plain, worker.tokenizer).generate(prompts, params)
    assert torch.equal(ours["responses"], theirs["responses"])
    assert all(p.is_meta for p in worker.rollout.model.parameters())  # emptied again after the rollout


def test_without_hybrid_engine_the_rollout_copy_is_synced_to_the_actor_after_update(tiny_model_dir):
    worker = ActorRolloutRefWorker(worker_config(tiny_model_dir, hybrid_engine=False))
    assert worker.rollout.model is not worker.actor_model
    batch = rollout_step(worker)
    initial = snapshot(worker.actor_model)

    worker.update_actor(batch)

    assert max_diff(worker.actor_model, initial) > 1e-4
    assert max_diff(worker.rollout.model, snapshot(worker.actor_model)) == 0.0
    assert not any(p.requires_grad for p in worker.rollout.model.parameters())


def test_the_trainer_of_a_run_whose_rollout_validates_holds_no_engine_and_still_trains(tiny_model_dir):
    from verl.trainer.ppo.roles import trainer_generates

    # async_training.use_trainer_do_validate=false (verl's fully-async default): every sample comes from the rollout
    cfg = TrainerConfig(async_training=dict(enable=True, use_trainer_do_validate=False))
    assert not trainer_generates(cfg)
    assert trainer_generates(TrainerConfig(async_training=dict(enable=True)))
    assert trainer_generates(TrainerConfig(async_training=dict(use_trainer_do_validate=False)))  # a synchronous run
    # vllm too: no second engine is built (vLLM is not even imported here)
    worker = ActorRolloutRefWorker(worker_config(tiny_model_dir, hybrid_engine=False, rollout=dict(name="vllm", n=2)),
                                   generates=False)
    assert worker.rollout.name == "none" and worker.agent_loop is None and not worker.rollout_holds_copy
    generating = ActorRolloutRefWorker(worker_config(tiny_model_dir))
    assert worker.rollout.eos_token_ids == generating.rollout.eos_token_ids  # DAPO's overlong filter reads them
    batch = rollout_step(generating)  # samples from elsewhere train as ever
    initial = snapshot(worker.actor_model)
    worker.update_actor(batch)
    assert max_diff(worker.actor_model, initial) > 1e-4
    with pytest.raises(RuntimeError, match="holds no rollout engine"):
        worker.generate_sequences(prompt_batch(worker.tokenizer))


def micro_batch_case(tiny_model_dir):
    """A 4-sample batch whose responses stop at different lengths (4, 4, 1, 2 tokens), old log-probs from
    the model itself and random advantages: micro-batches of 2 hold 8 and 3 tokens."""
    torch.manual_seed(0)
    model = load_causal_lm(str(tiny_model_dir))
    prompts = collate_prompts([dict(input_ids=ids, raw_prompt="", data_source="t", ground_truth="", extra_info={},
                                    index=i) for i, ids in enumerate([[10, 11, 12], [20, 21], [30], [40, 41, 42]])],
                              PAD)
    responses = torch.tensor([[50, 51, 52, 53], [60, 61, 62, 63], [EOS, 0, 0, 0], [70, EOS, 0, 0]])
    batch = assemble_rollout(prompts, responses, RESPONSE_LENGTH, [EOS], PAD)
    assert batch["response_mask"].sum(1).tolist() == [4, 4, 1, 2]
    with torch.no_grad():
        old, _ = compute_response_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                           batch["responses"])
    batch["old_log_probs"] = old + 0.05 * torch.randn_like(old)  # off-policy a little: ratios != 1
    batch["advantages"] = torch.randn(4, RESPONSE_LENGTH) * batch["response_mask"]
    return model, batch


@pytest.mark.parametrize("loss_agg_mode", AGG_MODES)
def test_micro_batches_of_two_give_the_same_update_as_the_whole_mini_batch(tiny_model_dir, loss_agg_mode):
    model, batch = micro_batch_case(tiny_model_dir)
    # eps=1 makes Adam's first step close to lr * grad (instead of lr * sign(grad)), and no clipping: so
    # equal weights mean equal gradients, including their scale.
    cfg = TrainerConfig(actor_rollout_ref=dict(actor=dict(
        loss_agg_mode=loss_agg_mode, ppo_epochs=1, shuffle=False, grad_clip=1e9,
        optim=dict(lr=1.0, eps=1.0, weight_decay=0.0)))).actor_rollout_ref.actor
    updated = {}
    for micro in (None, 2):
        actor = Actor(parallelize(copy.deepcopy(model), cfg.fsdp_config, device="cpu"), cfg, torch.device("cpu"),
                      samples_per_mini_batch=4, total_steps=1)
        actor.update(batch, micro_batch_size=micro)
        updated[micro] = snapshot(actor.model)

    initial = snapshot(model)
    assert max((updated[None][k] - initial[k]).abs().max().item() for k in initial) > 1e-4
    for key in initial:
        torch.testing.assert_close(updated[2][key], updated[None][key], atol=1e-6, rtol=0, msg=key)


def test_generating_past_the_model_context_is_an_error_naming_both_lengths(tiny_model_dir):
    worker = ActorRolloutRefWorker(worker_config(tiny_model_dir), max_response_length=16)
    limit = worker.actor_model.config.max_position_embeddings
    too_long = prompt_batch(worker.tokenizer, texts=("1" * (limit - 8),))
    with pytest.raises(ValueError) as err:
        worker.generate_sequences(too_long)
    message = str(err.value)
    assert str(limit - 8) in message and "16" in message and str(limit) in message
    assert "data.truncation" in message


def test_prompts_padded_on_the_right_or_without_their_mask_are_refused_before_decoding(tiny_model_dir):
    from verl.errors import VerlError

    worker = ActorRolloutRefWorker(worker_config(tiny_model_dir, rollout=dict(name="hf", n=1)))
    tokenizer = copy.deepcopy(worker.tokenizer)
    tokenizer.padding_side = "right"  # AutoTokenizer's default for many models
    right = Batch(dict(tokenizer(["1+1=", "12+13+14="], return_tensors="pt", padding=True)))
    with pytest.raises(VerlError, match="row 0 is padded on the right.*padding_side = 'left'"):
        worker.generate_sequences(right)
    with pytest.raises(VerlError, match=r"lack \['attention_mask'\]"):
        worker.generate_sequences(Batch({"input_ids": right["input_ids"]}))
    tokenizer.padding_side = "left"
    left = Batch(dict(tokenizer(["1+1=", "12+13+14="], return_tensors="pt", padding=True)))
    assert worker.generate_sequences(left)["responses"].shape == (2, RESPONSE_LENGTH)


@pytest.mark.parametrize("engine", ["hf", "native"])
def test_a_batch_of_no_prompts_gives_no_samples_on_either_engine(tiny_model_dir, engine):
    """Before: the hf engine failed with "max() arg is an empty sequence" where the native one gave empty columns."""
    worker = ActorRolloutRefWorker(worker_config(tiny_model_dir, rollout=dict(name=engine, n=2,
                                                                              calculate_log_probs=True)), with_ref=False)
    empty = Batch({"input_ids": torch.zeros(0, 5, dtype=torch.long), "attention_mask": torch.zeros(0, 5, dtype=torch.long)})
    out = worker.generate_sequences(empty)
    assert out["responses"].shape == (0, RESPONSE_LENGTH) and out["input_ids"].shape == (0, 5 + RESPONSE_LENGTH)
    assert out["response_mask"].shape == (0, RESPONSE_LENGTH)


@pytest.mark.parametrize("arch,engine", [("qwen2", "NativeRollout"), ("llama", "NativeRollout"),
                                         ("phi3", "NativeRollout"), ("opt", "HFRollout")])
def test_rollout_name_auto_runs_native_for_the_families_its_decoder_covers_and_hf_for_others(tmp_path, arch, engine):
    from verl.models.tiny import make_tiny_model_folder
    from verl.rollout import auto_engine

    folder = make_tiny_model_folder(tmp_path / arch, arch=arch, num_layers=1, hidden_size=32, intermediate_size=64)
    config = worker_config(folder)
    assert config.rollout.name == "auto"  # the default
    worker = ActorRolloutRefWorker(config, with_ref=False)
    assert type(worker.rollout).__name__ == engine
    assert worker.rollout_shares_actor  # either way the hybrid engine decodes with the actor's weights
    picked, why = auto_engine(arch)
    assert picked == {"NativeRollout": "native", "HFRollout": "hf"}[engine] and arch in why
    out = worker.generate_sequences(prompt_batch(worker.tokenizer))
    assert out["responses"].shape == (4, RESPONSE_LENGTH)


def test_rollout_name_auto_is_resolved_once_at_start_and_said(tiny_model_dir, capsys):
    from verl.trainer.ppo.roles import resolve_rollout_engine

    cfg = TrainerConfig(actor_rollout_ref=dict(model=dict(path=str(tiny_model_dir))))
    assert resolve_rollout_engine(cfg) == "native" and cfg.actor_rollout_ref.rollout.name == "native"
    assert capsys.readouterr().out == ("Rollout engine: native (actor_rollout_ref.rollout.name=auto: the fastest engine "
                                       "for qwen2 models: same samples as hf, lean decoder; name hf, native or vllm "
                                       "to choose)\n")
    assert resolve_rollout_engine(cfg) == "native" and capsys.readouterr().out == ""  # resolved: nothing more said
    named = TrainerConfig(actor_rollout_ref=dict(model=dict(path=str(tiny_model_dir)), rollout=dict(name="hf")))
    assert resolve_rollout_engine(named) == "hf" and capsys.readouterr().out == ""  # a named engine is kept


@pytest.mark.parametrize("name", ["auto", "hf", "native", "vllm"])
def test_a_tensor_parallel_rollout_size_warns_once_where_the_engine_holds_the_whole_model(tiny_model_dir, caplog,
                                                                                         name):
    # verl's rollout.tensor_model_parallel_size splits a vLLM engine's model; hf and native hold it whole.
    from verl.trainer.ppo.roles import resolve_rollout_engine

    for size in (1, 2):
        cfg = TrainerConfig(actor_rollout_ref=dict(model=dict(path=str(tiny_model_dir)),
                                                   rollout=dict(name=name, tensor_model_parallel_size=size)))
        caplog.clear()
        with caplog.at_level("WARNING", logger="verl.trainer.ppo.roles"):
            engine = resolve_rollout_engine(cfg)
        said = [r.getMessage() for r in caplog.records]
        if size == 1 or engine == "vllm":
            assert said == []
        else:
            assert said == [f"actor_rollout_ref.rollout.tensor_model_parallel_size=2 has no effect with the {engine} "
                            f"engine: it splits a vLLM engine's model over that many GPUs, and {engine} holds the "
                            f"whole model on every rank. Set actor_rollout_ref.rollout.name=vllm to split it, or the "
                            f"size to 1"]


def test_the_worker_takes_its_section_the_whole_config_or_a_mapping_of_its_keys_and_names_a_wrong_one(tiny_model_dir):
    from omegaconf import OmegaConf

    from verl.errors import ConfigError

    section = worker_config(tiny_model_dir)
    whole = section._root()  # a newcomer passes the TrainerConfig itself: its section, still in its tree
    assert ActorRolloutRefWorker(config=whole).config is whole.actor_rollout_ref
    assert ActorRolloutRefWorker(config=whole).max_response_length == RESPONSE_LENGTH  # data.max_response_length
    keys = {"model": {"path": str(tiny_model_dir)}, "rollout": {"n": 2, "response_length": RESPONSE_LENGTH}}
    for given in (keys, OmegaConf.create(keys)):  # verl's workers take OmegaConf sections
        worker = ActorRolloutRefWorker(config=given)
        assert worker.config.rollout.n == 2 and worker.max_response_length == RESPONSE_LENGTH
    with pytest.raises(ConfigError, match=r"unknown config key 'rollout.temprature'; did you mean rollout.temperature"):
        ActorRolloutRefWorker(config={"rollout": {"temprature": 0.5}})
    with pytest.raises(ConfigError, match=r"^ActorRolloutRefWorker\(config=...\) takes the actor_rollout_ref section, "
                                          r"got the actor_rollout_ref.actor section; pass config=cfg.actor_rollout_ref"):
        ActorRolloutRefWorker(config=section.actor)
    with pytest.raises(ConfigError, match=r"got a str; pass config=cfg.actor_rollout_ref"):
        ActorRolloutRefWorker(config=str(tiny_model_dir))
