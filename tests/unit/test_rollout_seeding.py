"""Sampling seeded per sample: a response depends on its prompt, its seed and the weights only.

This is what lets 1 or N data-parallel ranks (or any generation batch size) draw the same
responses, and so train to the same weights.
"""

import math

import pytest
import torch

from verl.data.collate import collate_prompts
from verl.models.loading import load_causal_lm, load_tokenizer
from verl.models.logprob import compute_response_logprobs
from verl.rollout import HFRollout, SamplingParams, build_rollout
from verl.rollout.seeding import draw, filter_logits, mix, prompt_seeds, sample_seeds, uniforms

PAD, EOS = 0, 2
TEXTS = ["12+34=", "5+6=", "99+1=", "7+70=", "3+3=", "41+8="]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir))
    with torch.no_grad():  # some responses end early, some run to the limit
        model.get_output_embeddings().weight[EOS] *= 40
    return model


def prompts_with_seeds(tokenizer, texts, seeds):
    items = [dict(input_ids=tokenizer(t)["input_ids"], raw_prompt=t, data_source="test", ground_truth="",
                  extra_info={}, index=i) for i, t in enumerate(texts)]
    batch = collate_prompts(items, tokenizer.pad_token_id)
    batch["rollout_seed"] = seeds
    return batch


def test_mix_is_a_deterministic_63_bit_hash_that_separates_inputs():
    a = torch.arange(1000, dtype=torch.int64)
    h = mix(a, 7)
    assert torch.equal(h, mix(a, 7))
    assert (h >= 0).all() and len(set(h.tolist())) == 1000
    assert not torch.equal(h, mix(a, 8))
    # seeds that differ only in their high 32 bits still give different hashes
    assert mix(torch.tensor([1 << 40]), 0) != mix(torch.tensor([2 << 40]), 0)


def test_uniforms_lie_strictly_inside_0_1_and_are_spread_evenly():
    u = uniforms(torch.arange(20000, dtype=torch.int64), step=3)
    assert u.dtype == torch.float64 and (u > 0).all() and (u < 1).all()
    counts = torch.histc(u.float(), bins=10, min=0, max=1)
    assert (counts - 2000).abs().max() < 200  # 10 bins of 2000 expected each


def test_seeds_of_prompts_and_samples():
    seeds = prompt_seeds(1, draw=5, num_prompts=3)
    assert torch.equal(seeds, prompt_seeds(1, 5, 3)) and len(set(seeds.tolist())) == 3
    assert not torch.equal(seeds, prompt_seeds(1, 6, 3)) and not torch.equal(seeds, prompt_seeds(2, 5, 3))
    per_sample = sample_seeds(seeds, 2)
    # interleaved like Batch.repeat: [p0 s0, p0 s1, p1 s0, ...], and a prompt's seeds do not depend on the others
    assert len(per_sample) == 6 and len(set(per_sample.tolist())) == 6
    assert torch.equal(per_sample[2:4], sample_seeds(seeds[1:2], 2))


def test_filter_logits_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    # top-k 2 keeps the two largest
    kept = torch.isfinite(filter_logits(logits, 1.0, 2, 1.0))
    assert kept.tolist() == [[True, True, False, False]]
    # top-p 0.7: 0.5 < 0.7 so the second token is needed, 0.75 >= 0.7 so the third is dropped
    kept = torch.isfinite(filter_logits(logits, 1.0, -1, 0.7))
    assert kept.tolist() == [[True, True, False, False]]
    # top-p 0.5 keeps just the first (the tokens before the second already reach 0.5)
    assert torch.isfinite(filter_logits(logits, 1.0, -1, 0.5)).tolist() == [[True, False, False, False]]
    # temperature 2 halves the logits
    assert torch.allclose(filter_logits(logits, 2.0, -1, 1.0), logits / 2)


