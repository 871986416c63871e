"""A vision-language model through the RL path's own parts (issue 27): prompts with images from the dataset,
the hf engine samples with them, and the actor's (and reference's) log-probs of those samples, computed in
micro-batches that cut the rows' images apart, equal the engine's; the loss reaches the vision tower."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from verl.data import RLDataset, collate_prompts, write_parquet
from verl.models.logprob import compute_response_logprobs
from verl.models.tiny_vision import VL_ARCHITECTURES, make_tiny_vl_model_folder
from verl.models.vision import load_processor, media_of
from verl.rollout import HFRollout, SamplingParams
from verl.rollout.dummy import DummyRollout
from verl.rollout.native import NativeRollout
from verl.workers.actor import PolicyModel


def _png(width, height, seed):
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray((rng.random((height, width, 3)) * 255).astype("uint8")).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module", params=VL_ARCHITECTURES)
def vl(request, tmp_path_factory):
    from transformers import AutoModelForImageTextToText

    folder = tmp_path_factory.mktemp("vl")
    path = make_tiny_vl_model_folder(folder / "model", arch=request.param)
    processor = load_processor(str(path))
    rows = [{"prompt": [{"role": "user", "content": f"<image>how many? {i}"}],
             "images": [{"bytes": _png(56 * (1 + i % 2), 56, i)}], "data_source": "dots",
             "reward_model": {"ground_truth": str(i)}} for i in range(3)]
    rows.append({"prompt": [{"role": "user", "content": "no image here"}], "data_source": "dots",
                 "reward_model": {"ground_truth": "0"}})
    write_parquet(rows, folder / "train.parquet")
    data = RLDataset(str(folder / "train.parquet"), processor.tokenizer, processor=processor, max_prompt_length=64)
    prompts = collate_prompts([data[i] for i in range(len(data))], processor.tokenizer.pad_token_id)
    prompts["rollout_seed"] = torch.arange(len(data), dtype=torch.int64) + 11
    return AutoModelForImageTextToText.from_pretrained(path).eval(), processor, prompts


PARAMS = SamplingParams(max_new_tokens=8, n=2, temperature=1.0, logprobs=True)


ENGINES = {"hf": HFRollout, "native": NativeRollout}


@pytest.mark.parametrize("engine", ENGINES)
def test_the_engines_sample_with_the_images_and_the_actors_log_probs_equal_theirs(vl, engine):
    model, processor, prompts = vl
    out = ENGINES[engine](model, processor.tokenizer).generate(prompts, PARAMS)
    media = media_of(out)
    assert len(media) == 8 and [m is None for m in media] == [False] * 6 + [True] * 2  # repeated with the rows
    mask = out["response_mask"].bool()
    for micro, packed in ((1, False), (3, False), (None, False), (3, True), (None, True)):
        # micro-batches cut the rows (and their images) apart; packed rows (use_remove_padding) run as one
        policy = PolicyModel(model, torch.device("cpu"), micro, remove_padding=packed)
        log_prob, _ = policy.compute_log_prob(out)
        torch.testing.assert_close(log_prob[mask], out["rollout_log_probs"][mask], atol=1e-4, rtol=0)
    # the images are read: the same samples with another image (of the same size) get other log-probs
    swapped = out.index(list(range(8)))
    swapped["multi_modal_inputs"] = [media[4], media[5], *media[2:4], media[0], media[1], *media[6:]]
    other, _ = PolicyModel(model, torch.device("cpu")).compute_log_prob(swapped)
    assert (other[:2] - log_prob[:2])[mask[:2]].abs().max() > 1e-4


def test_packed_rows_with_images_equal_the_padded_ones_and_need_the_text_positions(vl):
    from verl.models.logprob import Packing, check_packing
    from verl.models.vision import packed_forward_inputs

    model, processor, prompts = vl
    out = HFRollout(model, processor.tokenizer).generate(prompts, PARAMS)
    check_packing(model, torch.device("cpu"), "actor_rollout_ref.model.use_remove_padding")  # keeps them apart
    args = (out["input_ids"], out["attention_mask"], out["position_ids"], out["responses"])
    mask = out["response_mask"].bool()
    padded, padded_entropy = compute_response_logprobs(model, *args, media=media_of(out), with_entropy=True)
    packed, packed_entropy = compute_response_logprobs(model, *args, media=media_of(out), with_entropy=True,
                                                       remove_padding=True)
    torch.testing.assert_close(packed[mask], padded[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed_entropy[mask], padded_entropy[mask], atol=1e-5, rtol=0)
    assert (packed[~mask] == 0).all()
    # Without the leading row of text positions the model builds no per-sequence mask: rows leak.
    packing = Packing(*args[:3], out["responses"].shape[1])
    inputs = packed_forward_inputs(media_of(out), *args[:2], packing.position_ids, model)
    assert inputs["position_ids"].shape == (4, 1, int(out["attention_mask"].sum()))
    inputs["position_ids"] = inputs["position_ids"][1:]
    with torch.no_grad():
        leaky = model(input_ids=packing.input_ids, use_cache=False, **inputs).logits
    leaky = torch.log_softmax(packing.responses(leaky).float(), -1).gather(
        -1, out["responses"][packing.response_valid][:, None]).squeeze(-1)
    assert (leaky - padded[mask]).abs().max() > 1e-3


def test_native_draws_what_hf_draws_from_the_same_seeds_images_included(vl):
    model, processor, prompts = vl
    hf = HFRollout(model, processor.tokenizer).generate(prompts, PARAMS)
    native = NativeRollout(model, processor.tokenizer).generate(prompts, PARAMS)
    assert torch.equal(native["responses"], hf["responses"])
    torch.testing.assert_close(native["rollout_log_probs"], hf["rollout_log_probs"], atol=1e-5, rtol=0)
    # max_num_seqs with images: waves of rows, each with its own pictures (the same samples)
    waves = NativeRollout(model, processor.tokenizer, max_num_seqs=1).generate(prompts, PARAMS)
    assert torch.equal(waves["responses"], hf["responses"])
    torch.testing.assert_close(waves["rollout_log_probs"], hf["rollout_log_probs"], atol=1e-5, rtol=0)


def test_the_policy_gradient_reaches_the_vision_tower_and_text_engines_refuse_images(vl):
    model, processor, prompts = vl
    out = HFRollout(model, processor.tokenizer).generate(prompts, PARAMS)
    model.zero_grad()
    log_prob, _ = compute_response_logprobs(model, out["input_ids"], out["attention_mask"], out["position_ids"],
                                            out["responses"], media=media_of(out))
    (-(log_prob * out["response_mask"]).sum()).backward()
    vision_grads = [p.grad for n, p in model.named_parameters() if "visual" in n]
    assert vision_grads and all(g is not None for g in vision_grads)
    assert max(g.abs().max().item() for g in vision_grads) > 0
    model.zero_grad()
    dummy = DummyRollout(len(processor.tokenizer), processor.tokenizer.eos_token_id, processor.tokenizer.pad_token_id)
    with pytest.raises(ValueError, match="the dummy rollout engine generates from text only .*rollout.name=hf"):
        dummy.generate(prompts, PARAMS)


def test_the_critic_reads_the_images_and_its_values_do_not_depend_on_the_batch(vl):
    import copy

    from verl.models.value_model import ValueModel

    model, processor, prompts = vl
    out = HFRollout(model, processor.tokenizer).generate(prompts, PARAMS)
    critic = ValueModel(copy.deepcopy(model)).eval()
    torch.manual_seed(0)
    torch.nn.init.normal_(critic.model.get_output_embeddings().weight)  # a trained head, not the zero start
    media = media_of(out)
    inputs = (out["input_ids"], out["attention_mask"], out["position_ids"], out["responses"].shape[1])
    with torch.no_grad():
        values = critic.response_values(*inputs, media=media)
        alone = critic.response_values(*(x[2:3] if torch.is_tensor(x) else x for x in inputs), media=media[2:3])
        swapped = critic.response_values(*inputs, media=[media[4], media[5], *media[2:4], media[0], media[1],
                                                         *media[6:]])
        packed = critic.response_values(*inputs, media=media, remove_padding=True)
    torch.testing.assert_close(alone[0], values[2], atol=1e-5, rtol=0)
    valid = out["response_mask"].bool()  # the packed values: the padded ones at real tokens, 0 elsewhere
    torch.testing.assert_close(packed[valid], values[valid], atol=1e-5, rtol=0)
    critic.check_packing(torch.device("cpu"), "critic.model.use_remove_padding")
    assert (swapped[:2] - values[:2]).abs().max() > 1e-4


@pytest.mark.parametrize("engine", ENGINES)
def test_partial_rollouts_prefill_the_unfinished_rows_again_with_their_images(vl, engine):
    """Asynchronous RL's partial rollouts (verl.rollout.partial): at a swap every row stops; the unfinished
    ones go on from their prompt, images included, and the tokens drawn so far."""
    import copy

    from test_partial_rollout import ScriptedSwap, perturbed

    model, processor, prompts = vl
    params = PARAMS
    whole = ENGINES[engine](model, processor.tokenizer).generate(prompts, params)
    going = (whole["response_mask"].sum(1) > 3).long()  # the rows a swap after 3 tokens finds unfinished
    assert going.sum() >= 4
    same = copy.deepcopy(model)
    swap = ScriptedSwap(same, same.state_dict(), after=3)
    parts = ENGINES[engine](same, processor.tokenizer).generate(prompts, params, swap=swap)
    assert swap.applied == 1 and torch.equal(parts["policy_version_last"], going)
    assert torch.equal(parts["responses"], whole["responses"])  # a swap to the same weights changes nothing
    torch.testing.assert_close(parts["rollout_log_probs"], whole["rollout_log_probs"], atol=1e-4, rtol=0)
    # New weights after 3 tokens: the later tokens' log-probs are the new policy's, with the images read.
    new = copy.deepcopy(model)
    new.load_state_dict(perturbed(model))
    moved = copy.deepcopy(model)
    out = ENGINES[engine](moved, processor.tokenizer).generate(prompts, params,
                                                              swap=ScriptedSwap(moved, new.state_dict(), after=3))
    assert torch.equal(out["responses"][:, :3], whole["responses"][:, :3])
    after = out["response_mask"].bool().clone()
    after[:, :3] = False
    new_lp, _ = PolicyModel(new.eval(), torch.device("cpu")).compute_log_prob(out)
    old_lp, _ = PolicyModel(model, torch.device("cpu")).compute_log_prob(out)
    torch.testing.assert_close(out["rollout_log_probs"][after], new_lp[after], atol=1e-4, rtol=0)
    assert (new_lp - old_lp)[after].abs().max() > 1e-2
