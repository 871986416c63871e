"""What the offline trainers share below the loop: model loading, the trainable policy (a
:class:`~verl.workers.engine.TrainingEngine`), the frozen reference, per-token / per-sequence
log-probs, and gathering per-example results from every data-parallel rank."""

from __future__ import annotations

import copy

import torch

from verl.algorithms import masked_sum
from verl.distributed.fsdp import parallelize
from verl.distributed.process_group import all_gather_objects
from verl.models.loading import load_causal_lm, load_tokenizer
from verl.models.logprob import logprobs_from_logits
from verl.models.lora import apply_lora, lora_requested
from verl.models.tiny import builtin_model_path
from verl.protocol import Batch
from verl.workers.engine import TrainingEngine, micro_batches


def load_model(path: str | None, model_cfg, config_key: str) -> torch.nn.Module:
    """A causal LM from ``path`` (None = the built-in tiny model) with ``model_cfg``'s loading options."""
    return load_causal_lm(str(path) if path else str(builtin_model_path()), dtype=model_cfg.dtype,
                          attn_implementation=model_cfg.attn_implementation,
                          trust_remote_code=model_cfg.trust_remote_code,
                          override_config=dict(model_cfg.override_config), config_key=config_key,
                          disable_dropout=model_cfg.disable_dropout)


def load_policy(model_cfg) -> tuple[torch.nn.Module, object]:
    """``(model, tokenizer)`` of the ``model`` config section."""
    path = str(model_cfg.path) if model_cfg.path else str(builtin_model_path())
    tokenizer = load_tokenizer(model_cfg.tokenizer_path or path, trust_remote_code=model_cfg.trust_remote_code,
                               config_key="model.tokenizer_path" if model_cfg.tokenizer_path else "model.path",
                               chat_template=model_cfg.custom_chat_template, template_key="model.custom_chat_template")
    return load_model(path, model_cfg, "model.path"), tokenizer


def frozen_reference(policy_model: torch.nn.Module, ref_cfg, model_cfg, device) -> torch.nn.Module:
    """The reference of DPO / KTO: ``ref.path`` when set, else a copy of the initial policy; no
    gradients, eval mode, sharded by ``ref.fsdp_config``. Call it before the policy trains."""
    model = load_model(ref_cfg.path, model_cfg, "ref.path") if ref_cfg.path else copy.deepcopy(policy_model)
    model.requires_grad_(False).eval()
    return parallelize(model, ref_cfg.fsdp_config, device=device)


def trainable_policy(model: torch.nn.Module, config, device, total_steps: int) -> TrainingEngine:
    """The policy under training: sharded by ``model.fsdp_config``, AdamW and schedule of ``optim``,
    gradients clipped to ``optim.clip_grad``; its metrics are ``train/grad_norm`` and ``train/lr``.
    With ``model.lora_rank`` (or ``lora_adapter_path``) only LoRA adapters train (``verl.models.lora``)."""
    if config.model.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if lora_requested(config.model):
        model = apply_lora(model, config.model, config_key="model")
    fsdp_config = config.model.fsdp_config
    return TrainingEngine(parallelize(model, fsdp_config, device=device), config.optim, fsdp_config, device,
                          grad_clip=config.optim.clip_grad, total_steps=total_steps, seed=config.trainer.seed,
                          metric_prefix="train")


def token_logps(model, batch: Batch, prefix: str = "") -> torch.Tensor:
    """log p(token t | tokens < t) for t = 1..T-1: ``[B, T-1]``, aligned with ``loss_mask[:, 1:]``.

    Reads ``{prefix}input_ids``, ``{prefix}attention_mask``, ``{prefix}position_ids``.
    """
    input_ids = batch[f"{prefix}input_ids"]
    logits = model(input_ids=input_ids, attention_mask=batch[f"{prefix}attention_mask"],
                   position_ids=batch[f"{prefix}position_ids"], use_cache=False).logits[:, :-1]
    return logprobs_from_logits(logits, input_ids[:, 1:])


def sequence_logps(model, batch: Batch, prefix: str = "") -> torch.Tensor:
    """Sum of the log-probs of the tokens under ``{prefix}loss_mask``: ``[B]``."""
    return masked_sum(token_logps(model, batch, prefix), batch[f"{prefix}loss_mask"][:, 1:], dim=-1)


@torch.no_grad()
def per_example(fn, batch: Batch, micro_batch_size: int | None, device) -> list[torch.Tensor]:
    """``fn(micro_batch)``, a tuple of ``[b]`` tensors, over ``batch`` in micro-batches on ``device``
    without gradients: each column concatenated ``[B]``, on the batch's own device."""
    home = next(iter(batch.tensors.values())).device
    parts = [fn(mb.to(device)) for mb in micro_batches(batch, micro_batch_size)]
    return [torch.cat(column).to(home) for column in zip(*parts)]


def gather_examples(columns: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per-example ``[n]`` columns of every data-parallel rank, concatenated in rank order (a collective)."""
    everyone = all_gather_objects([c.cpu() for c in columns])
    return [torch.cat(column) for column in zip(*everyone)]
