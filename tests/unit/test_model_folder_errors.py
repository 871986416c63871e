"""Model folders that transformers reads without a clear word: weight files that are not the weights, weights
that are not the model's, no tokenizer, a config it cannot build. Each is one ModelLoadError naming the fix."""

import json
import shutil

import pytest
import safetensors.torch

from verl.errors import ModelLoadError
from verl.models import loading
from verl.utils.model import load_hf_model


@pytest.fixture()
def folder(tiny_model_dir, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(tiny_model_dir, copy)
    return copy


def test_a_clone_without_git_lfs_names_the_pointer_file_and_git_lfs_pull(folder):
    """Before: safetensors' "Error while deserializing header: header too large" from inside transformers."""
    (folder / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146"
                                              "14ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 988097824\n")
    with pytest.raises(ModelLoadError, match=r"model\.safetensors is a Git LFS pointer .*not the weights: the "
                                             r"repository was cloned without Git LFS; .*git lfs pull"):
        loading.load_causal_lm(str(folder))
    with pytest.raises(ModelLoadError, match=r"\(from `model_name_or_path`\): model\.safetensors is a Git LFS pointer"):
        load_hf_model(folder)
    tokenizer_json = (folder / "tokenizer.json").read_bytes()
    (folder / "tokenizer.json").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 7031645\n")
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json is a Git LFS pointer, not the tokenizer"):
        loading.load_tokenizer(str(folder))
    (folder / "tokenizer.json").write_bytes(tokenizer_json)
    loading.load_tokenizer(str(folder))


def test_a_download_cut_off_names_the_file_and_both_sizes(folder):
    """Before: "Error while deserializing header: incomplete metadata, file not fully covered"."""
    weights = folder / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ModelLoadError, match=rf"model\.safetensors \(from `actor_rollout_ref\.model\.path`\) is not a "
                                             rf"whole safetensors file \(its tensors need {len(whole)} bytes and the "
                                             rf"file has {len(whole) // 2}\)"):
        loading.load_causal_lm(str(folder))


def _rewrite_weights(folder, change):
    weights = safetensors.torch.load_file(str(folder / "model.safetensors"))
    safetensors.torch.save_file(change(weights), str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_weights_saved_under_a_wrapper_prefix_are_refused_not_trained_from_random_values(folder):
    """Before: the model loaded with every weight at its random initial value, without a word."""
    _rewrite_weights(folder, lambda w: {f"module.{k}": v for k, v in w.items()})
    with pytest.raises(ModelLoadError, match=r"model_type 'qwen2'\): \d+ of the model's weights are not in its weight "
                                             r"files, e\.g\. .*they would be trained from random values\. The files "
                                             r"name them with a prefix \('module\.', e\.g\. module\.model\."):
        loading.load_causal_lm(str(folder))


def test_weights_missing_from_a_partial_save_are_named(folder):
    _rewrite_weights(folder, lambda w: {k: v for k, v in w.items() if ".layers.1." not in k})
    with pytest.raises(ModelLoadError, match=r"weights are not in its weight files, e\.g\. model\.layers\.1\..*A weight "
                                             r"file is missing, or the save was partial"):
        loading.load_causal_lm(str(folder))


def test_a_config_of_another_size_names_a_weight_with_both_shapes(folder):
    """Before: RuntimeError "You set `ignore_mismatched_sizes` to `False` ... look at the above report!", with
    the report not printed."""
    config = json.loads((folder / "config.json").read_text())
    hidden = config["hidden_size"]
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 2 * hidden}))
    with pytest.raises(ModelLoadError, match=rf"weights have other shapes than its config\.json describes, e\.g\. "
                                             rf".*in the file, .*{2 * hidden}.* in the model"):
        loading.load_causal_lm(str(folder))


def test_a_critic_may_start_from_a_folder_without_the_lm_head(folder):
    """A critic replaces the output head with a value head: a checkpoint without lm_head is fine for it."""
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    _rewrite_weights(folder, lambda w: {k: v for k, v in w.items() if not k.startswith("lm_head")})
    with pytest.raises(ModelLoadError, match=r"lm_head\.weight"):
        loading.load_causal_lm(str(folder))
    loading.load_causal_lm(str(folder), missing_ok=("lm_head",))


def test_a_folder_saved_without_its_tokenizer_is_named_with_tokenizer_path(folder):
    """Before: transformers built an empty tokenizer (every prompt became no tokens) and the run stopped on
    "the tokenizer has no chat template"."""
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).unlink()
    with pytest.raises(ModelLoadError, match=r"holds no tokenizer files .*so its tokenizer turns every text into no "
                                             r"tokens.*set `actor_rollout_ref\.model\.tokenizer_path` to the folder"):
        loading.load_tokenizer(str(folder))


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def test_a_config_with_its_own_code_names_the_trust_remote_code_key_of_its_section(folder):
    """Before: transformers' "Please pass the argument `trust_remote_code=True`", a Python argument."""
    _edit_config(folder, model_type="my_model", auto_map={"AutoConfig": "configuration_my.MyConfig",
                                                          "AutoModelForCausalLM": "modeling_my.MyModel"})
    with pytest.raises(ModelLoadError, match=r"asks for modelling code shipped in the folder \(auto_map\); set "
                                             r"`critic\.model\.trust_remote_code=true`"):
        loading.load_causal_lm(str(folder), config_key="critic.model.path")


def test_a_model_type_transformers_does_not_know_names_it_and_the_installed_version(folder):
    import transformers

    _edit_config(folder, model_type="qwen9", architectures=["Qwen9ForCausalLM"])
    with pytest.raises(ModelLoadError) as info:
        loading.load_causal_lm(str(folder))
    assert f"model_type 'qwen9', which transformers {transformers.__version__} (installed here) does not know" \
        in str(info.value)
    assert "\n" not in str(info.value)  # one line, not transformers' paragraph


def test_trust_remote_code_given_as_text_or_a_number_is_refused_not_read_as_true(folder):
    """Before: trust_remote_code="False" (text from an environment variable, a form) was truthy, and transformers
    would run a checkpoint's own code with it, without a word."""
    import numpy as np

    from verl.utils.model import load_hf_tokenizer

    for load in (load_hf_model, load_hf_tokenizer):
        for value in ("False", 1):
            with pytest.raises(ModelLoadError, match=rf"^trust_remote_code must be True or False, got {value!r} "):
                load(folder, trust_remote_code=value)
    assert load_hf_tokenizer(folder, trust_remote_code=np.bool_(False)).padding_side == "left"
    assert loading.load_causal_lm_config(folder, trust_remote_code=None).model_type == "qwen2"