def test_draw_follows_the_distribution_and_reports_its_log_probs():
    probs = torch.tensor([0.5, 0.3, 0.2, 0.0])
    logits = torch.log(probs).expand(40000, 4)
    tokens, log_probs = draw(logits, torch.arange(40000, dtype=torch.int64), step=0)
    freq = torch.bincount(tokens, minlength=4).double() / 40000
    assert freq[3] == 0  # probability 0 is never drawn
    assert torch.allclose(freq, probs.double(), atol=0.01)
    assert torch.allclose(log_probs, torch.log(probs)[tokens])
    # the draw of a row depends on its seed and the step only
    again, _ = draw(logits[:7], torch.arange(7, dtype=torch.int64), step=0)
    assert torch.equal(again, tokens[:7])
    other_step, _ = draw(logits, torch.arange(40000, dtype=torch.int64), step=1)
    assert not torch.equal(other_step, tokens)


@pytest.mark.parametrize("params", [SamplingParams(max_new_tokens=6, n=2, logprobs=True),
                                    SamplingParams(max_new_tokens=6, n=3, temperature=0.7, top_k=20, top_p=0.9,
                                                   logprobs=True)])
def test_a_response_does_not_depend_on_the_rest_of_the_batch(model, tokenizer, params):
    seeds = prompt_seeds(4, draw=0, num_prompts=len(TEXTS))
    whole = HFRollout(model, tokenizer).generate(prompts_with_seeds(tokenizer, TEXTS, seeds), params)
    # The same prompts in two halves (as two data-parallel ranks hold them), and in chunks of 4 rows.
    halves = [HFRollout(model, tokenizer).generate(prompts_with_seeds(tokenizer, TEXTS[i:i + 3], seeds[i:i + 3]),
                                                   params) for i in (0, 3)]
    chunked = HFRollout(model, tokenizer, generation_batch_size=4).generate(
        prompts_with_seeds(tokenizer, TEXTS, seeds), params)
    split = torch.cat([h["responses"] for h in halves])
    assert torch.equal(split, whole["responses"])
    assert torch.equal(chunked["responses"], whole["responses"])
    assert torch.allclose(torch.cat([h["rollout_log_probs"] for h in halves]), whole["rollout_log_probs"], atol=1e-5)
    lengths = whole["response_mask"].sum(-1)
    assert lengths.min() < 6 and len(set(whole["responses"].tolist()[0::params.n][0])) > 1  # not degenerate
    # the samples of one prompt differ from each other
    assert not torch.equal(whole["responses"][0], whole["responses"][1])


def test_sampled_log_probs_equal_the_models_recomputation(model, tokenizer):
    params = SamplingParams(max_new_tokens=6, n=2, temperature=0.8, logprobs=True)
    out = HFRollout(model, tokenizer).generate(prompts_with_seeds(tokenizer, TEXTS, prompt_seeds(1, 0, 6)), params)
    recomputed, _ = compute_response_logprobs(model, out["input_ids"], out["attention_mask"], out["position_ids"],
                                              out["responses"], temperature=0.8)
    mask = out["response_mask"].bool()
    assert torch.allclose(out["rollout_log_probs"][mask], recomputed[mask], atol=1e-4)


def test_prompts_without_seeds_draw_from_the_engines_own_generator(model, tokenizer):
    items = [dict(input_ids=tokenizer(t)["input_ids"], raw_prompt=t, data_source="test", ground_truth="",
                  extra_info={}, index=i) for i, t in enumerate(TEXTS)]
    prompts = collate_prompts(items, tokenizer.pad_token_id)
    params = SamplingParams(max_new_tokens=5, n=2)
    first = build_rollout("hf", model, tokenizer, seed=9).generate(prompts, params)["responses"]
    assert torch.equal(first, build_rollout("hf", model, tokenizer, seed=9).generate(prompts, params)["responses"])
    assert not torch.equal(first, build_rollout("hf", model, tokenizer, seed=10).generate(prompts, params)["responses"])


def test_the_dummy_engine_is_seeded_per_row_too(model, tokenizer):
    seeds = prompt_seeds(2, 0, len(TEXTS))
    engine = build_rollout("dummy", model, tokenizer)
    params = SamplingParams(max_new_tokens=5, n=2)
    whole = engine.generate(prompts_with_seeds(tokenizer, TEXTS, seeds), params)["responses"]
    tail = engine.generate(prompts_with_seeds(tokenizer, TEXTS[2:], seeds[2:]), params)["responses"]
    assert torch.equal(whole[4:], tail)
    assert math.isclose(float((whole[:, :-1] != whole[0, :-1]).float().mean()), 1.0, abs_tol=0.1)
