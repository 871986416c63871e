"""verl.rollout: the shared output layout, the Hugging Face and dummy engines, and engine selection."""

import pytest
import torch

from verl.data.collate import collate_prompts
from verl.errors import VerlError
from verl.models.loading import load_causal_lm, load_tokenizer
from verl.rollout import (ROLLOUT_NAMES, DummyRollout, HFRollout, SamplingParams, assemble_rollout, build_rollout,
                          response_mask_from_ids)

PAD, EOS = 0, 2
TEXTS = ["12+34=", "5+6=", "99+1=", "7+70="]


def prompt_items(token_lists):
    return [dict(input_ids=ids, raw_prompt=f"p{i}", data_source="test", ground_truth=str(i),
                 extra_info={"row": i}, index=i) for i, ids in enumerate(token_lists)]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return collate_prompts(prompt_items([tokenizer(t)["input_ids"] for t in TEXTS]), tokenizer.pad_token_id)


@pytest.fixture(scope="module")
def eos_prone_model(tiny_model_dir):
    """The fixture model with its EOS logit scaled up, so that some responses stop early and some don't.

    A randomly initialised model almost never emits EOS (about 1 in 259), which would leave the
    right-padding paths untested.
    """
    model = load_causal_lm(str(tiny_model_dir))
    with torch.no_grad():
        model.get_output_embeddings().weight[EOS] *= 40
    return model


def assert_right_padded(out):
    """Each row: ones up to and including the first EOS, pad ids and zero mask after it."""
    for row, mask in zip(out["responses"], out["response_mask"]):
        n = int(mask.sum())
        assert mask.tolist() == [1] * n + [0] * (len(mask) - n)
        assert (row[n:] == PAD).all()
        assert EOS not in row[:n - 1].tolist()
        if n < len(mask):
            assert row[n - 1] == EOS


# --------------------------------------------------------------------------- layout

def test_response_mask_covers_tokens_up_to_and_including_the_first_eos():
    responses = torch.tensor([[5, 2, 7, 2],
                              [5, 6, 7, 8],
                              [2, 0, 0, 0],
                              [5, 9, 2, 2]])
    assert response_mask_from_ids(responses, [2]).tolist() == [[1, 1, 0, 0],
                                                               [1, 1, 1, 1],
                                                               [1, 0, 0, 0],
                                                               [1, 1, 1, 0]]
    # Several EOS ids: whichever comes first ends the response.
    assert response_mask_from_ids(responses, [2, 9]).tolist()[3] == [1, 1, 0, 0]


