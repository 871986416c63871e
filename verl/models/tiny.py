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

# The tiny tokenizer's chat template: one line per turn, with a short role marker, since every
# character is a token. A user turn is ``Q: <content>\n``, an assistant turn ``A: <content></s>``
# (eos ends the turn, so nothing is trained after it), a system (or any other) turn ``<content>\n``;
# ``add_generation_prompt`` appends ``A: ``. The demo prompt is ``Q: 37+48=\nA: `` (13 tokens) and
# the model answers ``85</s>``: the marker keeps the answer apart from the question.
CHAR_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ 'Q: ' + message['content'] + '\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ 'A: ' + message['content'] + eos_token }}"
    "{% else %}{{ message['content'] + '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'A: ' }}{% endif %}"
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


def _byte_level_core(specials: list[str]):
    """A ``tokenizers`` byte-level BPE with no merges: ``specials`` first, then the 256 bytes."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(specials + _byte_level_alphabet())}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    core.decoder = decoders.ByteLevel()
    return core


def build_char_tokenizer(chat_template: str | None = CHAR_CHAT_TEMPLATE):
    """A byte-level BPE tokenizer with no merges: one token per byte (so one per ASCII character).

    It has the layout of Qwen2's tokenizer (byte-level pre-tokeniser, BPE model) and so loads back
    as the same tokenizer whichever class transformers picks for it. 259 tokens: 3 specials and
    256 bytes; ``<pad>`` is 0, ``<s>`` 1, ``</s>`` 2.
    """
    from transformers import PreTrainedTokenizerFast

    core = _byte_level_core([PAD, BOS, EOS])
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
# More Hugging Face families, each with what sets it apart from Llama: q/k norms (qwen3, olmo2), a sliding
# window on alternate layers and logit soft-capping (gemma2), learned positions and Conv1D layers (gpt2),
# partial rotary (gpt_neox, phi, stablelm), one fused qkv with multi-query attention (falcon), layer norm
# with biases, mixtures of experts (mixtral: fused experts; qwen2_moe: with a shared expert).
# tests/unit/test_more_architectures.py runs each through the rollout and log-prob paths.
MORE_ARCHITECTURES = ("qwen3", "mistral", "gemma", "gemma2", "gpt2", "gpt_neox", "falcon", "phi", "stablelm",
                      "olmo2", "mixtral", "qwen2_moe")


def build_tiny_config(vocab_size: int, arch: str = "qwen2", *, hidden_size: int = 128, num_layers: int = 4,
                      num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 384,
                      max_position_embeddings: int = 256, pad_token_id: int = 0, bos_token_id: int = 1,
                      eos_token_id: int = 2):
    """A config of ``arch`` (one of :data:`ARCHITECTURES` or :data:`MORE_ARCHITECTURES`) small enough to
    train on a CPU (about 0.8M parameters by default)."""
    import transformers

    special = dict(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id)
    decoder = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                   num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                   max_position_embeddings=max_position_embeddings, tie_word_embeddings=True, **special)
    # GPT-style configs name their sizes differently and have no grouped kv heads.
    gpt = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
               num_attention_heads=num_heads, **special)
    experts = dict(num_experts_per_tok=2, **decoder)
    builders = {
        "qwen2": lambda: transformers.Qwen2Config(rope_theta=10000.0, **decoder),
        "llama": lambda: transformers.LlamaConfig(rope_theta=10000.0, **decoder),
        "phi3": lambda: transformers.Phi3Config(**decoder),
        "opt": lambda: transformers.OPTConfig(
            vocab_size=vocab_size, hidden_size=hidden_size, ffn_dim=intermediate_size, num_hidden_layers=num_layers,
            num_attention_heads=num_heads, word_embed_proj_dim=hidden_size,
            max_position_embeddings=max_position_embeddings, **special),
        "qwen3": lambda: transformers.Qwen3Config(head_dim=hidden_size // num_heads, **decoder),
        "mistral": lambda: transformers.MistralConfig(sliding_window=None, **decoder),
        "gemma": lambda: transformers.GemmaConfig(head_dim=hidden_size // num_heads, **decoder),
        # A window shorter than a demo sequence, so the sliding layers really slide.
        "gemma2": lambda: transformers.Gemma2Config(head_dim=hidden_size // num_heads, sliding_window=8, **decoder),
        "gpt2": lambda: transformers.GPT2Config(vocab_size=vocab_size, n_embd=hidden_size, n_layer=num_layers,
                                                n_head=num_heads, n_inner=intermediate_size,
                                                n_positions=max_position_embeddings, **special),
        "gpt_neox": lambda: transformers.GPTNeoXConfig(intermediate_size=intermediate_size, rotary_pct=0.25,
                                                       max_position_embeddings=max_position_embeddings, **gpt),
        "falcon": lambda: transformers.FalconConfig(**gpt),
        "phi": lambda: transformers.PhiConfig(intermediate_size=intermediate_size, partial_rotary_factor=0.5,
                                              max_position_embeddings=max_position_embeddings, **gpt),
        "stablelm": lambda: transformers.StableLmConfig(partial_rotary_factor=0.25, **decoder),
        "olmo2": lambda: transformers.Olmo2Config(**decoder),
        "mixtral": lambda: transformers.MixtralConfig(num_local_experts=4, **experts),
        "qwen2_moe": lambda: transformers.Qwen2MoeConfig(
            num_experts=4, moe_intermediate_size=intermediate_size // 4,
            shared_expert_intermediate_size=intermediate_size // 4, **experts),
    }
    if arch not in builders:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {ARCHITECTURES + MORE_ARCHITECTURES}")
    return builders[arch]()


def make_tiny_model_folder(path: str | Path, *, arch: str = "qwen2", seed: int = 0, vocab_size: int | None = None,
                           **config_kwargs) -> Path:
    """Write a randomly initialised tiny model (``arch``: one of :data:`ARCHITECTURES` or
    :data:`MORE_ARCHITECTURES`) and the byte-level tokenizer to ``path``. ``vocab_size``: embedding rows beyond the tokenizer's (a real model's
    vocabulary size for its memory and compute, e.g. Qwen2.5's 151936; ids past the tokenizer decode
    to nothing), default the tokenizer's size.

    The folder is a normal Hugging Face model folder: ``AutoModelForCausalLM.from_pretrained(path)``
    and ``AutoTokenizer.from_pretrained(path)`` load it, so it can stand in for a hub model of the
    same architecture wherever a path is accepted.
    """
    from transformers import AutoModelForCausalLM

    from verl.models.loading import _quiet_transformers

    _quiet_transformers()
    path = Path(path)
    tokenizer = build_char_tokenizer()
    config = build_tiny_config(max(vocab_size or 0, len(tokenizer)), arch, pad_token_id=tokenizer.pad_token_id,
                               bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                               **config_kwargs)
    return _save_new_model(AutoModelForCausalLM, config, tokenizer, path, seed)


def _save_new_model(auto_class, config, tokenizer, path: Path, seed: int, extras: tuple = ()) -> Path:
    """A model of ``config`` with weights drawn from ``seed`` (the caller's RNG untouched), saved with its
    tokenizer (and ``extras``: an image processor, ...)."""
    import torch

    import os
    import tempfile

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto_class.from_config(config)
    path.mkdir(parents=True, exist_ok=True)
    # Written aside, then each file renamed into place: the ranks of a torchrun job may all write
    # the same folder at once (same seed, same bytes), and none ever reads a half-written file.
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    for extra in extras:
        extra.save_pretrained(tmp)
    for file in tmp.iterdir():
        os.replace(file, path / file.name)
    tmp.rmdir()
    return path


BUILTIN_MODEL_NAME = "tiny-qwen2"
# How the built-in model is built: seed 0 and, since RoPE has no position table (a long context
# costs nothing), room for prompts of verl's default lengths (512 + 512 tokens).
_BUILTIN_MODEL_ARGS = {"seed": 0, "max_position_embeddings": 2048}
# Raise when the built-in model changes in a way builtin_model_key cannot see (e.g. its initialisation).
_BUILTIN_MODEL_REVISION = 1


def builtin_model_key() -> str:
    """A short hash of what shapes the built-in model folder: its chat template, tokenizer layout and
    model spec. It names the cached folder, so a change to any of them writes a new folder instead
    of silently reusing an old one."""
    import hashlib
    import inspect
    import json

    defaults = {name: p.default for name, p in inspect.signature(build_tiny_config).parameters.items()
                if p.default is not inspect.Parameter.empty}
    spec = {"revision": _BUILTIN_MODEL_REVISION, "chat_template": CHAR_CHAT_TEMPLATE, "specials": [PAD, BOS, EOS],
            "split": _QWEN2_SPLIT, "config_defaults": defaults, "args": _BUILTIN_MODEL_ARGS}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]


def builtin_model_path() -> Path:
    """The built-in tiny model (random init, seed 0), written to the cache on first use, in the folder
    ``tiny-qwen2-<builtin_model_key()>``.

    This is what ``actor_rollout_ref.model.path: null`` means.
    """
    return cached_model_folder(f"{BUILTIN_MODEL_NAME}-{builtin_model_key()}",
                               lambda folder: make_tiny_model_folder(folder, **_BUILTIN_MODEL_ARGS))


def cached_model_folder(name: str, make) -> Path:
    """The model folder ``name`` in the cache, written by ``make(folder)`` on first use: into a temporary
    folder renamed into place, so a crash never leaves a half-written model behind (and of two processes
    writing it at once, the first rename wins)."""
    import os
    import shutil
    import tempfile

    from verl.utils.cache import cache_dir

    target = cache_dir("models") / name
    if (target / "config.json").exists():
        return target
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    make(tmp)
    try:
        os.replace(tmp, target)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# The tiny reward model's chat template: role markers the policy's template does not have, so a
# test can tell which template rendered a text.
RM_CHAT_TEMPLATE = "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"


def _build_reward_tokenizer(chat_template: str | None):
    """Byte-level like :func:`build_char_tokenizer`, with another vocabulary: four BERT-style
    specials first (``[PAD]`` 0, ``[CLS]`` 1, ``[SEP]`` 2, ``[UNK]`` 3), so byte ``b`` is id ``b + 4``
    here and ``b + 3`` in the policy's tokenizer. A text pair becomes ``[CLS] A [SEP] B [SEP]``."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    core = _byte_level_core(["[PAD]", "[CLS]", "[SEP]", "[UNK]"])
    if chat_template is None:  # an encoder reward model reads (question, answer) pairs
        core.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                                  eos_token="[SEP]", unk_token="[UNK]", clean_up_tokenization_spaces=False)
    tok.chat_template = chat_template
    return tok


