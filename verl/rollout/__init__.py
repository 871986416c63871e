"""Rollout engines behind one interface: ``hf`` (transformers generate), ``dummy``, ``vllm``."""

from __future__ import annotations

from verl.errors import VerlError
from verl.rollout.base import (RolloutEngine, SamplingParams, assemble_rollout, concat_rollouts,
                              response_mask_from_ids)
from verl.rollout.dummy import DummyRollout
from verl.rollout.hf import HFRollout

ROLLOUT_NAMES = ("hf", "dummy", "vllm")


def build_rollout(name: str, model, tokenizer, *, generation_batch_size: int | None = None,
                  seed: int = 0, device=None) -> RolloutEngine:
    """The engine called ``name``, sharing ``model``'s weights where the engine allows."""
    if name == "hf":
        return HFRollout(model, tokenizer, generation_batch_size=generation_batch_size, device=device)
    if name == "dummy":
        return DummyRollout(model.config.vocab_size, tokenizer.eos_token_id, tokenizer.pad_token_id, seed=seed)
    if name == "vllm":
        from verl.rollout.vllm import check_vllm_available

        check_vllm_available()
        raise VerlError("the vLLM engine is not part of this build yet; use actor_rollout_ref.rollout.name=hf")
    raise VerlError(f"unknown rollout name {name!r} (actor_rollout_ref.rollout.name); choose one of "
                    f"{', '.join(ROLLOUT_NAMES)}")


__all__ = ["ROLLOUT_NAMES", "DummyRollout", "HFRollout", "RolloutEngine", "SamplingParams", "assemble_rollout",
           "build_rollout", "concat_rollouts", "response_mask_from_ids"]
