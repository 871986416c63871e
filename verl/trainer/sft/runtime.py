"""What the offline trainers share below the loop: model loading, the trainable policy (FSDP2,
AdamW, schedule, clipped step), the frozen reference, and per-token / per-sequence log-probs."""

from __future__ import annotations

import copy
import os
import random

import numpy as np
import torch

from verl.algorithms import masked_sum
from verl.distributed.fsdp import parallelize, parallelize_optimizer
from verl.errors import VerlError
from verl.models.loading import load_causal_lm, load_tokenizer
from verl.models.logprob import logprobs_from_logits
from verl.models.tiny import builtin_model_path
from verl.protocol import Batch
from verl.workers.optim import build_lr_scheduler, build_optimizer, clip_and_step


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def check_single_process() -> None:
    """The offline trainers run in one process (FSDP2 applied at world size 1) for now."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        raise VerlError(f"the offline trainers (SFT, DPO, KTO) run in one process, and this job has WORLD_SIZE="
                        f"{world}; launch with plain python (not torchrun)")


def load_model(path: str | None, model_cfg, config_key: str) -> torch.nn.Module:
    """A causal LM from ``path`` (None = the built-in tiny model) with ``model_cfg``'s loading options."""
    model = load_causal_lm(str(path) if path else str(builtin_model_path()), dtype=model_cfg.dtype,
                           attn_implementation=model_cfg.attn_implementation,
                           trust_remote_code=model_cfg.trust_remote_code,
                           override_config=dict(model_cfg.override_config), config_key=config_key)
    return model


def load_policy(model_cfg) -> tuple[torch.nn.Module, object]:
    """``(model, tokenizer)`` of the ``model`` config section."""
    path = str(model_cfg.path) if model_cfg.path else str(builtin_model_path())
    tokenizer = load_tokenizer(model_cfg.tokenizer_path or path, trust_remote_code=model_cfg.trust_remote_code,
                               config_key="model.tokenizer_path" if model_cfg.tokenizer_path else "model.path")
    return load_model(path, model_cfg, "model.path"), tokenizer


def frozen_reference(policy_model: torch.nn.Module, ref_cfg, model_cfg, device) -> torch.nn.Module:
    """The reference of DPO / KTO: ``ref.path`` when set, else a copy of the initial policy; no
    gradients, eval mode, sharded by ``ref.fsdp_config``. Call it before the policy trains."""
    model = load_model(ref_cfg.path, model_cfg, "ref.path") if ref_cfg.path else copy.deepcopy(policy_model)
    model.requires_grad_(False).eval()
    return parallelize(model, ref_cfg.fsdp_config, device=device)


class TrainablePolicy:
    """The model under training: FSDP2-wrapped, AdamW, LR schedule, one clipped step at a time."""

    def __init__(self, model: torch.nn.Module, model_cfg, optim_cfg, device, total_steps: int):
        if model_cfg.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.model = parallelize(model, model_cfg.fsdp_config, device=device)
        self.model.train()
        self.optim_cfg = optim_cfg
        self.optimizer = parallelize_optimizer(build_optimizer(self.model.parameters(), optim_cfg),
                                               model_cfg.fsdp_config)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, optim_cfg, total_steps)

    def optimizer_step(self) -> dict[str, float]:
        """Clip, step (skipped when the gradient norm is not finite), advance the schedule."""
        lr = self.lr_scheduler.get_last_lr()[0]
        grad_norm = clip_and_step(self.model, self.optimizer, self.optim_cfg.clip_grad)
        self.lr_scheduler.step()
        return {"train/grad_norm": grad_norm, "train/lr": lr}

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "lr_scheduler": self.lr_scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])


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