def make_tiny_reward_model_folder(path: str | Path, *, arch: str = "qwen2", num_labels: int = 1, seed: int = 0,
                                  hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                                  intermediate_size: int = 128, max_position_embeddings: int = 512) -> Path:
    """Write a randomly initialised tiny reward model: ``AutoModelForSequenceClassification`` with
    ``num_labels`` outputs, and its own tokenizer (vocabulary unlike the policy's, see
    :func:`_build_reward_tokenizer`).

    ``arch``: ``"deberta"`` (DeBERTa-v3 layout, like OpenAssistant's reward models: no chat
    template, reads (prompt, response) text pairs) or a decoder of :data:`ARCHITECTURES` (with the
    chat template :data:`RM_CHAT_TEMPLATE`, scored at the last token).
    """
    from transformers import AutoModelForSequenceClassification, DebertaV2Config

    from verl.models.loading import _quiet_transformers

    _quiet_transformers()
    path = Path(path)
    tokenizer = _build_reward_tokenizer(None if arch == "deberta" else RM_CHAT_TEMPLATE)
    special = {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.cls_token_id,
               "eos_token_id": tokenizer.sep_token_id}
    if arch == "deberta":
        config = DebertaV2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
                                 num_attention_heads=num_heads, intermediate_size=intermediate_size,
                                 max_position_embeddings=max_position_embeddings, relative_attention=True,
                                 position_biased_input=False, pos_att_type=["p2c", "c2p"], position_buckets=64,
                                 norm_rel_ebd="layer_norm", share_att_key=True, max_relative_positions=-1,
                                 pooler_hidden_size=hidden_size, type_vocab_size=0, **special)
    else:
        config = build_tiny_config(len(tokenizer), arch, hidden_size=hidden_size, num_layers=num_layers,
                                   num_heads=num_heads, num_kv_heads=num_heads // 2,
                                   intermediate_size=intermediate_size,
                                   max_position_embeddings=max_position_embeddings, **special)
    config.num_labels = num_labels
    return _save_new_model(AutoModelForSequenceClassification, config, tokenizer, path, seed)
