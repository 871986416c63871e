"""FSDP2 for one model: ``parallelize(model, fsdp_config, device=...)`` shards it from outside.

Model code knows nothing of this: ``fully_shard`` is applied to every transformer block, then
to the root (torchtitan's recipe), with the ``fsdp_config`` section of the model's role:

- ``fsdp_size``: ranks one copy of the model is sharded over; -1 = all. A smaller size shards
  within groups of that many ranks and replicates across groups (HSDP, a 2-D mesh).
- ``mixed_precision``: ``param_dtype`` is the dtype blocks compute in (parameters are cast on
  the fly; the master weights and the optimiser keep the model's own dtype), ``reduce_dtype`` the
  dtype gradients are reduced in, ``buffer_dtype`` the dtype floating-point buffers are cast to.
- ``param_offload``: parameters (and so gradients and the optimiser step) live in CPU memory;
  each block is copied to the device for its forward and backward (``CPUOffloadPolicy``).
- ``optimizer_offload``: optimiser state lives in CPU memory between steps
  (:func:`parallelize_optimizer`).

Gradients are SUMMED over the ranks, not averaged (FSDP2's default): a trainer normalises each
rank's loss by counts over all ranks (tokens, sequences; see ``verl.workers.engine``), so each rank's
loss is its share of the loss of the whole batch and the sum of the shares' gradients is its
gradient. Averaging per-rank means would be wrong whenever ranks hold different numbers of tokens.

State dicts go through ``torch.distributed.checkpoint.state_dict``: :func:`full_state_dict` and
:func:`full_optimizer_state_dict` gather full, unsharded tensors (keyed by parameter name, the
layout of an unwrapped model), and the ``load_*`` functions shard such a dict back onto whatever
mesh the model now has. So a checkpoint written at one world size (or by an unwrapped model)
loads at any other. Gathering is a collective: in a multi-rank job every rank calls them together.
:func:`export_hf` writes the Hugging Face folder the same way (every rank gathers, rank 0 writes).

In one process (world size 1) a one-rank process group is started on first use
(:mod:`verl.distributed.process_group`). There FSDP is left out where it would change no number
(:func:`parallelize`: no offload, no cast): the model stays plain and every function here takes it as
it is, so one process trains, saves and loads as a job of several ranks does, with the same files.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)

from verl.checkpoint import write_hf_folder
from verl.distributed.process_group import all_gather_objects, barrier, is_main_process, world_size
from verl.errors import VerlError
from verl.models.loading import resolve_dtype
from verl.models.lora import is_lora_model, merged_weights, plain_model, plain_name, save_adapter


def resolve_fsdp_size(fsdp_size: int, world: int, key: str = "fsdp_size") -> int:
    """Ranks per model copy: -1 = all ``world`` ranks, else a divisor of ``world``."""
    if fsdp_size == -1:
        return world
    if fsdp_size < 1 or world % fsdp_size:
        divisors = [d for d in range(1, world + 1) if world % d == 0]
        arithmetic = f" ({world} % {fsdp_size} = {world % fsdp_size})" if fsdp_size >= 1 else ""
        raise VerlError(f"{key}={fsdp_size} does not divide the world size {world}{arithmetic}; use -1 "
                        f"(shard over all {world} ranks) or one of {divisors}")
    return fsdp_size


def fsdp_mesh(fsdp_config, device: torch.device) -> DeviceMesh:
    """The device mesh for ``fsdp_config.fsdp_size``: 1-D ``(fsdp,)`` or 2-D ``(replicate, fsdp)``."""
    world = world_size()
    size = resolve_fsdp_size(fsdp_config.fsdp_size, world, fsdp_config._path("fsdp_size"))
    if size == world:
        return init_device_mesh(device.type, (world,), mesh_dim_names=("fsdp",))
    return init_device_mesh(device.type, (world // size, size), mesh_dim_names=("replicate", "fsdp"))


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of ``model``: the classes its Hugging Face ``_no_split_modules`` names,
    else the entries of its longest ``nn.ModuleList`` (the decoder layers of most models)."""
    from transformers import PreTrainedModel

    names = set()
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            names.update(module._no_split_modules or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if blocks:
        return blocks
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise VerlError(f"cannot find the transformer blocks of {type(model).__name__} to shard: it has no "
                        f"_no_split_modules and no nn.ModuleList")
    return list(max(lists, key=len))


def parallelize(model: nn.Module, fsdp_config, *, device, mesh: DeviceMesh | None = None,
                plain_when_alone: bool = True) -> nn.Module:
    """Apply FSDP2 to ``model`` in place, block by block and then the root; return it.

    ``device`` is where the model computes. ``mesh`` defaults to the mesh of
    ``fsdp_config.fsdp_size`` over the default process group (started when none exists).
    On a mesh of one rank, FSDP that would change no number (no offload, no cast of the weights or
    the gradients) is left out unless ``plain_when_alone`` is false: the model comes back plain, on
    ``device``, and trains, saves and loads exactly as the wrapped one does, without the DTensor
    machinery around every operation.
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # fully_shard places shards on the current CUDA device
    mesh = mesh if mesh is not None else fsdp_mesh(fsdp_config, device)
    mp = fsdp_config.mixed_precision
    _cast_floating_buffers(model, _dtype(mp.buffer_dtype))
    if plain_when_alone and _identity(model, mesh, fsdp_config):
        return model.to(device)
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if fsdp_config.param_offload else OffloadPolicy()
    # Resharding after every forward, the root included, leaves the model sharded between calls:
    # its parameters are always the DTensors that the optimiser and the state-dict hooks hold.
    mp_policy = MixedPrecisionPolicy(param_dtype=_dtype(mp.param_dtype), reduce_dtype=_dtype(mp.reduce_dtype))
    kwargs = dict(mesh=mesh, mp_policy=mp_policy, offload_policy=offload, reshard_after_forward=True)
    # Children before parents (modules() lists parents first), so nested blocks get their own group.
    for block in reversed(transformer_blocks(model)):
        _shard(block, kwargs)
        # Runs before FSDP's own post-forward hook, which attaches the pre-backward all-gather to
        # the block's output (prepend: hooks run in registration order otherwise).
        block.register_forward_hook(_own_output, prepend=True)
    return _shard(model, kwargs)


@contextmanager
def unsharded(model: nn.Module):
    """Full weights on every rank for the duration, gathered once: the hybrid engine's resharding.

    A decode loop runs one forward per token, and each rank stops when its own rows are done;
    with FSDP's per-forward all-gathers that would be a collective per token (slow) that ranks
    call different numbers of times (a hang). Inside this context the parameters stay unsharded,
    so forwards run no collective at all; on leaving, the model is sharded again. A model without
    FSDP passes through unchanged.
    """
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
    for module in modules:
        module.unshard()
    try:
        yield model
    finally:
        for module in modules:
            module.reshard()
            module.set_reshard_after_forward(True, recurse=False)


def shadow_of(model: nn.Module) -> nn.Module:
    """An empty twin of ``model`` (same class and config, parameters on the meta device, so no
    memory): :func:`gathered` fills it with the gathered weights for a rollout. Make it before
    ``parallelize``, from the plain model."""
    with torch.device("meta"):
        shadow = type(model)(model.config)
    shadow.generation_config = model.generation_config
    return shadow.eval().requires_grad_(False)


@contextmanager
def gathered(model: nn.Module, shadow: nn.Module):
    """``shadow`` (from :func:`shadow_of`) computing with ``model``'s full weights, for the duration.

    :func:`unsharded` gathers the weights once; the shadow's parameters and buffers are then the
    gathered tensors themselves (no copy). Decoding with the shadow runs no FSDP hook at all: at
    batch 64 on the demo model the hooks alone cost about a fifth of the decode time. On leaving,
    the shadow is emptied again (meta tensors) before the model is sharded. A LoRA model (the
    shadow is then made from its base, before the adapters went on) lends its weights with the
    adapters merged in (:func:`verl.models.lora.merged_weights`: new tensors for the adapted layers).
    """
    with unsharded(model):
        # A LoRA model's weights reach the shadow (a plain model) merged, under plain names.
        # Detached: the shadow gets parameters of its own over the same storage (an unwrapped model's
        # own Parameter objects would otherwise become the shadow's, and leave with it).
        params = {name: p.detach() for name, p in model.named_parameters(remove_duplicate=False)}
        weights = merged_weights(model, params)
        shadow.load_state_dict(weights, strict=False, assign=True)
        for name, buffer in model.named_buffers():  # non-persistent ones (rotary tables) are not in a state dict
            owner, _, leaf = plain_name(name).rpartition(".")
            shadow.get_submodule(owner)._buffers[leaf] = buffer
        empty = [name for name, p in shadow.named_parameters() if p.is_meta]
        if empty:
            raise VerlError(f"the rollout copy of {type(model).__name__} got no weights for {empty[:3]}")
        try:
            yield shadow
        finally:
            shadow.to_empty(device="meta")


def parallelize_optimizer(optimizer: torch.optim.Optimizer, fsdp_config) -> torch.optim.Optimizer:
    """With ``optimizer_offload``, keep the optimiser's state in CPU memory between steps: it is
    moved to the parameters' device just for ``step()`` (and after loading a checkpoint, back)."""
    if fsdp_config.optimizer_offload:
        optimizer.register_step_pre_hook(lambda opt, args, kwargs: _move_optimizer_state(opt, to_cpu=False))
        optimizer.register_step_post_hook(lambda opt, args, kwargs: _move_optimizer_state(opt, to_cpu=True))
        optimizer.register_load_state_dict_post_hook(lambda opt: _move_optimizer_state(opt, to_cpu=True))
    return optimizer


# ---------------------------------------------------------------------------- state dicts
def full_state_dict(model: nn.Module, *, every_rank: bool = False) -> dict[str, torch.Tensor]:
    """The model's weights as full tensors (a collective). By default rank 0 gets them on the CPU and
    the other ranks an empty dict (what a checkpoint or an export needs); ``every_rank`` gives every
    rank all of them, on the model's device (what a weight sync into another engine needs)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=not every_rank)
    state = get_model_state_dict(model, options=options)
    # Tied weights (an embedding shared with the output layer) stay one tensor under all their
    # names, as in the model's own state dict: save_pretrained then writes it once.
    names_of: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(param), []).append(name)
    for first, *others in names_of.values():
        for other in others:
            if first in state and other in state:
                state[other] = state[first]
    return state


def full_parameters(model: nn.Module, wanted) -> dict[str, torch.Tensor]:
    """The full tensors of ``model``'s parameters whose name ``wanted(name)`` accepts, on every rank, on
    the model's device (a collective under FSDP: those parameters alone are gathered, each on its own,
    not the whole model as :func:`full_state_dict` does). Unsharded parameters come as they are."""
    from torch.distributed.tensor import DTensor

    return {name: (param.full_tensor() if isinstance(param, DTensor) else param).detach()
            for name, param in model.named_parameters() if wanted(name)}


def check_finite_weights(state: dict[str, torch.Tensor], what: str) -> None:
    """Refuse to write weights holding NaN or inf: raise on every rank alike (a collective).

    ``state`` is a :func:`full_state_dict` (rank 0's full tensors, the other ranks' empty dicts).
    Skipped updates never make weights non-finite; an update with a finite but huge step can
    (e.g. ``optim.lr=1e38``), and a checkpoint of them would poison every resume."""
    bad = [name for name, tensor in state.items() if tensor.is_floating_point() and not torch.isfinite(tensor).all()]
    bad = [name for names in all_gather_objects(bad) for name in names]
    if bad:
        raise VerlError(f"refusing to save the {what} weights: {len(bad)} of its weight tensors hold NaN or inf "
                        f"(first: {bad[0]}): an update diverged, or the model held them when it was loaded; the "
                        f"checkpoints already written are kept. Lower optim.lr, check the rewards for NaN/inf values, "
                        f"or check the model's weights")


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load full tensors (from :func:`full_state_dict` or an unwrapped model) into ``model``, each
    rank keeping its own shards. Rank 0's dict is what loads (it is broadcast); the other ranks'
    may be the empty dicts :func:`full_state_dict` gave them."""
    # Without a process group (a plain model trained alone) there is no rank 0 to broadcast from.
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=True,
                                                                broadcast_from_rank0=dist.is_initialized()))


