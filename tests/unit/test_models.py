"""verl.models: loading from a folder, response log-probs under left padding, the value model."""

import importlib.util
import logging

import pytest
import torch

from verl.errors import ModelLoadError, VerlError
from verl.models.loading import load_causal_lm, load_tokenizer, resolve_attn_implementation, resolve_dtype
from verl.models.logprob import compute_response_logprobs, logprobs_from_logits, response_logits
from verl.models.tiny import make_tiny_model_folder
from verl.models.value_model import ValueModel

PAD = 0


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    """The fixture model in eval mode; tests in this module only read it."""
    return load_causal_lm(str(tiny_model_dir)).eval()


def left_padded(sequences: list[list[int]]):
    """(input_ids, attention_mask, position_ids) with padding on the left, as verl.protocol lays out."""
    width = max(len(s) for s in sequences)
    ids = torch.tensor([[PAD] * (width - len(s)) + s for s in sequences])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences])
    return ids, mask, (mask.cumsum(dim=1) - 1).clamp(min=0)


# --------------------------------------------------------------------------- loading

def test_load_causal_lm_and_tokenizer_read_the_fixture_folder(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir))
    tok = load_tokenizer(str(tiny_model_dir))
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.vocab_size == 259
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    # One token per ASCII character (byte + 3 specials), RL settings: left padding, pad 0, eos 2.
    assert tok("ab=")["input_ids"] == [ord("a") + 3, ord("b") + 3, ord("=") + 3]
    assert (tok.padding_side, tok.pad_token_id, tok.eos_token_id) == ("left", 0, 2)


def test_every_loader_takes_a_pathlib_path_as_from_pretrained_does(tiny_model_dir, tmp_path):
    """``load_tokenizer(Path(...))`` failed with "'PosixPath' object has no attribute 'startswith'"."""
    from pathlib import Path

    from verl.models.loading import describe_causal_lm, load_causal_lm_config, load_sequence_classifier

    folder = Path(tiny_model_dir)
    assert load_tokenizer(folder).padding_side == "left"
    assert type(load_causal_lm(folder)).__name__ == "Qwen2ForCausalLM"
    assert load_causal_lm_config(folder).vocab_size == 259
    assert describe_causal_lm(folder) is not None
    with pytest.raises(ModelLoadError, match="not a trained sequence-classification model"):  # no score head
        load_sequence_classifier(folder)
    with pytest.raises(ModelLoadError, match=str(tmp_path / "missing")):  # the error names the path as text
        load_tokenizer(tmp_path / "missing")


def test_load_causal_lm_applies_dtype_name_and_override_config(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir), dtype="bf16", override_config={"attention_dropout": 0.25})
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.config.attention_dropout == 0.25


def test_every_token_the_loaded_tokenizer_can_emit_has_an_embedding_row(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir))
    tok = load_tokenizer(str(tiny_model_dir))
    assert len(tok) <= model.config.vocab_size
    ids = tok("hi<|endoftext|>")["input_ids"]
    model(input_ids=torch.tensor([ids]))


@pytest.mark.parametrize("loader", [load_causal_lm, load_tokenizer], ids=["model", "tokenizer"])
def test_missing_folder_raises_model_load_error_naming_the_path_and_the_config_key(loader, tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelLoadError) as err:
        loader(str(missing))
    assert isinstance(err.value, VerlError)
    assert str(missing) in str(err.value)
    assert "actor_rollout_ref.model.path" in str(err.value)


def test_load_error_names_the_config_key_the_caller_passes(tmp_path):
    with pytest.raises(ModelLoadError, match=r"critic\.model\.path"):
        load_causal_lm(str(tmp_path / "gone"), config_key="critic.model.path")


@pytest.mark.skipif(torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None,
                    reason="flash attention can run here, so there is no fallback to observe")
