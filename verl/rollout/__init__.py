"""Rollout engines behind one interface: ``hf`` (transformers generate), ``native`` (our own KV-cache decode
loop around the same model), ``dummy``, ``vllm``."""

from __future__ import annotations

from verl.errors import VerlError
from verl.rollout.base import (RolloutEngine, SamplingParams, assemble_rollout, concat_rollouts, policy_eos,
                              response_mask_from_ids)
from verl.rollout.dummy import NO_ROLLOUT, DummyRollout, NoRollout
from verl.rollout.hf import HFRollout

ROLLOUT_NAMES = ("auto", "hf", "native", "dummy", "vllm")
# Engines verl offers that this project does not: named as such when asked for.
OTHER_ENGINES = {name: f"verl's {label} engine is not supported here; use vllm (docs/vllm.md), native or hf"
                 for name, label in (("sglang", "SGLang"), ("trtllm", "TensorRT-LLM"))}


def native_available() -> bool:
    """The ``native`` engine runs on this transformers (its layered cache API, 4.56+)."""
    try:
        from transformers.cache_utils import DynamicLayer  # noqa: F401
    except ImportError:
        return False
    return True


def auto_engine(model_type: str) -> tuple[str, str]:
    """``(engine, why)``: what ``rollout.name=auto`` runs for a model of ``model_type``.

    ``native`` where its lean decoder covers the architecture: it draws the same samples as ``hf``
    and measured faster on both devices (docs/performance.md: about 2x on a CPU for the demo and 2x
    on an H200 for a 0.5B Qwen2). Other architectures keep ``hf``: ``native``'s generic path (the
    model's own forward on a transformers ``DynamicCache``) measured only 1.04-1.17x faster on OPT, and
    models with cache classes of their own (hybrid sliding-window caches, state-space layers) are run
    correctly by ``generate`` alone. ``vllm`` is never picked: it is a separate install and a copy of
    the weights, asked for by name."""
    from verl.rollout.fast_decoder import FAMILIES

    if model_type not in FAMILIES:
        return "hf", f"native's fast decoder does not cover {model_type} models"
    if not native_available():
        import transformers

        return "hf", f"native needs transformers 4.56+ (this is {transformers.__version__})"
    return "native", f"the fastest engine for {model_type} models: same samples as hf, lean decoder"


def build_rollout(name: str, model, tokenizer, *, generation_batch_size: int | None = None,
                  seed: int = 0, device=None, model_path: str | None = None, rollout_config=None,
                  max_model_len: int | None = None, trust_remote_code: bool = False) -> RolloutEngine:
    """The engine called ``name``, sharing ``model``'s weights where the engine allows.

    vLLM builds its own copy of the model from ``model_path`` with the engine settings of
    ``rollout_config`` (the ``actor_rollout_ref.rollout`` section); the caller then gives it the
    actor's weights with ``sync_weights``, whatever the folder holds (override_config, a resume).
    """
    if name == "auto":
        name = auto_engine(model.config.model_type)[0]
    # Rows decoded at once: vLLM's max_num_seqs (native refills finished rows' slots, hf runs waves of
    # rows), and generation_batch_size prompts' samples.
    max_num_seqs = getattr(rollout_config, "max_num_seqs", None)
    if name == "hf":
        return HFRollout(model, tokenizer, generation_batch_size=generation_batch_size, device=device, seed=seed,
                         max_num_seqs=max_num_seqs)
    if name == "native":
        try:
            from verl.rollout.native import NativeRollout  # transformers' layered cache API (4.56+)
        except ImportError as e:
            import transformers

            raise VerlError(f"actor_rollout_ref.rollout.name=native needs a newer transformers than "
                            f"{transformers.__version__} ({e}); upgrade it (pip install -U transformers) or "
                            f"use actor_rollout_ref.rollout.name=hf") from None
        return NativeRollout(model, tokenizer, device=device, seed=seed, max_num_seqs=max_num_seqs,
                             generation_batch_size=generation_batch_size)
    if name == NO_ROLLOUT:
        return NoRollout(policy_eos(model, tokenizer), tokenizer.pad_token_id, seed=seed)
    if name == "dummy":
        return DummyRollout(model.config.vocab_size, policy_eos(model, tokenizer), tokenizer.pad_token_id, seed=seed)
    if name == "vllm":
        from verl.rollout.vllm import VLLMRollout, check_vllm_available

        check_vllm_available()
        if model_path is None or rollout_config is None:
            raise VerlError("the vllm rollout needs the model folder (model_path) and the rollout section "
                            "(rollout_config) to build its engine")
        # ``model``: the policy, or its description (verl.models.loading.ModelDescription): vLLM reads the folder
        return VLLMRollout(model_path, tokenizer, eos_token_id=policy_eos(model, tokenizer), model_config=model.config,
                           config=rollout_config, max_model_len=max_model_len, seed=seed,
                           trust_remote_code=trust_remote_code, actor_dtype=model.dtype)
    from verl.config.key_errors import check_choice

    check_choice("actor_rollout_ref.rollout.name", name, ROLLOUT_NAMES, "rollout engine", OTHER_ENGINES)


__all__ = ["NO_ROLLOUT", "OTHER_ENGINES", "ROLLOUT_NAMES", "DummyRollout", "NoRollout", "HFRollout", "RolloutEngine",
           "SamplingParams", "assemble_rollout", "auto_engine", "build_rollout", "concat_rollouts", "native_available",
           "response_mask_from_ids"]
