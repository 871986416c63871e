"""Upstream verl's FSDP checkpoint folder, read: ``global_step_N/actor`` (or ``critic``) holding one
``model_world_size_W_rank_R.pt`` per rank and ``huggingface/`` (the model's config and tokenizer).

Each rank's file is its ``model.state_dict()`` under FSDP2: DTensors on a one-dimensional ``fsdp``
mesh (or ``ddp`` x ``fsdp``, replicated over ``ddp``), each holding the rank's slice of a ``Shard(d)``
placement or all of a ``Replicate`` one. The full tensor of each weight is its slices concatenated
along ``d`` in rank order, checked against the DTensor's global shape. The weights keep the dtype
they were saved in (verl's merger casts them to bfloat16).

The model is built from ``huggingface/config.json`` (or ``--hf_model_path``): ``*ForCausalLM`` for an
actor, ``*ForTokenClassification`` for verl's critic. A LoRA checkpoint of verl (``lora_`` weights) is
refused: its scaling is not in these files.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch

from verl.errors import VerlError

SHARD = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt")


def is_verl_checkpoint(path: Path) -> bool:
    return any(SHARD.fullmatch(p.name) for p in path.glob("model_world_size_*_rank_*.pt"))


def shard_files(path: Path) -> list[Path]:
    """The rank files, in rank order; all ``W`` of them must be there."""
    found = {}
    for file in path.glob("model_world_size_*_rank_*.pt"):
        match = SHARD.fullmatch(file.name)
        if match:
            found.setdefault(int(match.group(1)), {})[int(match.group(2))] = file
    if len(found) != 1:
        raise VerlError(f"{path} holds shards of several world sizes ({sorted(found)}): keep the files of one save")
    world, files = next(iter(found.items()))
    missing = [rank for rank in range(world) if rank not in files]
    if missing:
        raise VerlError(f"{path} lacks the files of rank(s) {missing} of model_world_size_{world}: copy the whole "
                        f"folder")
    return [files[rank] for rank in range(world)]


def full_weights(path: Path) -> dict[str, torch.Tensor]:
    """The full tensors of the sharded checkpoint in ``path``."""
    from torch.distributed.tensor import DTensor

    files = shard_files(path)
    # Unpickling a DTensor rebuilds its mesh without a process group: torch warns that it cannot look one up.
    quiet = logging.getLogger("torch.distributed.device_mesh")
    level, quiet.level = quiet.level, logging.ERROR
    try:
        states = [torch.load(file, map_location="cpu", weights_only=False) for file in files]
    finally:
        quiet.setLevel(level)
    out = {}
    for name, first in states[0].items():
        if not isinstance(first, DTensor):
            raise VerlError(f"{files[0]}: {name} is a plain {type(first).__name__}, not a DTensor: only verl's FSDP2 "
                            f"checkpoints (DTensor shards) are read here")
        placements = tuple(first.placements)
        names = first.device_mesh.mesh_dim_names or ("fsdp",)
        if len(placements) == 2 and names[0] in ("ddp", "dp"):
            placements = placements[1:]  # replicated over the data-parallel dimension
        if len(placements) != 1:
            raise VerlError(f"{name}: a mesh of {names} ({placements}) is not read here; only fsdp (or ddp x fsdp)")
        (placement,) = placements
        locals_ = [state[name]._local_tensor for state in states]
        if placement.is_replicate():
            tensor = locals_[0]
        elif placement.is_shard():
            tensor = torch.cat(locals_, dim=placement.dim)
        else:
            raise VerlError(f"{name}: placement {placement} is not read here")
        if tuple(tensor.shape) != tuple(first.shape):
            raise VerlError(f"{name}: its shards make {tuple(tensor.shape)}, not the saved shape {tuple(first.shape)}")
        out[name] = tensor.contiguous()
    if any("lora_" in name for name in out):
        raise VerlError(f"{path} is a LoRA checkpoint of upstream verl: its adapters' scaling is not in these files; "
                        f"merge it with upstream verl's own merger")
    return out


def model_folder(path: Path, hf_model_path: str | None) -> Path:
    folder = Path(hf_model_path).expanduser() if hf_model_path else path / "huggingface"
    if not (folder / "config.json").is_file():
        raise VerlError(f"{folder} holds no config.json: upstream verl writes the model's config and tokenizer into "
                        f"global_step_N/actor/huggingface; give the model folder the run started from with "
                        f"--hf_model_path")
    return folder


def verl_model(path: Path, hf_model_path: str | None) -> tuple[torch.nn.Module, Path]:
    """The model of upstream verl's checkpoint in ``path`` with its weights, and the folder of its config."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    shard_files(path)  # all ranks' files there: said before anything loads
    folder = model_folder(path, hf_model_path)
    weights = full_weights(path)
    config = AutoConfig.from_pretrained(folder)
    kind = (config.architectures or [""])[0]
    auto = AutoModelForTokenClassification if kind.endswith("ForTokenClassification") else AutoModelForCausalLM
    dtype = next(iter(weights.values())).dtype
    model = auto.from_config(config, dtype=dtype)
    expected = model.state_dict()
    tied = {name for name, param in model.named_parameters(remove_duplicate=False)} - \
        {name for name, param in model.named_parameters()}
    foreign = sorted(set(weights) - set(expected))
    missing = sorted(set(expected) - set(weights) - tied)
    if foreign or missing:
        raise VerlError(f"{path}'s weights do not fit the model of {folder} ("
                        + (f"names it lacks: {foreign[:3]}" if foreign else f"missing: {missing[:3]}")
                        + "): give the model folder the run started from with --hf_model_path")
    model.load_state_dict(weights, strict=False)
    return model.eval(), folder