def test_flash_attention_falls_back_to_the_models_default_with_exactly_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.models.loading"):
        assert resolve_attn_implementation("flash_attention_2") is None  # transformers' pick: sdpa, or eager
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "flash_attention_2" in warnings[0].getMessage() and "sdpa" in warnings[0].getMessage()


@pytest.mark.skipif(torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None,
                    reason="flash attention can run here, so there is no fallback to observe")
@pytest.mark.parametrize("arch, fallback", [("gemma2", "eager"), ("llama", "sdpa")])
def test_flash_attention_where_it_cannot_run_loads_the_attention_the_model_has(arch, fallback, tmp_path):
    """Gemma 2 has no sdpa (its soft-capped scores): the fallback named sdpa and the load failed."""
    folder = make_tiny_model_folder(tmp_path / arch, arch=arch, num_layers=1, hidden_size=32, intermediate_size=64)
    model = load_causal_lm(str(folder), attn_implementation="flash_attention_2").eval()
    assert model.config._attn_implementation == fallback
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, load_causal_lm(
            str(folder), attn_implementation=fallback).eval()(input_ids=ids).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("requested", [None, "eager", "sdpa"])
def test_other_attention_implementations_pass_through_silently(requested, caplog):
    with caplog.at_level(logging.WARNING, logger="verl.models.loading"):
        assert resolve_attn_implementation(requested) == requested
    assert caplog.records == []


def test_resolve_dtype_maps_names_and_passes_auto_none_and_dtypes():
    assert resolve_dtype("bf16") is torch.bfloat16
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype("fp16") is torch.float16
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype(torch.float16) is torch.float16
    assert resolve_dtype("auto") == "auto"
    assert resolve_dtype(None) is None


def test_unknown_dtype_raises_and_lists_the_valid_names():
    with pytest.raises(ModelLoadError, match="int8") as err:
        resolve_dtype("int8")
    assert "bf16" in str(err.value) and "auto" in str(err.value)


# --------------------------------------------------------------------------- log-probs

def test_logprobs_from_logits_matches_a_hand_computed_log_softmax():
    logits = torch.tensor([[0.0, 0.0, 0.0],
                           [1.0, 2.0, 3.0]])
    labels = torch.tensor([2, 0])
    # Row 0: uniform over 3 -> log(1/3) = -1.0986123 for every label.
    # Row 1: logsumexp(1, 2, 3) = 3 + log(1 + e^-1 + e^-2) = 3.4076059,
    #        so log-softmax = [-2.4076059, -1.4076059, -0.4076059]; label 0 -> -2.4076059.
    expected = torch.tensor([-1.0986123, -2.4076059])
    torch.testing.assert_close(logprobs_from_logits(logits, labels), expected, atol=1e-6, rtol=0)


def test_logprobs_from_logits_keeps_leading_shape_and_returns_float32_for_bf16():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    labels = torch.randint(7, (2, 5))
    expected = torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0]
    torch.testing.assert_close(logprobs_from_logits(logits, labels), expected)
    out = logprobs_from_logits(logits.bfloat16(), labels)
    assert out.shape == (2, 5) and out.dtype == torch.float32


def _alone(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """Log-probs of ``response`` after ``prompt``, one unpadded sequence, computed by hand."""
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([prompt + response])).logits[0].float(), -1)
    return torch.stack([logp[len(prompt) - 1 + j, tok] for j, tok in enumerate(response)])


