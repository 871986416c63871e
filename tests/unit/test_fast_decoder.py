"""verl.rollout.fast_decoder: the lean Llama-family decode path gives the Hugging Face forward's logits,
the native engine uses it where it can and falls back to the model's forward everywhere else."""

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

import verl.rollout.fast_decoder as fast_decoder
import verl.rollout.native as native_rollout
from verl.models.loading import load_causal_lm, load_tokenizer
from verl.models.tiny import build_tiny_config, make_tiny_model_folder
from verl.rollout import HFRollout, SamplingParams
from verl.rollout.fast_decoder import FastDecoder, unsupported_reason
from verl.rollout.native import NativeRollout

from test_rollout_native import TEXTS, eos_prone, make_prompts  # the native engine's own test helpers

VOCAB = 259
SIZES = dict(num_layers=2, hidden_size=64, intermediate_size=128)
GREEDY = SamplingParams(max_new_tokens=12, n=2, do_sample=False, logprobs=True)
SAMPLED = SamplingParams(max_new_tokens=12, n=3, temperature=0.8, top_k=40, top_p=0.9, logprobs=True)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="module", params=["qwen2", "llama", "phi3", "qwen3"])
def arch_model(request, tmp_path_factory):
    path = make_tiny_model_folder(tmp_path_factory.mktemp(f"fast-{request.param}"), arch=request.param, **SIZES)
    return load_causal_lm(str(path)).eval()


def random_model(cls, config_cls, seed=0, **overrides):
    """A tiny randomly initialised model of a class the tiny-model folders do not cover."""
    base = build_tiny_config(VOCAB, "llama", **SIZES).to_dict()
    base = {k: v for k, v in base.items() if k in ("vocab_size", "hidden_size", "intermediate_size",
                                                   "num_hidden_layers", "num_attention_heads",
                                                   "num_key_value_heads", "max_position_embeddings",
                                                   "tie_word_embeddings", "pad_token_id", "bos_token_id",
                                                   "eos_token_id")}
    torch.manual_seed(seed)
    return cls(config_cls(**{**base, **overrides})).eval()


def left_padded(rows=4, length=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (rows, length), generator=g)
    mask = torch.ones_like(ids)
    for row in range(rows):
        mask[row, :row] = 0  # row r has r pads; the last row the most
    positions = (mask.cumsum(1) - 1).masked_fill(mask == 0, 1)
    return ids, mask, positions


def hf_step(model, ids, mask, positions, cache):
    return model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                 use_cache=True).logits[:, -1].float()


def assert_logits_match_hf(model, steps=5, atol=1e-5):
    """Prefill with left padding, several decode steps, a row dropped and rows repeated in between:
    the fast path's logits against the Hugging Face forward with its own cache."""
    ids, mask, positions = left_padded()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        fast = FastDecoder(model)
        cache = DynamicCache(config=model.config)
        torch.testing.assert_close(fast.prefill(ids, mask, positions, ids.shape[1] + steps),
                                   hf_step(model, ids, mask, positions, cache), atol=atol, rtol=0)
        position = mask.sum(1)
        for step in range(steps):
            if step == 2:  # rows leave and others are repeated, as the engine does
                index = torch.tensor([0, 2, 3, 3])
                fast.select(index)
                cache.batch_select_indices(index)
                mask, position = mask[index], position[index]
            tokens = torch.randint(3, VOCAB, (len(mask),), generator=g)
            mask = torch.cat([mask, torch.ones(len(mask), 1, dtype=mask.dtype)], dim=1)
            expected = hf_step(model, tokens[:, None], mask, position[:, None], cache)
            torch.testing.assert_close(fast.decode(tokens, position), expected, atol=atol, rtol=0)
            position = position + 1


# --------------------------------------------------------------------------- logits parity

@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_logits_equal_the_hf_forward(arch_model, packed, monkeypatch):
    if not packed:  # each projection on its own, RoPE on the model's own layout
        monkeypatch.setattr(fast_decoder, "PACK_LIMIT_BYTES", 0)
    assert unsupported_reason(arch_model, 64) is None
    assert FastDecoder(arch_model).complex is packed
    assert_logits_match_hf(arch_model)


