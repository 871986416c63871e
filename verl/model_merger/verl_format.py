"""Upstream verl's FSDP checkpoint folder, read: ``global_step_N/actor`` (or ``critic``) holding one
``model_world_size_W_rank_R.pt`` per rank and ``huggingface/`` (the model's config and tokenizer).

Each rank's file is its ``model.state_dict()`` under FSDP2: DTensors on a one-dimensional ``fsdp``
mesh (or ``ddp`` x ``fsdp``, replicated over ``ddp``), each holding the rank's slice of a ``Shard(d)``
placement or all of a ``Replicate`` one. The full tensor of each weight is its slices concatenated
along ``d`` in rank order, checked against the DTensor's global shape. The weights keep the dtype
they were saved in (verl's merger casts them to bfloat16).

The model is built from ``huggingface/config.json`` (or ``--hf_model_path``): ``*ForCausalLM`` for an
actor, ``*ForTokenClassification`` for verl's critic. A LoRA checkpoint of verl holds the PEFT model's
whole state (base weights under ``...base_layer.weight``, adapters under ``...lora_A/B.default.weight``)
and ``lora_train_meta.json`` (``r``, ``lora_alpha``): the adapters are merged into the base weights
with the scaling ``lora_alpha / r`` (:func:`verl.models.lora.merge_adapters`, the trainer's own
arithmetic); without that file the scaling is unknown and the checkpoint is refused.
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


def full_weights(path: Path, stored_in_out: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
    """The full tensors of the sharded checkpoint in ``path``. ``stored_in_out``: the model's layers whose weight
    is stored ``[in, out]`` (GPT-2's Conv1D), for merging LoRA adapters into them."""
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
    if any(".lora_" in name for name in out):
        out = _merged_lora(path, out, stored_in_out)
    return out


def _merged_lora(path: Path, weights: dict[str, torch.Tensor],
                 stored_in_out: frozenset[str]) -> dict[str, torch.Tensor]:
    """A verl LoRA checkpoint's weights with the adapters merged in, under the plain model's names. The layers named
    in ``stored_in_out`` (plain names) get the transposed update; their shape cannot tell: GPT-2's attention output
    projection is square."""
    import json

    from verl.models.lora import ADAPTER, merge_adapters, plain_name

    meta_file = path / "lora_train_meta.json"
    if not meta_file.is_file():
        raise VerlError(f"{path} holds LoRA adapters but no lora_train_meta.json (their r and lora_alpha): the "
                        f"scaling to merge them with is unknown; copy that file from the run's checkpoint folder")
    meta = json.loads(meta_file.read_text())
    if not meta.get("r") or meta.get("lora_alpha") is None:
        raise VerlError(f"{meta_file} lacks r or lora_alpha ({meta}): the scaling to merge the adapters with is unknown")
    scaling = meta["lora_alpha"] / meta["r"]
    suffix = f".lora_A.{ADAPTER}.weight"
    scalings = {}
    for name in weights:
        if name.endswith(suffix):
            module = name[:-len(suffix)]
            scalings[module] = (scaling, plain_name(module) in stored_in_out)
    return merge_adapters(weights, scalings)


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
    from transformers.pytorch_utils import Conv1D

    shard_files(path)  # all ranks' files there: said before anything loads
    folder = model_folder(path, hf_model_path)
    config = AutoConfig.from_pretrained(folder)
    kind = (config.architectures or [""])[0]
    auto = AutoModelForTokenClassification if kind.endswith("ForTokenClassification") else AutoModelForCausalLM
    with torch.device("meta"):
        skeleton = auto.from_config(config)
    weights = full_weights(path, frozenset(name for name, m in skeleton.named_modules() if isinstance(m, Conv1D)))
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
