"""On-policy distillation: frozen teachers score the student's rollouts (the loss term that pulls
the student toward them is :func:`verl.algorithms.distillation.distillation_loss`).

verl's on-policy distillation (``distillation.*``; docs/distillation.md). Papers: Agarwal et al.
2023, "On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes" (GKD: the
per-token divergence backpropagated directly, ``use_policy_gradient=false``), and Thinking
Machines' "On-Policy Distillation" (2025: minus the per-token reverse KL used as the advantage of
a policy-gradient loss, ``use_policy_gradient=true``).

Deviations from verl:
* The teachers are Hugging Face causal LMs run here, a forward pass on the trainer's own devices
  sharded like the reference, not vLLM/SGLang servers on a separate pool; they score the
  student's tokens at temperature 1, as verl forces for its teachers.
* Only the single-sample estimators (k1/kl, abs, k2/mse, k3/low_var_kl) are implemented;
  ``forward_kl_topk`` is refused by the config.
* ``actor/distillation/abs_loss`` is the token mean over the whole mini-batch (verl averages the
  micro-batches' means); verl's ``loss_min`` / ``loss_max`` are not reported.

Batch column added (shape as in :data:`verl.protocol.FIELDS`):
``teacher_log_prob`` ``[B, T_resp]`` float: log-probs of the responses under each sample's teacher.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from verl.distributed.fsdp import parallelize
from verl.errors import VerlError
from verl.models.loading import load_causal_lm
from verl.protocol import Batch
from verl.workers.actor import PolicyModel

logger = logging.getLogger(__name__)

class TeacherWorker:
    """Frozen teacher models that score responses: :meth:`compute_teacher_log_prob`.

    ``teachers`` maps each teacher's routing key to its model path. With one teacher every sample
    goes to it; with several, a sample goes to the teacher whose key equals its ``teacher_key``
    column. Each model is loaded in ``dtype``, frozen, and sharded by ``fsdp_config`` (the
    reference's) on ``device``; ``micro_batch_size`` / ``max_token_len`` / ``remove_padding`` shape
    its forward passes as the reference's do.
    """

    def __init__(self, teachers: dict[str, str], *, teacher_key: str, fsdp_config, device: torch.device,
                 dtype: str, micro_batch_size: int | None = None, max_token_len: int | None = None,
                 remove_padding: bool = False, trust_remote_code: bool = False,
                 attn_implementation: str | None = None, config_keys: dict[str, str] | None = None):
        self.teacher_key = teacher_key
        self.models: dict[str, PolicyModel] = {}
        for key, path in teachers.items():
            model = load_causal_lm(path, dtype=dtype, attn_implementation=attn_implementation,
                                   trust_remote_code=trust_remote_code, disable_dropout=True,
                                   config_key=(config_keys or {}).get(key, "distillation.teacher_models"))
            model = parallelize(model.requires_grad_(False), fsdp_config, device=device)
            self.models[key] = PolicyModel(model, device, micro_batch_size, max_token_len=max_token_len,
                                           remove_padding=remove_padding)
            logger.info("teacher %r: %s (%s parameters)", key, path, f"{sum(p.numel() for p in model.parameters()):,}")

    def model_config(self, key: str):
        return self.models[key].model.config

    def compute_teacher_log_prob(self, batch: Batch) -> Batch:
        """``teacher_log_prob`` ``[B, T_resp]`` of ``batch["responses"]``, at temperature 1."""
        scoring = Batch(batch.tensors, batch.non_tensors, {**batch.meta, "temperature": 1.0})
        if len(self.models) == 1:
            (teacher,) = self.models.values()
            return Batch({"teacher_log_prob": teacher.compute_log_prob(scoring)[0]})
        if self.teacher_key not in batch:
            raise VerlError(f"distillation.teacher_key={self.teacher_key!r} names no column of the batch; name a "
                            f"column of the dataset, e.g. data_source (columns: {', '.join(sorted(batch.keys()))})")
        routes = np.asarray([str(v) for v in batch[self.teacher_key]], dtype=object)
        unknown = sorted(set(routes) - set(self.models))
        if unknown:
            raise VerlError(f"samples with {self.teacher_key}={unknown[0]!r} have no teacher: the keys of "
                            f"distillation.teacher_models are {', '.join(map(repr, self.models))}")
        out = torch.zeros(batch["responses"].shape, dtype=torch.float32, device=batch["responses"].device)
        for key, teacher in self.models.items():
            rows = np.flatnonzero(routes == key).tolist()
            # Every teacher runs on every rank, rows or not, so that the ranks' collectives stay in step.
            log_prob, _ = teacher.compute_log_prob(scoring.index(rows or [0]))
            if rows:
                out[rows] = log_prob.to(out)
        return Batch({"teacher_log_prob": out})