def full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimiser's state with full tensors, keyed by parameter name (a collective; rank 0 gets
    it, the other ranks an empty state). Offloaded state is gathered on the parameters' device."""
    with _state_on_param_device(optimizer):
        state = get_optimizer_state_dict(model, optimizer,
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # A snapshot: tensors that were not gathered (Adam's "step" counters) would otherwise be the
    # live ones, shared with (and advanced by) an optimiser that loads this dict in the same process.
    # (Ranks other than 0 got an empty dict.)
    if state:
        state["state"] = {name: {key: value.detach().clone() if isinstance(value, torch.Tensor) else value
                                 for key, value in entry.items()} for name, entry in state["state"].items()}
    return state


def load_full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load what :func:`full_optimizer_state_dict` returned (rank 0's is broadcast, as for the model)."""
    with _state_on_param_device(optimizer):
        set_optimizer_state_dict(model, optimizer, state,
                                 options=StateDictOptions(full_state_dict=True,
                                                         broadcast_from_rank0=dist.is_initialized()))


def export_hf(model: nn.Module, tokenizer, target) -> None:
    """``model`` and ``tokenizer`` as a Hugging Face folder at ``target``: every rank gathers the
    weights (a collective), rank 0 writes them (atomically), the others wait for it. A LoRA model is
    written merged (a plain model), and its adapter alone as a PEFT folder in ``target/lora_adapter``."""
    state = full_state_dict(model)
    check_finite_weights(state, "policy")
    if is_main_process():
        # The adapter goes into the temporary folder too: an interrupted export leaves no half folder.
        adapter = (lambda folder: save_adapter(model, state, folder / "lora_adapter")) if is_lora_model(model) else None
        write_hf_folder(plain_model(model), tokenizer, target, state_dict=merged_weights(model, state), extra=adapter)
    barrier()


# ---------------------------------------------------------------------------- internals
def _identity(model: nn.Module, mesh: DeviceMesh, fsdp_config) -> bool:
    """FSDP over one rank that would change nothing: no offload, blocks computing in the dtype of the
    weights, gradients reduced in a dtype that holds every value of theirs (over one rank the reduction
    is a cast there and back). Such a model stays plain: the same numbers without the DTensor machinery
    around every operation (an update 1.0-1.1x slower with it at 256 rows on a CPU, 1.6x at 32)."""
    dtypes = {p.dtype for p in model.parameters()}
    if mesh.size() != 1 or fsdp_config.param_offload or len(dtypes) != 1:
        return False
    (weights,) = dtypes
    compute, reduce = _dtype(fsdp_config.mixed_precision.param_dtype), _dtype(fsdp_config.mixed_precision.reduce_dtype)
    return compute in (None, weights) and (reduce in (None, weights) or _holds_every_value(reduce, weights))


def _holds_every_value(wide: torch.dtype, narrow: torch.dtype) -> bool:
    """Whether every ``narrow`` float survives a cast to ``wide`` and back: no coarser step, no smaller range
    (fp32 holds bf16 and fp16; fp16 holds neither bf16, whose range is larger, nor fp32)."""
    if not (wide.is_floating_point and narrow.is_floating_point):
        return False
    w, n = torch.finfo(wide), torch.finfo(narrow)
    return w.eps <= n.eps and w.max >= n.max and w.smallest_normal <= n.smallest_normal


def _dtype(name: str) -> torch.dtype | None:
    dtype = resolve_dtype(name)
    return None if dtype == "auto" else dtype  # auto: keep the model's own dtype


def _cast_floating_buffers(model: nn.Module, dtype: torch.dtype | None) -> None:
    if dtype is None:
        return
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            if buffer.is_floating_point() and buffer.dtype != dtype:
                setattr(module, name, buffer.to(dtype))


def _own_output(module: nn.Module, args, output):
    """A block's output that is a view (OPT's decoder layer returns ``x.view(shape)``) replaced by a
    copy. FSDP hangs its pre-backward hook on the output; an in-place op on a view of it would
    drop that hook and with it the backward all-gather (wrong gradients, and FSDP warns). A copy
    makes that impossible whatever the next layer does; blocks that return fresh tensors pass."""
    if isinstance(output, torch.Tensor):
        return output.clone() if output._is_view() else output
    if isinstance(output, tuple) and any(isinstance(o, torch.Tensor) and o._is_view() for o in output):
        return type(output)(o.clone() if isinstance(o, torch.Tensor) and o._is_view() else o for o in output)
    return output


def _shard(module: nn.Module, kwargs: dict) -> nn.Module:
    fully_shard(module, **kwargs)
    # Sum, don't average (see the module docstring). A divide factor of 1 rather than a loss scaled
    # by the world size: the loss and its metrics stay the rank's true share, and no rounding of a
    # multiply by W then divide by W. Force-sum: otherwise a factor other than the group size
    # becomes a PREMUL_SUM, which gloo lacks; so every backend and reduce_dtype runs a plain SUM
    # with no division at all. No fp16 overflow guard is lost: each share is already divided by
    # the global count, so the sum has the size of a one-process gradient. At world size 1 the
    # gradient is copied unchanged, as before.
    module.set_gradient_divide_factor(1.0)
    module.set_force_sum_reduction_for_comms(True)
    return module


@contextmanager
def _state_on_param_device(optimizer: torch.optim.Optimizer):
    """Offloaded optimiser state (on the CPU while its parameters are on a GPU) on the parameters'
    device for the duration: gathering and sharding it are collectives of the GPU mesh."""
    offloaded = any(isinstance(v, torch.Tensor) and v.device != p.device and v.shape == p.shape
                    for p, state in optimizer.state.items() for v in state.values())
    if offloaded:
        _move_optimizer_state(optimizer, to_cpu=False)
    try:
        yield
    finally:
        if offloaded:
            _move_optimizer_state(optimizer, to_cpu=True)


def _move_optimizer_state(optimizer: torch.optim.Optimizer, *, to_cpu: bool) -> None:
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.shape == param.shape:
                state[key] = value.to("cpu" if to_cpu else param.device)