def test_left_padded_batch_gives_the_same_logprobs_as_each_sequence_alone(lm):
    prompt_a, response_a = [10, 11, 12, 13, 14], [30, 31, 32]
    prompt_b, response_b = [20, 21], [40, 2, PAD]  # response ends with EOS, then right padding
    ids, mask, pos = left_padded([prompt_a, prompt_b])
    input_ids = torch.cat([ids, torch.tensor([response_a, response_b])], dim=1)
    attention_mask = torch.cat([mask, torch.tensor([[1, 1, 1], [1, 1, 0]])], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    assert position_ids[1].tolist() == [0, 0, 0, 0, 1, 2, 3, 3]

    with torch.no_grad():
        log_probs, _ = compute_response_logprobs(lm, input_ids, attention_mask, position_ids,
                                                 torch.tensor([response_a, response_b]))
        # Without the mask the padded row sees its pads: proof that this comparison can tell.
        unmasked, _ = compute_response_logprobs(lm, input_ids, torch.ones_like(attention_mask), position_ids,
                                                torch.tensor([response_a, response_b]))
    torch.testing.assert_close(log_probs[0], _alone(lm, prompt_a, response_a), atol=1e-5, rtol=0)
    torch.testing.assert_close(log_probs[1, :2], _alone(lm, prompt_b, response_b[:2]), atol=1e-5, rtol=0)
    assert (unmasked[1, :2] - log_probs[1, :2]).abs().max() > 1e-3


def test_temperature_divides_the_logits_and_entropy_uses_the_same_distribution(lm):
    prompt, response = [10, 11, 12], [30, 31]
    input_ids = torch.tensor([prompt + response])
    mask = torch.ones_like(input_ids)
    pos = torch.arange(5)[None]
    responses = torch.tensor([response])
    with torch.no_grad():
        logits = response_logits(lm, input_ids, mask, pos, 2).float()
        hot, entropy = compute_response_logprobs(lm, input_ids, mask, pos, responses, temperature=2.0,
                                                 with_entropy=True)
        plain, no_entropy = compute_response_logprobs(lm, input_ids, mask, pos, responses)
        greedy, _ = compute_response_logprobs(lm, input_ids, mask, pos, responses, temperature=0.0)
    scaled = torch.log_softmax(logits / 2.0, -1)
    torch.testing.assert_close(hot, scaled.gather(-1, responses[..., None])[..., 0], atol=1e-6, rtol=0)
    torch.testing.assert_close(entropy, -(scaled.exp() * scaled).sum(-1), atol=1e-5, rtol=0)
    assert no_entropy is None
    assert not torch.allclose(hot, plain, atol=1e-4)
    # Greedy decoding reports temperature 0: the logits are left alone, not divided by zero.
    torch.testing.assert_close(greedy, plain, atol=0, rtol=0)


# --------------------------------------------------------------------------- value model

def test_value_model_outputs_one_value_per_token_starting_at_exactly_zero(tiny_model_dir):
    critic = ValueModel(load_causal_lm(str(tiny_model_dir)))
    ids, mask, pos = left_padded([[10, 11, 12, 13], [20, 21]])
    values = critic(ids, mask, pos)
    assert values.shape == (2, 4) and values.dtype == torch.float32
    assert torch.equal(values, torch.zeros(2, 4))


def test_response_values_are_the_values_of_the_prefix_each_response_token_was_chosen_from(tiny_model_dir):
    torch.manual_seed(0)
    critic = ValueModel(load_causal_lm(str(tiny_model_dir))).eval()
    head = critic.model.get_output_embeddings()
    with torch.no_grad():  # a nonzero head, so that different states get different values
        head.weight.normal_()
        head.bias.fill_(0.5)
    prompt, response = [20, 21], [40, 41, 42]
    ids, mask, pos = left_padded([[10, 11, 12, 13, 14] + [30, 31, 32], prompt + response])
    with torch.no_grad():
        values = critic.response_values(ids, mask, pos, response_length=3)
        for j in range(3):  # V(prompt + response[:j]) is the value of the state that chose response[j]
            prefix = torch.tensor([prompt + response[:j]])
            alone = critic(prefix)[0, -1]
            torch.testing.assert_close(values[1, j], alone, atol=1e-5, rtol=0)
    assert values.shape == (2, 3)


@pytest.mark.parametrize("family", ["gemma2", "granite", "cohere"])
def test_a_value_is_the_heads_output_whatever_the_family_does_to_its_logits(family):
    """Gemma 2 soft-caps its logits (30 tanh(x / 30)), Granite divides them, Cohere multiplies them: a critic
    built on one gave 29.8 for a head output of 100 (Gemma 2), or the head's output rescaled."""
    import transformers

    from verl.models.tiny import build_tiny_config

    base = build_tiny_config(64, "llama", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64).to_dict()
    sizes = {k: base[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                  "num_attention_heads", "num_key_value_heads")}
    config = {"gemma2": lambda: transformers.Gemma2Config(head_dim=16, final_logit_softcapping=30.0, **sizes),
              "granite": lambda: transformers.GraniteConfig(logits_scaling=8.0, **sizes),
              "cohere": lambda: transformers.CohereConfig(logit_scale=0.0625, **sizes)}[family]()
    torch.manual_seed(0)
    critic = ValueModel(transformers.AutoModelForCausalLM.from_config(config)).eval()
    with torch.no_grad():
        critic.model.get_output_embeddings().bias.fill_(100.0)
        values = critic(torch.tensor([[1, 2, 3]]))
    torch.testing.assert_close(values, torch.full((1, 3), 100.0))


def test_value_model_training_moves_the_head_then_the_backbone(tiny_model_dir):
    torch.manual_seed(0)
    critic = ValueModel(load_causal_lm(str(tiny_model_dir)))
    optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-2, weight_decay=0.0)
    ids, mask, pos = left_padded([[10, 11, 12, 13], [20, 21]])
    target = torch.tensor([[0.0, 0.0, 1.0, -1.0], [0.0, 0.0, 0.5, 2.0]])
    backbone = {n: p.detach().clone() for n, p in critic.model.model.named_parameters()}

    losses = []
    for _ in range(3):
        values = critic(ids, mask, pos)
        loss = ((values - target)[mask.bool()] ** 2).mean()
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
        optimizer.zero_grad()

    moved = [n for n, p in critic.model.model.named_parameters() if not torch.equal(p, backbone[n])]
    assert "embed_tokens.weight" in moved and any(".self_attn." in n for n in moved)
    assert not torch.equal(critic(ids, mask, pos).detach(), torch.zeros(2, 4))
    assert losses[-1] < losses[0]


