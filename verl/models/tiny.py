"""Tiny models and tokenizers in real Hugging Face formats, built from config.

Used by the built-in demo (no hub access needed) and by the tests. Everything here is saved with
``save_pretrained`` and loaded back through the normal ``from_pretrained`` path, so the code that
loads a 7B model from the hub is the code that loads these.
"""

from __future__ import annotations

from pathlib import Path

PAD, BOS, EOS = "<pad>", "<s>", "</s>"

# Same pre-tokenisation rule as Qwen2's byte-level BPE tokenizer, so that transformers loads the
# folder with its Qwen2 tokenizer class and gets identical ids.
_QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                r"""\s*[\r\n]+|\s+(?!\S)|\s+""")

# A minimal chat template: messages are concatenated; the assistant turn follows directly.
# Built-in tasks write prompts that end where the answer starts (``37+48=``).
CHAR_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ message['content'] }}{% endif %}"
    "{% endfor %}"
)


def _byte_level_alphabet() -> list[str]:
    """The 256 printable stand-ins byte-level BPE uses for raw bytes (GPT-2's table)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(
        range(ord("\xae"), ord("\xff") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def build_char_tokenizer(chat_template: str | None = CHAR_CHAT_TEMPLATE):
    """A byte-level BPE tokenizer with no merges: one token per byte (so one per ASCII character).

    It has the layout of Qwen2's tokenizer (byte-level pre-tokeniser, BPE model) and so loads back
    as the same tokenizer whichever class transformers picks for it. 259 tokens: 3 specials and
    256 bytes; ``<pad>`` is 0, ``<s>`` 1, ``</s>`` 2.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS] + _byte_level_alphabet())}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        # unk = eos: byte-level BPE never produces an unknown token, and naming an existing token
        # keeps Qwen2's tokenizer class from adding its own default one past the vocabulary.
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=EOS,
        padding_side="left", clean_up_tokenization_spaces=False,
    )
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


ARCHITECTURES = ("qwen2", "llama", "phi3", "opt")


def build_tiny_config(vocab_size: int, arch: str = "qwen2", *, hidden_size: int = 128, num_layers: int = 4,
                      num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 384,
                      max_position_embeddings: int = 256, pad_token_id: int = 0, bos_token_id: int = 1,
                      eos_token_id: int = 2):
    """A config of ``arch`` small enough to train on a CPU (about 0.8M parameters by default)."""
    from transformers import LlamaConfig, OPTConfig, Phi3Config, Qwen2Config

    special = dict(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id)
    decoder = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                   num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                   max_position_embeddings=max_position_embeddings, tie_word_embeddings=True, **special)
    if arch == "qwen2":
        return Qwen2Config(rope_theta=10000.0, **decoder)
    if arch == "llama":
        return LlamaConfig(rope_theta=10000.0, **decoder)
    if arch == "phi3":
        return Phi3Config(**decoder)
    if arch == "opt":
        return OPTConfig(vocab_size=vocab_size, hidden_size=hidden_size, ffn_dim=intermediate_size,
                         num_hidden_layers=num_layers, num_attention_heads=num_heads,
                         word_embed_proj_dim=hidden_size, max_position_embeddings=max_position_embeddings,
                         **special)
    raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {ARCHITECTURES}")


def build_tiny_qwen2_config(vocab_size: int, **kwargs):
    """The built-in model's architecture: a tiny Qwen2."""
    return build_tiny_config(vocab_size, "qwen2", **kwargs)


def make_tiny_model_folder(path: str | Path, *, arch: str = "qwen2", seed: int = 0, **config_kwargs) -> Path:
    """Write a randomly initialised tiny model (``arch``: qwen2, llama, phi3, opt) and the byte-level
    tokenizer to ``path``.

    The folder is a normal Hugging Face model folder: ``AutoModelForCausalLM.from_pretrained(path)``
    and ``AutoTokenizer.from_pretrained(path)`` load it, so it can stand in for a hub model of the
    same architecture wherever a path is accepted.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from verl.models.loading import _quiet_transformers

    _quiet_transformers()
    path = Path(path)
    tokenizer = build_char_tokenizer()
    config = build_tiny_config(len(tokenizer), arch, pad_token_id=tokenizer.pad_token_id,
                               bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                               **config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


BUILTIN_MODEL_NAME = "tiny-qwen2"


def builtin_model_path() -> Path:
    """The built-in tiny model (random init, seed 0), written to the cache on first use.

    This is what ``actor_rollout_ref.model.path: null`` means.
    """
    import os
    import tempfile

    from verl.utils.cache import cache_dir

    target = cache_dir("models") / BUILTIN_MODEL_NAME
    if (target / "config.json").exists():
        return target
    # Write to a temporary folder and rename, so a crash never leaves a half-written model behind.
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{BUILTIN_MODEL_NAME}-"))
    # RoPE has no position table, so a long context costs nothing: prompts of verl's default
    # lengths (512 + 512 tokens) fit.
    make_tiny_model_folder(tmp, seed=0, max_position_embeddings=2048)
    try:
        os.replace(tmp, target)
    except OSError:  # another process finished first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return target