def test_assemble_rollout_builds_the_protocol_layout_by_hand():
    prompts = collate_prompts(prompt_items([[10, 11, 12], [20]]), PAD)
    raw = torch.tensor([[30, EOS, 31],    # EOS then a stray token: the stray token becomes pad
                        [40, 41, EOS]])   # shorter than max_new_tokens: padded on the right
    out = assemble_rollout(prompts, raw, max_new_tokens=4, eos_token_ids=[EOS], pad_token_id=PAD)

    assert out["prompts"].tolist() == [[10, 11, 12], [0, 0, 20]]
    assert out["responses"].tolist() == [[30, 2, 0, 0], [40, 41, 2, 0]]
    assert out["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]]
    assert out["input_ids"].tolist() == [[10, 11, 12, 30, 2, 0, 0], [0, 0, 20, 40, 41, 2, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 0]]
    # Positions continue from the prompt; padding after the response repeats the last one.
    assert out["position_ids"].tolist() == [[0, 1, 2, 3, 4, 4, 4], [0, 0, 0, 1, 2, 3, 3]]
    assert list(out["uid"]) == list(prompts["uid"])
    assert list(out["ground_truth"]) == ["0", "1"]
    assert list(out["extra_info"]) == [{"row": 0}, {"row": 1}]


def test_padding_added_to_a_short_response_without_eos_is_masked_out():
    prompts = collate_prompts(prompt_items([[10, 11]]), PAD)
    out = assemble_rollout(prompts, torch.tensor([[40, 41]]), max_new_tokens=4, eos_token_ids=[EOS],
                           pad_token_id=PAD)
    assert out["responses"].tolist() == [[40, 41, 0, 0]]
    assert out["response_mask"].tolist() == [[1, 1, 0, 0]]


# --------------------------------------------------------------------------- HF engine

def test_hf_generate_returns_n_rows_per_prompt_with_interleaved_uids_and_right_padding(eos_prone_model, tokenizer,
                                                                                        prompts):
    torch.manual_seed(0)
    out = HFRollout(eos_prone_model, tokenizer).generate(prompts, SamplingParams(max_new_tokens=6, n=3))
    B = len(prompts)
    assert len(out) == 3 * B
    assert out["responses"].shape == (3 * B, 6)
    assert out["input_ids"].shape == (3 * B, prompts["input_ids"].shape[1] + 6)
    assert list(out["uid"]) == [u for u in prompts["uid"] for _ in range(3)]
    assert torch.equal(out["prompts"], prompts["input_ids"].repeat_interleave(3, dim=0))
    assert out.meta["temperature"] == 1.0
    assert_right_padded(out)
    lengths = out["response_mask"].sum(1)
    assert (lengths < 6).any() and (lengths == 6).any(), "seed gives no mix of early-stopped and full responses"


def test_hf_greedy_decoding_is_deterministic_and_equals_model_generate(eos_prone_model, tokenizer, prompts):
    rollout = HFRollout(eos_prone_model, tokenizer)
    greedy = SamplingParams(max_new_tokens=6, n=2, do_sample=False, temperature=0.7)
    first = rollout.generate(prompts, greedy)
    second = rollout.generate(prompts, greedy)
    assert torch.equal(first["responses"], second["responses"])
    assert first.meta["temperature"] == 1.0  # greedy log-probs use the plain softmax

    with torch.no_grad():
        seq = eos_prone_model.generate(input_ids=prompts["input_ids"], attention_mask=prompts["attention_mask"],
                                       do_sample=False, max_new_tokens=6, eos_token_id=EOS, pad_token_id=PAD)
    expected = torch.nn.functional.pad(seq[:, prompts["input_ids"].shape[1]:], (0, 6), value=PAD)[:, :6]
    assert torch.equal(first["responses"][0::2], expected)
    assert torch.equal(first["responses"][1::2], expected)
    assert_right_padded(first)


def test_hf_generation_in_chunks_equals_one_call(eos_prone_model, tokenizer, prompts):
    greedy = SamplingParams(max_new_tokens=5, do_sample=False)
    whole = HFRollout(eos_prone_model, tokenizer).generate(prompts, greedy)
    chunked = HFRollout(eos_prone_model, tokenizer, generation_batch_size=1).generate(prompts, greedy)
    assert torch.equal(whole["responses"], chunked["responses"])
    assert torch.equal(whole["attention_mask"], chunked["attention_mask"])


def test_hf_generation_batch_size_counts_prompts_and_max_num_seqs_rows(eos_prone_model, tokenizer, prompts):
    params = SamplingParams(max_new_tokens=3, n=3, do_sample=False)
    rows = []
    hook = eos_prone_model.register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].shape[0]),
                                                     with_kwargs=True)
    try:
        HFRollout(eos_prone_model, tokenizer, generation_batch_size=1).generate(prompts, params)
        assert max(rows) == 3  # one prompt's 3 samples per call
        rows.clear()
        HFRollout(eos_prone_model, tokenizer, generation_batch_size=1, max_num_seqs=2).generate(prompts, params)
        assert max(rows) == 2
    finally:
        hook.remove()


def test_hf_generate_reports_the_sampling_temperature_and_restores_train_mode(eos_prone_model, tokenizer, prompts):
    eos_prone_model.train()
    try:
        out = HFRollout(eos_prone_model, tokenizer).generate(prompts, SamplingParams(max_new_tokens=2,
                                                                                     temperature=0.7))
        assert eos_prone_model.training
    finally:
        eos_prone_model.eval()
    assert out.meta["temperature"] == 0.7


# --------------------------------------------------------------------------- dummy engine

def test_dummy_rollout_gives_full_length_responses_ending_in_eos_without_running_the_model(tiny_model_dir, tokenizer,
                                                                                          prompts):
    model = load_causal_lm(str(tiny_model_dir))
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    engine = build_rollout("dummy", model, tokenizer, seed=3)
    assert isinstance(engine, DummyRollout)
    out = engine.generate(prompts, SamplingParams(max_new_tokens=5, n=2))

    assert calls == []
    assert out["responses"].shape == (2 * len(prompts), 5)
    assert (out["responses"][:, -1] == EOS).all()
    body = out["responses"][:, :-1]
    assert not torch.isin(body, torch.tensor([EOS, PAD])).any()
    assert (body < model.config.vocab_size).all()
    assert out["response_mask"].bool().all()
    again = build_rollout("dummy", model, tokenizer, seed=3).generate(prompts, SamplingParams(max_new_tokens=5, n=2))
    assert torch.equal(out["responses"], again["responses"])


# --------------------------------------------------------------------------- selection

def test_unknown_rollout_name_lists_the_choices(eos_prone_model, tokenizer):
    with pytest.raises(VerlError) as err:
        build_rollout("sglang", eos_prone_model, tokenizer)
    assert "sglang" in str(err.value)
    assert all(name in str(err.value) for name in ROLLOUT_NAMES)


# Real families' end-of-turn layouts, on a byte-level tokenizer with their special tokens (ids 0-4, then bytes).
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
PHI3 = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + '<|end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")