def test_logits_equal_hf_for_mistral_and_llama_with_biases():
    assert_logits_match_hf(random_model(MistralForCausalLM, MistralConfig, sliding_window=None))
    llama = random_model(LlamaForCausalLM, LlamaConfig, attention_bias=True, mlp_bias=True,
                         tie_word_embeddings=False, head_dim=32, num_attention_heads=4)
    with torch.no_grad():  # random init leaves biases at zero: make them count
        for name, p in llama.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    assert unsupported_reason(llama) is None
    assert_logits_match_hf(llama)


# Llama 3.x's RoPE (its real factors, the original context shortened so that the 16-dim heads' frequencies fall in
# all three bands: kept, smoothed, scaled), linear scaling, and Qwen's long-context yarn (cos and sin x 1.139).
SCALED_ROPE = {
    "llama3": dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64, rope_theta=500000.0),
    "linear": dict(rope_type="linear", factor=2.0, rope_theta=10000.0),
    "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64, rope_theta=1000000.0),
}


@pytest.mark.parametrize("rope", list(SCALED_ROPE))
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_logits_equal_hf_with_the_rope_scaling_real_checkpoints_ship(rope, packed, monkeypatch):
    """Llama-3.2-1B's config has rope_type llama3: the native rollout ran the Hugging Face forward for it."""
    if not packed:
        monkeypatch.setattr(fast_decoder, "PACK_LIMIT_BYTES", 0)
    model = random_model(LlamaForCausalLM, LlamaConfig, rope_parameters=SCALED_ROPE[rope], num_attention_heads=4,
                         head_dim=16, max_position_embeddings=4096)
    assert model.model.rotary_emb.rope_type == rope
    assert unsupported_reason(model, 64) is None
    assert_logits_match_hf(model)


def test_bfloat16_runs_the_real_valued_rope(arch_model):
    model = arch_model.to(torch.bfloat16)
    try:
        assert not FastDecoder(model).complex
        assert FastDecoder(model).attention_fp32  # on a CPU: decode attention in fp32 (see below)
        assert_logits_match_hf(model, steps=3, atol=0.1)  # bf16 rounding differs op by op
    finally:
        arch_model.float()


# --------------------------------------------------------------------------- the engine

def test_native_uses_the_fast_path_and_matches_hf_greedy_and_sampled(arch_model, tokenizer):
    model = eos_prone(arch_model)
    prompts = make_prompts(tokenizer, TEXTS)
    for params in (GREEDY, SAMPLED):
        engine = NativeRollout(model, tokenizer)
        native = engine.generate(prompts, params)
        assert engine.last_path == "fast" and engine.fallback_reason is None
        hf = HFRollout(model, tokenizer).generate(prompts, params)
        assert torch.equal(native["responses"], hf["responses"])
        torch.testing.assert_close(native["rollout_log_probs"], hf["rollout_log_probs"], atol=1e-5, rtol=0)
        assert not native["rollout_log_probs"].is_inference() and not native["responses"].is_inference()


def test_fast_path_shares_the_prefill_and_drops_finished_rows(tiny_model_dir, tokenizer, monkeypatch):
    model = eos_prone(load_causal_lm(str(tiny_model_dir)))
    prefills, prefill = [], FastDecoder.prefill

    def counted(self, ids, *args):
        prefills.append(tuple(ids.shape))
        return prefill(self, ids, *args)

    monkeypatch.setattr(FastDecoder, "prefill", counted)
    prompts = make_prompts(tokenizer, TEXTS)
    engine = NativeRollout(model, tokenizer, compact_fraction=0.0)
    out = engine.generate(prompts, GREEDY)
    assert engine.last_path == "fast"
    assert prefills == [tuple(prompts["input_ids"].shape)]  # 5 prompts prefilled, not 10 rows
    lengths = out["response_mask"].sum(1)
    sizes = engine.last_decode_rows
    assert sizes == [int((lengths > t).sum()) for t in range(1, len(sizes) + 1)]
    assert sizes[-1] < len(out), "no row stopped early: the test proves nothing"
    lazy = NativeRollout(model, tokenizer).generate(prompts, GREEDY)
    assert torch.equal(lazy["responses"], out["responses"])


