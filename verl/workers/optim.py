"""Optimiser, learning-rate schedule and the micro-batch loop shared by the actor and critic.

Data parallelism: each rank updates on its own share of a step's samples. Losses are normalised
by the counts of the whole mini-batch on all ranks (:func:`mini_batch_counts`) and FSDP sums the
gradients over ranks (:mod:`verl.distributed.fsdp`), so W ranks give the gradient of one process
holding all the samples, however unevenly the tokens are spread over the ranks.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from verl.distributed.fsdp import parallelize_optimizer
from verl.distributed.process_group import all_gather_objects, all_reduce_sum, world_size
from verl.errors import VerlError
from verl.protocol import Batch


def build_optimizer(params, optim_cfg) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps,
                             weight_decay=optim_cfg.weight_decay)


def build_training(model, optim_cfg, fsdp_config, total_steps: int | None, seed: int):
    """What a trained role (actor or critic) steps with: optimiser (sharded like the model), LR
    schedule, and the generator that shuffles its mini-batches."""
    optimizer = parallelize_optimizer(build_optimizer(model.parameters(), optim_cfg), fsdp_config)
    return optimizer, build_lr_scheduler(optimizer, optim_cfg, total_steps), torch.Generator().manual_seed(seed)


def build_lr_scheduler(optimizer, optim_cfg, total_steps: int | None):
    """Linear warm-up, then constant or cosine decay to ``min_lr_ratio``; one step per RL step."""
    total = optim_cfg.total_training_steps or total_steps or 1
    warmup = optim_cfg.lr_warmup_steps if optim_cfg.lr_warmup_steps >= 0 else \
        int(optim_cfg.lr_warmup_steps_ratio * total)
    floor = optim_cfg.min_lr_ratio

    def factor(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if optim_cfg.warmup_style == "cosine":
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def mini_batches(batch: Batch, samples_per_mini_batch: int, *, shuffle: bool, generator: torch.Generator):
    """Split a step's samples into mini-batches (optionally after a shuffle)."""
    if shuffle:
        batch = batch.shuffle(generator)
    return batch.split(samples_per_mini_batch)


def micro_batches(batch: Batch, micro_batch_size: int | None) -> list[Batch]:
    return batch.split(micro_batch_size) if micro_batch_size else [batch]


def mini_batch_counts(mini: Batch, device: torch.device, norm_len: int | None) -> dict:
    """The denominators ``agg_loss`` takes for one mini-batch: ``global_tokens`` (valid response
    tokens) and ``global_seqs`` summed over all data-parallel ranks, and the constant ``norm_len``.

    With these each micro-batch loss on each rank is its share of the loss of the whole
    mini-batch; the shares' gradients add up (over micro-batches and over ranks) to its gradient.
    Dividing by local counts instead and averaging over ranks would weight a token on a rank with
    few tokens more than one on a rank with many. ``norm_len`` must be one constant on all ranks
    (the configured maximum response length), not a rank's own padded length.
    """
    tokens, seqs = mini["response_mask"].sum().to(device), len(mini)
    if world_size() > 1:
        local = torch.stack([tokens.double(), torch.tensor(float(seqs), dtype=torch.float64, device=device)])
        tokens, seqs = all_reduce_sum(local).unbind()
        seqs = int(seqs)
    return {"global_tokens": tokens.clamp(min=1), "global_seqs": seqs, "norm_len": norm_len}


def check_same_schedule(num_samples: int, samples_per_mini_batch: int, micro_batch_size: int | None) -> None:
    """Fail on every rank alike unless all ranks run as many mini-batches, and as many
    micro-batches in each, as each other.

    FSDP gathers parameters and reduces gradients in every forward and backward, so a rank with
    one micro-batch more would wait forever for the others. Ranks may hold different numbers of
    samples (and tokens) as long as their schedules match: the loss counts are global.
    """
    sizes = [min(samples_per_mini_batch, num_samples - start)
             for start in range(0, num_samples, samples_per_mini_batch)]
    schedule = [-(-size // micro_batch_size) if micro_batch_size else 1 for size in sizes]
    everyone = all_gather_objects((num_samples, schedule))
    if any(other != schedule for _, other in everyone):
        ranks = "; ".join(f"rank {rank}: {n} samples -> {s}" for rank, (n, s) in enumerate(everyone))
        micro = f"{micro_batch_size} samples" if micro_batch_size else "a whole mini-batch"
        raise VerlError(
            f"the data-parallel ranks must run as many mini-batches, and micro-batches in each, as each other "
            f"(FSDP's collectives run in every forward and backward), but with mini-batches of "
            f"{samples_per_mini_batch} samples and micro-batches of {micro} their micro-batches per mini-batch "
            f"differ ({ranks}); split the step's samples evenly over the ranks")


class MetricAccumulator:
    """Collects per-micro-batch metrics and reports their means."""

    def __init__(self):
        self.values: dict[str, list[float]] = defaultdict(list)

    def add(self, metrics: dict) -> None:
        for key, value in metrics.items():
            self.values[key].append(float(value))

    def means(self) -> dict[str, float]:
        return {k: sum(v) / len(v) for k, v in self.values.items()}


def all_rank_metrics(metrics: dict[str, float], additive: set[str]) -> dict[str, float]:
    """The metrics of the whole data-parallel update, the same on every rank (a collective).

    ``additive`` metrics are each rank's share of a loss normalised by global counts: their sum
    over ranks is the loss of the whole batch. The others (means over a rank's micro-batches,
    which every rank has as many of) are averaged over the ranks reporting them.
    """
    gathered = all_gather_objects(metrics)
    if len(gathered) == 1:
        return metrics
    merged = {}
    for key in dict.fromkeys(k for m in gathered for k in m):
        values = [m[key] for m in gathered if key in m]
        merged[key] = sum(values) if key in additive else sum(values) / len(values)
    return merged


def finish_update(worker, acc: "MetricAccumulator", role: str, additive: set[str]) -> dict[str, float]:
    """End of an update call: log the learning rate, advance the schedule, merge the ranks' metrics."""
    acc.add({f"{role}/lr": worker.lr_scheduler.get_last_lr()[0]})
    worker.lr_scheduler.step()
    return all_rank_metrics(acc.means(), additive)


def clip_and_step(model, optimizer, grad_clip: float) -> float:
    """Clip gradients, step unless the norm is not finite (then skip the update); return the norm."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    if torch.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm)


def training_state(role) -> dict:
    """Everything a trained role (actor or critic) needs to resume exactly."""
    return {"model": role.model.state_dict(), "optimizer": role.optimizer.state_dict(),
            "lr_scheduler": role.lr_scheduler.state_dict(), "generator": role.generator.get_state()}


def load_training_state(role, state: dict) -> None:
    role.model.load_state_dict(state["model"])
    role.optimizer.load_state_dict(state["optimizer"])
    role.lr_scheduler.load_state_dict(state["lr_scheduler"])
    role.generator.set_state(state["generator"])