def test_disable_dropout_zeroes_every_dropout_setting_before_the_model_is_built(tmp_path):
    """RL compares log-probs of separate forward passes: with dropout they would differ run to run."""
    folder = make_tiny_model_folder(tmp_path / "opt", arch="opt")  # OPT ships dropout=0.1, like opt-125m
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(0))

    def two_train_forwards(model):
        model.train()
        return model(input_ids=ids).logits, model(input_ids=ids).logits

    kept = load_causal_lm(str(folder))
    assert kept.config.dropout == 0.1
    a, b = two_train_forwards(kept)
    assert not torch.equal(a, b)
    off = load_causal_lm(str(folder), disable_dropout=True)
    assert off.config.dropout == 0.0 and off.config.attention_dropout == 0.0
    a, b = two_train_forwards(off)
    assert torch.equal(a, b)
    # override_config comes after, so a dropout can still be set on purpose
    chosen = load_causal_lm(str(folder), disable_dropout=True, override_config={"dropout": 0.2})
    assert chosen.config.dropout == 0.2


def test_qwen_vision_language_models_load_with_their_images_and_other_multimodal_ones_are_refused_by_name(tmp_path):
    from transformers import LlavaConfig, Qwen2_5_VLConfig

    from verl.models.loading import ModelLoadError, load_causal_lm, load_causal_lm_config
    from verl.models.tiny_vision import make_tiny_vl_model_folder

    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=200)
    Qwen2_5_VLConfig(text_config=text, vision_config=dict(depth=1, hidden_size=32, out_hidden_size=32)).save_pretrained(
        tmp_path / "qwen")
    assert load_causal_lm_config(str(tmp_path / "qwen")).model_type == "qwen2_5_vl"  # accepted
    model = load_causal_lm(str(make_tiny_vl_model_folder(tmp_path / "tiny", arch="qwen2_5_vl")))
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    LlavaConfig(text_config={"model_type": "llama", **text},
                vision_config={"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                               "num_hidden_layers": 1, "num_attention_heads": 2}).save_pretrained(tmp_path / "llava")
    # a config only: the refusal comes before any weights are read
    with pytest.raises(ModelLoadError, match=r"is a multimodal model \(llava, with vision_config\): of those, only "
                                             r"the vision-language families qwen2_vl, qwen2_5_vl"):
        load_causal_lm(str(tmp_path / "llava"))


def _encoder_folders(tmp_path):
    """Folders of models that are not causal LMs, as users bring them: saved BERT and RoBERTa masked
    LMs (weights and config), a BERT config with no architectures, and a T5 (encoder-decoder)."""
    from transformers import (BertConfig, BertForMaskedLM, RobertaConfig, RobertaForSequenceClassification,
                              T5Config)

    small = dict(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    BertForMaskedLM(BertConfig(**small)).save_pretrained(tmp_path / "bert")
    RobertaForSequenceClassification(RobertaConfig(**small)).save_pretrained(tmp_path / "roberta")
    BertConfig(**small).save_pretrained(tmp_path / "bert-config-only")
    T5Config(d_model=16, num_layers=1, num_heads=2, d_ff=32, vocab_size=60).save_pretrained(tmp_path / "t5")
    return {"bert": "an encoder-only model (BertForMaskedLM)",
            "roberta": "an encoder-only model (RobertaForSequenceClassification)",
            "bert-config-only": "an encoder-only model,", "t5": "an encoder-decoder model"}


def test_encoder_only_and_encoder_decoder_folders_are_refused_as_not_causal_lms(tmp_path):
    from verl.models.loading import load_causal_lm_config

    for name, kind in _encoder_folders(tmp_path).items():
        with pytest.raises(ModelLoadError) as err:
            load_causal_lm(str(tmp_path / name), config_key="critic.model.path")
        text = str(err.value)
        assert "is not a causal language model" in text and kind in text and "(from `critic.model.path`)" in text
        assert "reward_model.model.path" in text  # where such a model can serve
    # decoder-only folders of several families pass, whatever their head is called
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=60)).save_pretrained(tmp_path / "gpt2")
    for arch in ("qwen2", "llama", "opt", "phi3"):
        make_tiny_model_folder(tmp_path / arch, arch=arch, num_layers=1, hidden_size=32, intermediate_size=64)
    for name in ("gpt2", "qwen2", "llama", "opt", "phi3"):
        assert load_causal_lm_config(str(tmp_path / name)).model_type


def test_a_bert_folder_as_the_policy_stops_the_run_with_one_line(tmp_path, capsys):
    from verl.trainer.main_ppo import main

    _encoder_folders(tmp_path)
    assert main([f"actor_rollout_ref.model.path={tmp_path / 'bert'}", "sft_warmstart.enable=false"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "not a causal language model" in err


def _word_tokenizer_folder(path, **special):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {w: i for i, w in enumerate(["[UNK]", "</s>", "hello", "world"])}
    raw = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", **special).save_pretrained(path)
    return str(path)


def test_a_tokenizer_without_eos_or_pad_is_refused_and_a_missing_pad_is_eos_said_once(tmp_path, caplog):
    from verl.models import loading

    with pytest.raises(ModelLoadError, match=r"has neither an eos nor a pad token.*`actor_rollout_ref.model.tokenizer_path`"):
        load_tokenizer(_word_tokenizer_folder(tmp_path / "bare"), config_key="actor_rollout_ref.model.tokenizer_path")
    folder = _word_tokenizer_folder(tmp_path / "eos-only", eos_token="</s>")
    loading._PAD_WARNED.discard(folder)
    with caplog.at_level("WARNING", logger="verl.models.loading"):
        first, again = load_tokenizer(folder), load_tokenizer(folder)
    assert first.pad_token == again.pad_token == "</s>" and first.padding_side == "left"
    assert [r.getMessage() for r in caplog.records if "no pad token" in r.getMessage()] == [
        f"the tokenizer of {folder} has no pad token; padding with its eos token '</s>' (padding is masked out, so "
        "this changes no result)"]


@pytest.mark.parametrize("dtype", ["float32", "bf16", "auto", None])
def test_a_model_described_without_its_weights_is_the_model_load_causal_lm_builds(tmp_path, dtype):
    """What an engine that reads the folder itself (vLLM's rollout process) is told of the model: config,
    generation config (EOS ids) and dtype, as the loaded model has them, without reading a weight."""
    import json

    from verl.models.loading import describe_causal_lm

    folder = make_tiny_model_folder(tmp_path / "m", num_layers=1, hidden_size=32, intermediate_size=64)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7], "bos_token_id": 1}))
    config = json.loads((folder / "config.json").read_text())
    json.dump({**config, "dtype": "bfloat16", "torch_dtype": "bfloat16"}, (folder / "config.json").open("w"))
    for weights in folder.glob("*.safetensors"):
        weights.rename(weights.with_suffix(".kept"))  # no weight can be read
    described = describe_causal_lm(str(folder), dtype=dtype, override_config={"attention_dropout": 0.25})
    for weights in folder.glob("*.kept"):
        weights.rename(weights.with_suffix(".safetensors"))
    model = load_causal_lm(str(folder), dtype=dtype, override_config={"attention_dropout": 0.25})
    assert described.dtype == model.dtype == {"float32": torch.float32, "bf16": torch.bfloat16}.get(dtype, model.dtype)
    assert described.config.to_dict() == model.config.to_dict()
    assert described.generation_config.eos_token_id == model.generation_config.eos_token_id == [2, 7]
    (folder / "generation_config.json").unlink()  # none: derived from the config, as transformers derives it
    assert describe_causal_lm(str(folder)).generation_config.eos_token_id == \
        load_causal_lm(str(folder)).generation_config.eos_token_id
    with pytest.raises(ModelLoadError, match="actor_rollout_ref.model.path"):
        describe_causal_lm(str(tmp_path / "missing"))


