"""verl.rollout.native: the KV-cache engine draws what the hf engine draws, reports the actor's log-probs,
shares the prefill of a prompt's samples and lets finished rows leave the batch.

Engines: ``fast`` (Qwen2, Llama, Phi-3 decode through verl.rollout.fast_decoder; OPT falls back to its
forward) and the model's own forward with either cache kind. The tests that count forward calls
put a hook on the model, which sends the engine down the forward path (tests/unit/test_fast_decoder.py
checks the same for the fast path)."""

import dataclasses

import pytest
import torch

from verl.data.collate import collate_prompts
from verl.models.loading import load_causal_lm, load_tokenizer
from verl.models.logprob import compute_response_logprobs
from verl.models.tiny import ARCHITECTURES, make_tiny_model_folder
from verl.rollout import ROLLOUT_NAMES, HFRollout, SamplingParams, build_rollout
from verl.rollout.native import CACHE_KINDS, NativeRollout

# NativeRollout settings: the fast decoder where the model allows it, the model's forward with each cache.
ENGINES = [dict(fast=True)] + [dict(fast=False, cache=kind) for kind in CACHE_KINDS]
ENGINE_IDS = ["fast"] + [f"forward-{kind}" for kind in CACHE_KINDS]

EOS = 2
# Different lengths, so every batch is left-padded.
TEXTS = ["12+34=", "5+6=", "a longer prompt: 99+1=", "7+70=", "x"]
MAX_NEW = 10


def eos_prone(model):
    """A random model almost never emits EOS; scaled up, some rows stop early and some run to the limit."""
    with torch.no_grad():
        model.get_output_embeddings().weight[EOS] *= 40
    return model.eval()


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch_model(request, tmp_path_factory):
    path = make_tiny_model_folder(tmp_path_factory.mktemp(f"tiny-{request.param}"), arch=request.param,
                                  num_layers=2, hidden_size=64, intermediate_size=128)
    return eos_prone(load_causal_lm(str(path))), load_tokenizer(str(path))


@pytest.fixture(scope="module")
def qwen2(tiny_model_dir):
    return eos_prone(load_causal_lm(str(tiny_model_dir))), load_tokenizer(str(tiny_model_dir))


def make_prompts(tokenizer, texts=TEXTS):
    items = [dict(input_ids=tokenizer(t)["input_ids"], raw_prompt=t, data_source="test", ground_truth="0",
                  extra_info={}, index=i) for i, t in enumerate(texts)]
    prompts = collate_prompts(items, tokenizer.pad_token_id)
    prompts["rollout_seed"] = torch.arange(len(texts), dtype=torch.int64) * 1000 + 17
    return prompts


def assert_lengths_differ(out):
    lengths = out["response_mask"].sum(1)
    assert lengths.min() < lengths.max(), "want rows that stop while others go on"


GREEDY = SamplingParams(max_new_tokens=MAX_NEW, n=2, do_sample=False, logprobs=True)
SAMPLED = [SamplingParams(max_new_tokens=MAX_NEW, n=3, temperature=1.0, logprobs=True),
           SamplingParams(max_new_tokens=MAX_NEW, n=3, temperature=0.7, top_k=20, logprobs=True),
           SamplingParams(max_new_tokens=MAX_NEW, n=3, temperature=1.3, top_k=50, top_p=0.8, logprobs=True)]


# --------------------------------------------------------------------------- parity with the hf engine

