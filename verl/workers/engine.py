"""``TrainingEngine``: one model under training and the loop every trainer shares.

The engine owns the model (as its owner built it: FSDP2-wrapped by ``parallelize`` for the
actor, critic and offline trainers; the plain tiny model in the demo's warm start), its optimiser
and learning-rate schedule, and the generator that shuffles mini-batches.
:meth:`TrainingEngine.train_batch` runs

    epochs -> mini-batches -> global counts -> micro-batches -> loss -> backward -> clip -> step

with the loss function it is given. The actor, critic, SFT, DPO, KTO and the warm start differ only
in that function (and in what they compute before the loop, such as reference log-probs).

Data parallelism: each rank calls ``train_batch`` with its own share of a step's samples. The
counts a mini-batch's loss is normalised by (tokens, sequences, pairs, ...) are summed over all
ranks before its micro-batches run, so each micro-batch loss on each rank is its share of the loss
of the whole mini-batch; FSDP sums the gradients over the ranks (:mod:`verl.distributed.fsdp`).
W ranks therefore give the gradient of one process holding all the samples, however unevenly the
tokens are spread. Normalising by a rank's own counts and averaging over ranks instead would weigh
a token on a rank with few tokens more than one on a rank with many.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable

import torch

from verl.distributed.fsdp import (check_finite_weights, full_optimizer_state_dict, full_state_dict,
                                   load_full_optimizer_state_dict, load_full_state_dict)
from verl.distributed.process_group import all_gather_objects, all_reduce_sum, is_main_process
from verl.errors import NEW_RUN, VerlError
from verl.protocol import Batch
from verl.workers.optim import build_training, clip_and_step
from verl.workers.token_balance import balanced_groups, fewest_groups

logger = logging.getLogger(__name__)

# loss_fn(model, micro_batch, counts) -> (loss, metrics); the micro-batch is on the engine's device.
LossFn = Callable[[torch.nn.Module, Batch, dict], tuple[torch.Tensor, dict]]
# counts_fn(mini_batch) -> this rank's counts of the mini-batch (numbers or 0-dim tensors).
CountsFn = Callable[[Batch], dict]


class TrainingEngine:
    """A model, its optimiser (sharded like the model), LR schedule and mini-batch shuffling.

    ``grad_clip`` bounds the global gradient norm (``math.inf``: no clipping). Metrics the engine
    adds are named ``{metric_prefix}/grad_norm``, ``{metric_prefix}/lr`` and
    ``{metric_prefix}/num_nonfinite_skipped`` (optimiser steps of the call skipped because the
    gradient norm was NaN or inf: the same on every rank, as the norm is). ``data_parallel=False``
    trains this process's model on its own, with no collective (the demo's warm start, which rank 0
    of a torchrun job runs while the others wait).
    """

    def __init__(self, model: torch.nn.Module, optim_cfg, fsdp_config, device: torch.device, *, grad_clip: float,
                 total_steps: int | None, seed: int = 0, metric_prefix: str, data_parallel: bool = True):
        self.model = model
        self.device = device
        self.data_parallel = data_parallel
        self.grad_clip = grad_clip
        self.metric_prefix = metric_prefix
        self.optimizer, self.lr_scheduler, self.generator = build_training(model, optim_cfg, fsdp_config,
                                                                           total_steps, seed)

    def train_batch(self, batch: Batch, loss_fn: LossFn, *, counts_fn: CountsFn, additive=frozenset(),
                    micro_batch_size: int | None = None, mini_batch_size: int | None = None, epochs: int = 1,
                    shuffle: bool = False, max_token_len: int | None = None) -> dict[str, float]:
        """``epochs`` passes over ``batch`` (this rank's share) in mini-batches of ``mini_batch_size``
        samples (default: all), one optimiser step each, every mini-batch in micro-batches of
        ``micro_batch_size`` (default: whole); then one step of the LR schedule.

        With ``max_token_len`` (dynamic batch size) ``micro_batch_size`` is ignored: each mini-batch
        runs in the fewest balanced micro-batches of at most that many tokens (a longer row alone),
        as many on every rank (see :func:`micro_batch_groups`). The loss normalisation, and so the
        gradient, does not depend on how a mini-batch is cut.

        For each mini-batch, ``counts_fn`` gives this rank's counts; their sums over all ranks are
        handed to ``loss_fn`` with every micro-batch, whose loss must be its share of the
        mini-batch loss (normalised by those global counts). Metrics named in ``additive`` are such
        shares: summed over micro-batches and over ranks; the others are averaged. The result is
        the same on every rank (a collective), as are the ranks' schedules (checked up front).
        """
        self.model.train()
        mini_batch_size = mini_batch_size or len(batch)
        if max_token_len:
            micro_batch_size = None
        if self.data_parallel:
            check_same_schedule(len(batch), mini_batch_size, micro_batch_size)
        acc = MetricAccumulator()
        skipped = 0
        for _ in range(epochs):
            for mini in mini_batches(batch, mini_batch_size, shuffle=shuffle, generator=self.generator):
                counts = self.global_counts(counts_fn(mini))
                sums: dict[str, float] = {}
                for rows in micro_batch_groups(mini, micro_batch_size, max_token_len, data_parallel=self.data_parallel):
                    if not rows:  # more micro-batches on another rank: a pass with no weight keeps FSDP in step
                        loss, _ = loss_fn(self.model, mini.index([0]).to(self.device), counts)
                        (loss * 0).backward()
                        continue
                    loss, metrics = loss_fn(self.model, mini.index(rows).to(self.device), counts)
                    loss.backward()
                    for key in additive & metrics.keys():
                        sums[key] = sums.get(key, 0.0) + float(metrics[key])
                    acc.add({k: v for k, v in metrics.items() if k not in additive})
                acc.add(sums)
                grad_norm = self.optimizer_step()
                skipped += not math.isfinite(grad_norm)
                acc.add({f"{self.metric_prefix}/grad_norm": grad_norm})
        acc.add({f"{self.metric_prefix}/lr": self.lr_scheduler.get_last_lr()[0],
                 f"{self.metric_prefix}/num_nonfinite_skipped": skipped})
        self.lr_scheduler.step()
        return all_rank_metrics(acc.means(), additive) if self.data_parallel else acc.means()

    def global_counts(self, local: dict) -> dict[str, torch.Tensor]:
        """``local`` counts summed over all data-parallel ranks, as float64 scalars on the device."""
        values = torch.stack([torch.as_tensor(v, dtype=torch.float64).to(self.device) for v in local.values()])
        return dict(zip(local, (all_reduce_sum(values) if self.data_parallel else values).unbind()))

    def optimizer_step(self) -> float:
        """Clip the accumulated gradients, step (skipped when their norm is not finite); the norm."""
        return clip_and_step(self.model, self.optimizer, self.grad_clip)

    def state_dict(self) -> dict:
        """Everything needed to resume exactly, as full (unsharded) tensors keyed by parameter name:
        loads at any world size. A collective under FSDP; rank 0 gets the tensors, the others empty
        dicts (only rank 0 writes checkpoints). Refuses (on every rank) weights holding NaN or inf.

        Frozen parameters (a LoRA model's base weights) are not saved: they are the weights the
        model was loaded with, and loading it again gives them back. ``frozen_fingerprint`` (sums
        per frozen tensor) lets :meth:`load_state_dict` refuse a model whose frozen weights differ."""
        model = full_state_dict(self.model)
        check_finite_weights(model, self.metric_prefix)
        state = {"optimizer": full_optimizer_state_dict(self.model, self.optimizer),
                 "lr_scheduler": self.lr_scheduler.state_dict(), "generator": self.generator.get_state()}
        frozen = self._frozen_names()
        if frozen:
            state["frozen_fingerprint"] = fingerprint({name: model[name] for name in frozen if name in model})
            model = {name: tensor for name, tensor in model.items() if name not in frozen}
        return {"model": model, **state}

    def load_state_dict(self, state: dict) -> None:
        """Every rank loads the whole :meth:`state_dict` and keeps its own shards."""
        weights = state["model"]
        if "frozen_fingerprint" in state:  # the trainable weights only: the frozen ones are the model's
            current = full_state_dict(self.model)  # a collective; rank 0's is what loads
            changed = changed_frozen(current, state["frozen_fingerprint"])
            changed = [name for names in all_gather_objects(changed) for name in names]
            if changed:
                raise VerlError(f"this checkpoint of the {self.metric_prefix} holds its trained weights (LoRA adapters) "
                                f"but not its frozen base weights, and the model loaded now has other base weights "
                                f"({len(changed)} tensors differ, first: {changed[0]}): resume with the model.path "
                                f"the run was started with")
            partial = not current  # a rank other than 0: the trained weights alone (rank 0's whole set loads)
            current.update(weights)
            weights = current
        else:
            partial = not weights  # a rank other than 0 may hold an empty dict: rank 0's is what loads
        self._check_fits(weights, partial)
        load_full_state_dict(self.model, weights)
        load_full_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        schedule_changed = self.lr_scheduler.resume(state["lr_scheduler"])
        if schedule_changed and is_main_process():
            logger.warning("resuming the %s: %s", self.metric_prefix, schedule_changed)
        self.generator.set_state(state["generator"])

    def _check_fits(self, weights: dict, partial: bool = False) -> None:
        """A checkpoint of another model (the same default_local_dir, another model.path) is said as such,
        naming a weight that does not fit, before torch fails deep inside the load. ``partial``: ``weights``
        holds only some of the model's (missing ones are not an error)."""
        expected = {name: tuple(t.shape) for name, t in self.model.state_dict().items()}  # full shapes (DTensor)
        given = {name: tuple(t.shape) for name, t in weights.items()}
        differ = [f"{name}: {list(given[name])} in the checkpoint, {list(shape)} in the model"
                  for name, shape in expected.items() if name in given and given[name] != shape]
        missing = [] if partial else sorted(expected.keys() - given.keys())
        extra = sorted(given.keys() - expected.keys())
        if differ or missing or extra:
            first = differ[0] if differ else f"{missing[0]} is not in the checkpoint" if missing else \
                f"{extra[0]} is not in the model"
            raise VerlError(f"this checkpoint of the {self.metric_prefix} was written for another model: "
                            f"{len(differ)} weights differ in shape, {len(missing)} are missing and {len(extra)} are "
                            f"not in the model (first: {first}). Resume with the model.path the run was started "
                            f"with, or {NEW_RUN}")

    def _frozen_names(self) -> set[str]:
        # remove_duplicate=False: a tied output layer is the embedding under a second name
        return {name for name, param in self.model.named_parameters(remove_duplicate=False) if not param.requires_grad}


def fingerprint(weights: dict[str, torch.Tensor]) -> dict[str, tuple]:
    """Per tensor: its shape, sum and sum of squares (float64): equal weights give equal prints."""
    with torch.no_grad():
        return {name: (tuple(t.shape), t.double().sum().item(), t.double().square().sum().item())
                for name, t in weights.items()}


def changed_frozen(current: dict[str, torch.Tensor], expected: dict[str, tuple]) -> list[str]:
    """The names of ``current``'s weights whose :func:`fingerprint` differs from a checkpoint's
    ``frozen_fingerprint`` (``expected``): a LoRA checkpoint meeting other base weights."""
    return [name for name, print_ in expected.items()
            if name in current and not _same_fingerprint(fingerprint({name: current[name]})[name], print_)]


def _same_fingerprint(a: tuple, b: tuple) -> bool:
    return tuple(a[0]) == tuple(b[0]) and all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
                                              for x, y in zip(a[1:], b[1:]))


# ---------------------------------------------------------------------------- counts
def token_counts(mini: Batch) -> dict:
    """The counts of PPO-style losses: valid response ``tokens`` and ``seqs`` (sequences)."""
    return {"tokens": mini["response_mask"].sum(), "seqs": len(mini)}


def agg_counts(counts: dict, norm_len: int | None) -> dict:
    """The denominators ``agg_loss`` takes, from the global :func:`token_counts`: ``global_tokens``,
    ``global_seqs`` and the constant ``norm_len`` of ``seq-mean-token-sum-norm``, which must be one
    number on all ranks (the configured maximum response length), not a rank's own padded length."""
    return {"global_tokens": counts["tokens"].clamp(min=1), "global_seqs": int(counts["seqs"]), "norm_len": norm_len}


# ---------------------------------------------------------------------------- batching
def mini_batches(batch: Batch, samples_per_mini_batch: int, *, shuffle: bool, generator: torch.Generator):
    """Split a step's samples into mini-batches (optionally after a shuffle)."""
    if shuffle:
        batch = batch.shuffle(generator)
    return batch.split(samples_per_mini_batch)


def micro_batches(batch: Batch, micro_batch_size: int | None) -> list[Batch]:
    return batch.split(micro_batch_size) if micro_batch_size else [batch]


def token_lengths(batch: Batch) -> list[int]:
    """Tokens of each row (prompt + response): what a forward pass over it costs."""
    return batch["attention_mask"].sum(-1).tolist()


def micro_batch_groups(batch: Batch, micro_batch_size: int | None = None, max_token_len: int | None = None, *,
                       data_parallel: bool) -> list[list[int]]:
    """The rows of each micro-batch of ``batch`` (this rank's rows).

    By rows: consecutive runs of ``micro_batch_size`` (default: all). By tokens (``max_token_len``,
    dynamic batch size): the fewest balanced groups of at most ``max_token_len`` tokens (a longer row
    alone), where under data parallelism every rank uses the largest such number of any rank, so
    that all run equally many forward passes (a rank with fewer rows than that gets empty groups,
    which the caller runs as weightless passes). Rows come back in group order, not the original:
    :func:`restore_order` puts per-row results back.
    """
    n = len(batch)
    if not max_token_len:
        size = micro_batch_size or max(n, 1)
        return [list(range(start, min(start + size, n))) for start in range(0, n, size)]
    lengths = token_lengths(batch)
    k = fewest_groups(lengths, max_token_len)
    if data_parallel:
        # Balanced groups for more k are not always lighter (greedy packing): agree on a k every
        # rank can fit, raising it until none needs more.
        while True:
            wanted = all_gather_objects(k)
            if min(wanted) == max(wanted):
                break
            k = fewest_groups(lengths, max_token_len, at_least=max(wanted))
    return balanced_groups(lengths, k)


def restore_order(groups: list[list[int]], outputs: list[torch.Tensor]) -> torch.Tensor:
    """Per-row ``outputs`` of each non-empty group (in group order) -> one tensor in row order."""
    rows = torch.tensor([i for group in groups for i in group], dtype=torch.long)
    stacked = torch.cat(outputs)
    return stacked[torch.argsort(rows).to(stacked.device)]


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


# ---------------------------------------------------------------------------- metrics
class MetricAccumulator:
    """Collects per-micro-batch metrics and reports their means."""

    def __init__(self):
        self.values: dict[str, list[float]] = defaultdict(list)

    def add(self, metrics: dict) -> None:
        for key, value in metrics.items():
            self.values[key].append(float(value))

    def means(self) -> dict[str, float]:
        return {k: sum(v) / len(v) for k, v in self.values.items()}


def all_rank_metrics(metrics: dict[str, float], additive) -> dict[str, float]:
    """The metrics of the whole data-parallel update, the same on every rank (a collective).

    ``additive`` metrics are each rank's share of a quantity normalised by global counts: their
    sum over ranks is the value of the whole batch. The others (means over a rank's micro-batches,
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