def test_token_ids_past_the_models_embeddings_stop_the_run_with_one_line_before_any_model_loads(tmp_path, capsys):
    """A tokenizer with more ids than the model has embeddings (another model's, or tokens added without
    resizing): the prompt holding such an id is named; before, the first forward failed in torch with
    "index out of range in self"."""
    from transformers import AutoModelForCausalLM

    from verl.models.loading import check_token_ids
    from verl.models.tiny import build_char_tokenizer, build_tiny_config
    from verl.trainer.main_ppo import main

    folder = tmp_path / "tiny"
    config = build_tiny_config(60, "llama", num_layers=1, hidden_size=32, intermediate_size=64)  # no 'A' (68) on
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    build_char_tokenizer().save_pretrained(folder)
    model_args = [f"actor_rollout_ref.model.path={folder}", "sft_warmstart.enable=false",
                  "data.builtin_task=addition", f"trainer.default_local_dir={tmp_path / 'out'}"]
    capsys.readouterr()
    assert main(model_args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: prompt 0 of data.train_files holds token id 84 ('Q'), but the model (llama) embeds "
                          "token ids 0..59 only, and the tokenizer has 259") and err.count("\n") == 1
    tokenizer = load_tokenizer(str(folder))
    check_token_ids(tokenizer, config, [[5, 59]], data_key="rows")  # ids the model has
    tokenizer.pad_token = "Z"
    with pytest.raises(ModelLoadError, match="the pad token 'Z' is id 93, but the model"):
        check_token_ids(tokenizer, config, [[5]], data_key="rows")