@pytest.mark.parametrize("engine", ENGINES, ids=ENGINE_IDS)
def test_greedy_responses_equal_hf_token_for_token_on_every_architecture(arch_model, engine):
    model, tokenizer = arch_model
    prompts = make_prompts(tokenizer)
    hf = HFRollout(model, tokenizer).generate(prompts, GREEDY)
    rollout = NativeRollout(model, tokenizer, **engine)
    native = rollout.generate(prompts, GREEDY)
    assert rollout.last_path == ("fast" if engine["fast"] and model.config.model_type != "opt" else "hf")
    assert_lengths_differ(hf)
    assert torch.equal(native["responses"], hf["responses"])
    assert torch.equal(native["attention_mask"], hf["attention_mask"])
    torch.testing.assert_close(native["rollout_log_probs"], hf["rollout_log_probs"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("params", SAMPLED, ids=["t1", "t0.7-k20", "t1.3-k50-p0.8"])
def test_sampled_responses_and_log_probs_equal_hf_for_the_same_seeds(arch_model, params):
    model, tokenizer = arch_model
    prompts = make_prompts(tokenizer)
    hf = HFRollout(model, tokenizer).generate(prompts, params)
    native = NativeRollout(model, tokenizer).generate(prompts, params)
    assert torch.equal(native["responses"], hf["responses"])
    torch.testing.assert_close(native["rollout_log_probs"], hf["rollout_log_probs"], atol=1e-5, rtol=0)
    # The samples of one prompt differ: each row draws with its own seed.
    assert not torch.equal(native["responses"][0], native["responses"][1]) or \
        not torch.equal(native["responses"][1], native["responses"][2])


def test_raw_output_stops_where_hf_stops(qwen2):
    """Width: the longest response when every row stops early, ``max_new_tokens`` otherwise; pad after EOS."""
    model, tokenizer = qwen2
    prompts = make_prompts(tokenizer)
    seeds = torch.arange(len(prompts)) + 5
    for max_new in (1, 3, MAX_NEW, 40):
        params = SamplingParams(max_new_tokens=max_new, temperature=0.9, logprobs=True)
        hf, _ = HFRollout(model, tokenizer).generate_responses(prompts["input_ids"], prompts["attention_mask"],
                                                               params, seeds)
        native, log_probs = NativeRollout(model, tokenizer).generate_responses(
            prompts["input_ids"], prompts["attention_mask"], params, seeds)
        assert native.shape[1] <= max_new and log_probs.shape == native.shape
        assert torch.equal(native, hf), max_new


# --------------------------------------------------------------------------- log-probs vs the actor

@pytest.mark.parametrize("params", [GREEDY, SAMPLED[0], dataclasses.replace(SAMPLED[0], temperature=0.7)],
                         ids=["greedy", "t1", "t0.7"])
def test_log_probs_equal_the_actors_recomputation(arch_model, params):
    model, tokenizer = arch_model
    out = NativeRollout(model, tokenizer).generate(make_prompts(tokenizer), params)
    with torch.no_grad():
        actor, _ = compute_response_logprobs(model, out["input_ids"], out["attention_mask"], out["position_ids"],
                                             out["responses"], temperature=out.meta["temperature"])
    mask = out["response_mask"].bool()
    torch.testing.assert_close(out["rollout_log_probs"][mask], actor[mask], atol=1e-4, rtol=0)
    assert (out["rollout_log_probs"][~mask] == 0).all()


# --------------------------------------------------------------------------- batch independence, prefill sharing

@pytest.mark.parametrize("settings", ENGINES, ids=ENGINE_IDS)
def test_a_response_does_not_depend_on_the_rest_of_the_batch(qwen2, settings):
    model, tokenizer = qwen2
    engine = NativeRollout(model, tokenizer, **settings)
    prompts = make_prompts(tokenizer, TEXTS + ["9*9=", "hi"])
    params = SAMPLED[1]
    whole = engine.generate(prompts, params)
    # Each half collated on its own, so its left padding differs from the whole batch's too.
    halves = []
    for rows in (slice(0, 3), slice(3, None)):
        half = make_prompts(tokenizer, (TEXTS + ["9*9=", "hi"])[rows])
        half["rollout_seed"] = prompts["rollout_seed"][rows]
        halves.append(engine.generate(half, params))
    responses = torch.cat([h["responses"] for h in halves])
    assert torch.equal(whole["responses"], responses)
    torch.testing.assert_close(whole["rollout_log_probs"], torch.cat([h["rollout_log_probs"] for h in halves]),
                               atol=1e-5, rtol=0)


class ForwardCounter:
    """Counts the model's forward calls and the rows and tokens each saw (the hook makes the native
    engine run the model's forward: the fast decoder would skip it)."""

    def __init__(self, model):
        self.shapes = []
        self.handle = model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        self.shapes.append(tuple(kwargs["input_ids"].shape))


@pytest.mark.parametrize("cache", CACHE_KINDS)
def test_the_samples_of_a_prompt_share_one_prefill_and_still_match_hf(qwen2, cache):
    model, tokenizer = qwen2
    prompts = make_prompts(tokenizer)
    params = dataclasses.replace(SAMPLED[0], n=4)
    counter = ForwardCounter(model)
    try:
        native = NativeRollout(model, tokenizer, cache=cache).generate(prompts, params)
    finally:
        counter.handle.remove()
    prefill, *decode = counter.shapes
    assert prefill == tuple(prompts["input_ids"].shape)  # 5 prompts prefilled, not 20 rows
    assert all(step[1] == 1 for step in decode)
    hf = HFRollout(model, tokenizer).generate(prompts, params)
    assert torch.equal(native["responses"], hf["responses"])


def decode_batch_sizes(model, engine, prompts, params):
    counter = ForwardCounter(model)
    try:
        out = engine.generate(prompts, params)
    finally:
        counter.handle.remove()
    return out, [rows for rows, _ in counter.shapes[1:]]


def test_finished_rows_leave_the_decode_batch(qwen2):
    model, tokenizer = qwen2
    prompts = make_prompts(tokenizer)
    eager = NativeRollout(model, tokenizer, compact_fraction=0.0)
    out, sizes = decode_batch_sizes(model, eager, prompts, GREEDY)
    lengths = out["response_mask"].sum(1)
    # Dropped at once: before decode step t (t >= 1) exactly the rows longer than t are still going.
    assert sizes == [int((lengths > t).sum()) for t in range(1, len(sizes) + 1)]
    assert sizes[-1] < len(out), "no row stopped early: the test proves nothing"

    # Dropped in groups (the default): at most a quarter of the decode batch is dead rows, and the
    # responses are the same.
    lazy, sizes = decode_batch_sizes(model, NativeRollout(model, tokenizer, compact_fraction=0.25), prompts, GREEDY)
    assert torch.equal(lazy["responses"], out["responses"])
    live = [int((lengths > t).sum()) for t in range(1, len(sizes) + 1)]
    assert all(n <= size and size - n <= max(1, size // 4) for n, size in zip(live, sizes)), (live, sizes)
    assert sizes[-1] < len(out)


# --------------------------------------------------------------------------- continuous batching

LONG_TAIL = TEXTS + ["3+3=", "long: 1000+2000=", "9"]  # 8 prompts, 3 samples each: 24 rows


@pytest.mark.parametrize("params", [GREEDY, SAMPLED[1]], ids=["greedy", "sampled"])
# (12, 0.7): finished rows keep their slots long after their last token (their positions must not run on)
@pytest.mark.parametrize("cap,compact", [(1, 0.0), (3, 0.0), (5, 0.25), (16, 0.125), (12, 0.7)])
def test_max_num_seqs_refills_the_slots_of_finished_rows_and_draws_what_the_whole_batch_draws(qwen2, params, cap,
                                                                                              compact):
    model, tokenizer = qwen2
    prompts = make_prompts(tokenizer, LONG_TAIL)
    params = dataclasses.replace(params, n=3, max_new_tokens=14)
    whole = NativeRollout(model, tokenizer).generate(prompts, params)
    assert_lengths_differ(whole)
    engine = NativeRollout(model, tokenizer, max_num_seqs=cap, compact_fraction=compact)
    out = engine.generate(prompts, params)
    assert engine.last_path == "fast"
    # Each row's response depends on its prompt, seed and the weights only, not on when it got a slot.
    assert torch.equal(out["responses"], whole["responses"])
    torch.testing.assert_close(out["rollout_log_probs"], whole["rollout_log_probs"], atol=1e-5, rtol=0)
    assert max(engine.last_decode_rows) <= cap
    # The slots are refilled: never more decode steps than running the rows cap at a time, each wave until
    # its longest row ends (the prefill draws each row's first token); fewer once a wave's rows differ in
    # length (one slot, or 3 = a prompt's samples that end together, can only match it). At 0.7 slots
    # are refilled only once most rows have ended: what is checked there is the samples.
    if compact < 0.5:
        lengths = whole["response_mask"].sum(1)
        waves = sum(int(lengths[at:at + cap].max()) - 1 for at in range(0, len(lengths), cap))
        assert len(engine.last_decode_rows) <= waves
        if cap >= 5:
            assert len(engine.last_decode_rows) < waves, (len(engine.last_decode_rows), waves)


def test_max_num_seqs_on_the_model_forward_runs_waves_of_rows(qwen2):
    """The model-forward path's cache takes no new rows: max_num_seqs rows at a time, the same samples."""
    model, tokenizer = qwen2
    prompts = make_prompts(tokenizer, LONG_TAIL)
    params = dataclasses.replace(SAMPLED[0], max_new_tokens=12)
    whole = NativeRollout(model, tokenizer, fast=False).generate(prompts, params)
    engine = NativeRollout(model, tokenizer, fast=False, max_num_seqs=5)
    out = engine.generate(prompts, params)
    assert engine.last_path == "hf" and max(engine.last_decode_rows) <= 5
    assert torch.equal(out["responses"], whole["responses"])
    torch.testing.assert_close(out["rollout_log_probs"], whole["rollout_log_probs"], atol=1e-5, rtol=0)


def test_the_rollout_sections_max_num_seqs_reaches_the_engines(qwen2):
    from verl.config import TrainerConfig

    model, tokenizer = qwen2
    rollout = TrainerConfig().actor_rollout_ref.rollout
    assert build_rollout("native", model, tokenizer, rollout_config=rollout).max_num_seqs == rollout.max_num_seqs
    rollout.max_num_seqs = 64
    one = SamplingParams(max_new_tokens=4)
    assert build_rollout("hf", model, tokenizer, rollout_config=rollout).rows_at_once(one) == 64  # waves
    engine = build_rollout("native", model, tokenizer, rollout_config=rollout, generation_batch_size=8)
    # generation_batch_size counts prompts (their n samples each), max_num_seqs rows: the smaller bound
    assert engine.rows_at_once(dataclasses.replace(one, n=3)) == 24
    assert engine.rows_at_once(dataclasses.replace(one, n=16)) == 64
    assert build_rollout("native", model, tokenizer).rows_at_once(one) is None  # the Python API's default: all at once


# --------------------------------------------------------------------------- engine plumbing

def test_build_rollout_makes_the_native_engine_on_the_callers_model(qwen2):
    model, tokenizer = qwen2
    engine = build_rollout("native", model, tokenizer, seed=3)
    assert "native" in ROLLOUT_NAMES
    assert isinstance(engine, NativeRollout) and engine.model is model
    assert engine.eos_token_ids == [EOS] and engine.pad_token_id == tokenizer.pad_token_id


def test_generation_restores_train_mode(qwen2):
    model, tokenizer = qwen2
    model.train()
    try:
        NativeRollout(model, tokenizer).generate(make_prompts(tokenizer), SamplingParams(max_new_tokens=2))
        assert model.training
    finally:
        model.eval()


def test_unknown_cache_kind_is_refused(qwen2):
    with pytest.raises(ValueError, match="static"):
        NativeRollout(*qwen2, cache="paged")