def family_model(tmp_path, specials, eos, pad, generation_eos, template):
    """A tiny Llama with ``specials`` as special tokens (ids from 0), the tokenizer's eos ``eos`` and pad ``pad``, its
    generation config's eos ids ``generation_eos``, saved and loaded back as a user's checkpoint is."""
    from tokenizers import AddedToken
    from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast

    from verl.models.tiny import _byte_level_core, build_tiny_config

    core = _byte_level_core(specials)
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=eos, pad_token=pad,
                                  padding_side="left", clean_up_tokenization_spaces=False)
    tok.chat_template = template
    config = build_tiny_config(len(tok), "llama", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                               intermediate_size=64, pad_token_id=tok.pad_token_id,
                               eos_token_id=generation_eos[0])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(eos_token_id=generation_eos, pad_token_id=tok.pad_token_id)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    return load_causal_lm(str(tmp_path)), load_tokenizer(str(tmp_path))


def test_responses_end_at_the_chat_templates_end_of_turn_token_the_generation_config_does_not_name(tmp_path):
    """Qwen2.5 base's layout: generation_config.json and the tokenizer name <|endoftext|> (1), its ChatML template
    ends a turn with <|im_end|> (0 here). A response stops at <|im_end|> too (it ran on to max_new_tokens, all of
    it trained and scored)."""
    from verl.rollout.base import policy_eos
    from verl.rollout.native import NativeRollout

    model, tok = family_model(tmp_path, ["<|im_end|>", "<|endoftext|>", "<|im_start|>"], "<|endoftext|>",
                              "<|endoftext|>", [1], CHATML)
    assert policy_eos(model, tok) == [1, 0]
    with torch.no_grad():  # every logit 0: greedy decoding draws id 0, <|im_end|>, at every step
        model.model.norm.weight.zero_()
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    prompts = collate_prompts(prompt_items([tok(text, add_special_tokens=False)["input_ids"]]), tok.pad_token_id)
    for engine in (HFRollout(model, tok), NativeRollout(model, tok)):
        out = engine.generate(prompts, SamplingParams(max_new_tokens=4, do_sample=False))
        assert out["responses"][0].tolist() == [0, 1, 1, 1], engine.name
        assert out["response_mask"][0].tolist() == [1, 0, 0, 0], engine.name


def test_every_eos_id_of_a_phi3_layout_ends_a_response_and_the_tool_turn_follows_the_template(tmp_path):
    """Phi-3's layout: the generation config lists <|endoftext|>, <|assistant|>, <|end|> (the turn's end, third).
    The multi-turn loop cuts a finished turn at <|end|>, so the template's line break after it opens the next
    message (it cut at the first eos id, not in the text, and the line break was lost)."""
    from verl.agent.agent_loop import AgentLoop
    from verl.rollout.base import policy_eos

    specials = ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>"]
    model, tok = family_model(tmp_path, specials, "<|endoftext|>", "<|endoftext|>", [0, 1, 2], PHI3)
    assert policy_eos(model, tok) == [0, 1, 2]
    for name in ("hf", "native", "dummy"):  # every engine, the dummy too (it took the tokenizer's eos alone)
        assert build_rollout(name, model, tok).eos_token_ids == [0, 1, 2], name
    loop = AgentLoop(HFRollout(model, tok), tok, {})
    assert tok.decode(loop.message_ids([{"role": "user", "content": "ok"}])) == "\n<|user|>\nok<|end|>\n<|assistant|>\n"
    assert response_mask_from_ids(torch.tensor([[5, 2, 7], [1, 5, 5]]), policy_eos(model, tok)).tolist() == \
        [[1, 1, 0], [1, 0, 0]]


# Like Qwen3's template: the last assistant turn is rendered with an (empty) think block, earlier ones without.
THINK_LAST = ("{% for m in messages %}{% if m['role'] == 'assistant' and loop.last %}"
              "{{ '<|im_start|>assistant\n<think></think>' + m['content'] + '<|im_end|>\n' }}"
              "{% else %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def test_an_agent_loop_dropped_leaves_no_thread_or_open_file_behind(eos_prone_model, tokenizer):
    """Each AgentLoop runs its tools' event loop in a thread of its own: it ended with the AgentLoop (before, 20
    loops built and dropped left 20 threads and 60 descriptors, the selector's and its wake-up socket's)."""
    import gc
    import os
    import threading

    from verl.agent.agent_loop import AgentLoop

    def threads_and_fds():
        return sum(t.name == "verl-tools" for t in threading.enumerate()), len(os.listdir("/proc/self/fd"))

    gc.collect()
    before = threads_and_fds()
    for _ in range(5):
        AgentLoop(HFRollout(eos_prone_model, tokenizer), tokenizer, {})
    gc.collect()
    assert threads_and_fds() == before


def test_a_tool_turn_follows_a_template_that_renders_the_last_assistant_turn_otherwise(tmp_path):
    """Qwen3's template renders the last assistant turn with an empty think block and earlier ones without:
    the multi-turn loop refused it ("renders a conversation differently once messages follow it"). The tool
    message's text is what the template puts after the turn's <|im_end|>."""
    from verl.agent.agent_loop import AgentLoop

    model, tok = family_model(tmp_path, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>",
                              "<|endoftext|>", [2, 0], THINK_LAST)
    loop = AgentLoop(HFRollout(model, tok), tok, {})
    ids = loop.message_ids([{"role": "tool", "content": "42"}])
    assert tok.decode(ids) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