def test_weights_are_read_at_every_call(tiny_model_dir, tokenizer):
    """The hybrid engine swaps the rollout model's parameters before each rollout: no stale copies."""
    model = load_causal_lm(str(tiny_model_dir)).eval()
    prompts = make_prompts(tokenizer, TEXTS)
    engine = NativeRollout(model, tokenizer)
    before = engine.generate(prompts, SAMPLED)
    other = load_causal_lm(str(make_tiny_model_folder(tiny_model_dir.parent / "other-weights", seed=5, **SIZES)))
    model.load_state_dict(other.state_dict(), assign=True)
    after = engine.generate(prompts, SAMPLED)
    assert engine.last_path == "fast"
    assert not torch.allclose(after["rollout_log_probs"], before["rollout_log_probs"])
    hf = HFRollout(model, tokenizer).generate(prompts, SAMPLED)
    assert torch.equal(after["responses"], hf["responses"])
    torch.testing.assert_close(after["rollout_log_probs"], hf["rollout_log_probs"], atol=1e-5, rtol=0)


def test_unsupported_architecture_falls_back_to_the_hf_forward_and_says_so_once(tmp_path, tokenizer, caplog):
    model = eos_prone(load_causal_lm(str(make_tiny_model_folder(tmp_path / "opt", arch="opt", **SIZES))))
    assert "opt" in unsupported_reason(model)
    prompts = make_prompts(tokenizer, TEXTS)
    engine = NativeRollout(model, tokenizer)
    native_rollout._reported.clear()
    with caplog.at_level("WARNING", logger="verl.rollout.native"):
        native = engine.generate(prompts, GREEDY)
        engine.generate(prompts, GREEDY)  # said once a process, not at every call
    assert engine.last_path == "hf" and "opt" in engine.fallback_reason
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "does not run this model (model_type 'opt'" in said[0], said
    assert torch.equal(native["responses"], HFRollout(model, tokenizer).generate(prompts, GREEDY)["responses"])


def test_what_the_fast_path_does_not_cover_is_refused(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir)).eval()
    assert unsupported_reason(model) is None
    handle = model.model.layers[0].register_forward_hook(lambda *args: None)
    assert "hooks" in unsupported_reason(model)
    handle.remove()
    scaled = load_causal_lm(str(tiny_model_dir),  # frequencies that change with the sequence length
                            override_config=dict(rope_parameters=dict(rope_type="dynamic", factor=2.0,
                                                                      rope_theta=10000.0)))
    assert "RoPE" in unsupported_reason(scaled)
    mistral = random_model(MistralForCausalLM, MistralConfig, sliding_window=16)
    assert unsupported_reason(mistral, 16) is None  # the whole sequence fits in the window
    assert "sliding window" in unsupported_reason(mistral, 17)
    with torch.device("meta"):
        empty = type(model)(model.config)
    assert "meta" in unsupported_reason(empty)


def test_fast_false_runs_the_hf_forward(tiny_model_dir, tokenizer):
    model = load_causal_lm(str(tiny_model_dir)).eval()
    prompts = make_prompts(tokenizer, TEXTS)
    slow = NativeRollout(model, tokenizer, fast=False)
    out = slow.generate(prompts, SAMPLED)
    assert slow.last_path == "hf"
    assert torch.equal(out["responses"], NativeRollout(model, tokenizer).generate(prompts, SAMPLED)["responses"])


GROWTH_SCRIPT = """
import sys, torch
from verl.models.loading import load_causal_lm, load_tokenizer
from verl.rollout import SamplingParams, build_rollout
torch.set_num_threads(1)
model = load_causal_lm(sys.argv[1], dtype="bfloat16").eval()
engine = build_rollout("native", model, load_tokenizer(sys.argv[1]), seed=0)
rss = lambda: int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024
ids = torch.randint(3, 250, (16, 13))
engine.generate_responses(ids, torch.ones_like(ids), SamplingParams(max_new_tokens=8), torch.arange(16))
before = rss()
for call in range(3):
    engine.generate_responses(ids, torch.ones_like(ids), SamplingParams(max_new_tokens=128), torch.arange(16) + call)
print(rss() - before)
"""


def test_bfloat16_decoding_on_a_cpu_does_not_grow_the_process_per_decode_step(tmp_path):
    """16-bit bmm on a CPU (oneDNN) keeps ~0.7 MB of state for every new shape, and decode attention has
    a new one every step: with it in 16-bit, three 128-token calls on 16 rows grew the process by about
    0.45 GiB (a 0.8M model); in fp32, by a few MB."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    folder = make_tiny_model_folder(tmp_path / "m", num_layers=4, hidden_size=128, intermediate_size=384)
    done = subprocess.run([sys.executable, "-c", GROWTH_SCRIPT, str(folder)], capture_output=True, text=True,
                          timeout=300, cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) < 0.15 * 1024**3
