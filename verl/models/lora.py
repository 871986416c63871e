"""LoRA on a Hugging Face causal LM, with PEFT (Hu et al. 2021, https://arxiv.org/abs/2106.09685).

:func:`apply_lora` wraps a loaded model in a ``peft`` LoRA model (new adapters from the config, or
a trained adapter from ``lora_adapter_path``); afterwards only the adapter weights require
gradients, so only they reach the optimiser and change. The rest of the project keeps seeing plain
Hugging Face weights through two helpers:

- :func:`merged_weights` turns a state dict of the PEFT model (names under ``base_model.model.``,
  ``...base_layer.weight``, ``...lora_A.default.weight``) into the plain model's names, each adapted
  weight merged as ``W + scaling * B @ A``. The rollout engines (the hybrid engine's shadow model,
  the hf/native copies, vLLM) and the Hugging Face export get these, so they run the base model
  with the current adapters folded in and need no PEFT of their own.
- :func:`adapters_disabled` runs the model as its base: the reference policy of the KL terms is the
  actor with its adapters switched off, so no second copy of the weights is held.

Deviations from verl: the hybrid engine and vLLM always decode merged weights (verl's
``lora.merge=false`` would hand vLLM the adapters alone and let it apply them; the numbers are the
same up to rounding); an asynchronous run's rollout does get the adapters alone
(:mod:`verl.models.lora_sync`). Only linear (and GPT-2 Conv1D) layers may be adapted (``target_modules`` naming an embedding or a
convolution is refused); adapters are kept in the base weights' dtype, as FSDP wants one dtype per
parameter group.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

from verl.errors import ModelLoadError

logger = logging.getLogger(__name__)

PEFT_PREFIX = "base_model.model."  # PeftModelForCausalLM -> LoraModel -> the Hugging Face model
ADAPTER = "default"  # the adapter's name inside the PEFT model (peft's default)


def lora_requested(model_cfg) -> bool:
    """Whether the model section asks for LoRA: ``lora_rank > 0`` or a ``lora_adapter_path``."""
    return model_cfg.lora_rank > 0 or model_cfg.lora_adapter_path is not None


VISION_EXCLUDE = r".*visual.*"
"""What a vision-language model's LoRA leaves out when ``exclude_modules`` is unset: the vision tower
(verl's Qwen2.5-VL LoRA example sets the same)."""


def vision_tower(model: nn.Module) -> nn.Module | None:
    """A vision-language model's vision tower (Qwen2-VL family: ``visual``), or None."""
    inner = getattr(model, "model", None)
    return getattr(inner, "visual", None) or getattr(model, "visual", None)


def _linear_names(model: torch.nn.Module, target) -> str:
    """The names target_modules can take in ``model`` (its linear layers), with the one a mistyped name
    probably meant."""
    from verl.errors import closest_name

    names = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                    if isinstance(module, torch.nn.Linear)})
    if not names:
        return ""
    typed = [target] if isinstance(target, str) else list(target or ())
    guesses = [f"{t} -> {close}" for t in typed if t not in names for close in [closest_name(t, names)] if close]
    meant = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
    return f". The model's linear layers are named {', '.join(names)}{meant}; or give target_modules=all-linear"


def _check_targets(model: torch.nn.Module, target, config_key: str) -> None:
    """Each name of a target_modules list matches a layer: PEFT applies the adapters to the names that
    match and says nothing of one that matches none (a typo would quietly train fewer layers)."""
    if isinstance(target, str) or not target:  # one name, all-linear or a regular expression: PEFT checks it
        return
    names = [name for name, _ in model.named_modules()]
    unmatched = [t for t in target if not any(name == t or name.endswith(f".{t}") for name in names)]
    if unmatched:
        raise ModelLoadError(f"{config_key}.target_modules={list(target)!r} names {', '.join(map(repr, unmatched))}, "
                             f"which no layer of {type(model).__name__} has: LoRA would leave it out"
                             f"{_linear_names(model, unmatched)}")


def _is_linear(module: nn.Module) -> bool:
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, (nn.Linear, Conv1D))


def _all_linear(model: nn.Module) -> list[str]:
    """What ``target_modules=all-linear`` adapts here, as names PEFT matches: every linear (and GPT-2
    Conv1D) layer but the output head. A layer's last name component where no other kind of module
    shares it, else its full name.

    Not left to PEFT: on transformers 5 its own all-linear also picks the fused experts and the routers
    of MoE models (Mixtral, Qwen3-MoE: ``MixtralExperts`` holds every expert in one 3-D parameter),
    which are not linear layers, which :func:`merged_weights` cannot fold and which were then refused.
    Here those stay frozen (the attention, and a shared expert's linear layers, get the adapters) and
    the log says so."""
    head = model.get_output_embeddings()
    linear = {name: module for name, module in model.named_modules() if _is_linear(module) and module is not head}
    mixed = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name and name not in linear}
    names = sorted({name.rsplit(".", 1)[-1] if name.rsplit(".", 1)[-1] not in mixed else name for name in linear})
    stacked = sorted({type(module).__name__ for module in model.modules()
                      if not isinstance(module, nn.modules.conv._ConvNd)
                      and any(p.dim() >= 3 for p in module.parameters(recurse=False))})
    if stacked:
        logger.warning("LoRA target_modules=all-linear adapts the linear layers (%s); %s hold stacked (fused "
                       "expert) weights, not linear layers, and stay frozen", ", ".join(names[:8]), ", ".join(stacked))
    return names


def apply_lora(model: nn.Module, model_cfg, *, config_key: str = "actor_rollout_ref.model") -> nn.Module:
    """``model`` (a plain Hugging Face causal LM) with LoRA adapters, as a PEFT model.

    With ``lora_adapter_path`` the adapter saved there (``adapter_config.json`` +
    ``adapter_model.safetensors``, as :func:`save_adapter` or peft write it) is loaded, trainable,
    with its own rank, alpha and target modules; otherwise new adapters of ``lora_rank`` and
    ``lora_alpha`` go on ``target_modules`` ('all-linear' or a list of names) minus
    ``exclude_modules`` (a regex or a list of names; unset on a vision-language model: its vision
    tower, :data:`VISION_EXCLUDE`). Base weights are frozen either way.
    """
    try:
        from peft import LoraConfig, PeftModel, get_peft_model
    except ImportError:
        raise ModelLoadError(f"LoRA ({config_key}.lora_rank / lora_adapter_path) needs the peft package: "
                             f"pip install 'peft>=0.21.2' (or the verl[lora] extra)") from None

    if model_cfg.lora_adapter_path is not None:
        path = Path(model_cfg.lora_adapter_path).expanduser()
        if not (path / "adapter_config.json").is_file():
            raise ModelLoadError(f"{config_key}.lora_adapter_path={model_cfg.lora_adapter_path!r} is not a LoRA "
                                 f"adapter folder (no adapter_config.json in it)")
        with _quiet_peft():
            peft_model = PeftModel.from_pretrained(model, str(path), adapter_name=ADAPTER, is_trainable=True,
                                                   autocast_adapter_dtype=False)
    else:
        target = model_cfg.target_modules
        exclude = model_cfg.exclude_modules
        if exclude is None and vision_tower(model) is not None:
            exclude = VISION_EXCLUDE  # a vision-language model: adapters on its language model alone
        _check_targets(model, target, config_key)
        if isinstance(target, str) and target.lower() == "all-linear":
            target = _all_linear(model)
        config = LoraConfig(r=model_cfg.lora_rank, lora_alpha=model_cfg.lora_alpha, lora_dropout=0.0, bias="none",
                            task_type="CAUSAL_LM", target_modules=target if isinstance(target, str) else list(target),
                            exclude_modules=exclude if exclude is None or isinstance(exclude, str) else list(exclude))
        try:
            with _quiet_peft():
                peft_model = get_peft_model(model, config, adapter_name=ADAPTER, autocast_adapter_dtype=False)
        except ValueError as exc:  # no module matched target_modules, and the like
            raise ModelLoadError(f"LoRA ({config_key}.target_modules={target!r}, exclude_modules={exclude!r}) "
                                 f"could not be applied to {type(model).__name__}: {str(exc).rstrip('.')}"
                                 f"{_linear_names(model, target)}"
                                 ) from None
    _check_linear_only(peft_model, config_key)
    if model_cfg.enable_gradient_checkpointing:
        # Checkpointed blocks must see an input that requires grad, or the adapters inside them
        # get no gradient (the embeddings that feed them are frozen now).
        peft_model.enable_input_require_grads()
    return peft_model


def is_lora_model(model: nn.Module) -> bool:
    # Without peft imported no model can be a PEFT model: runs without LoRA need no peft installed.
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def adapters_disabled(model: nn.Module):
    """A context in which a LoRA model computes as its base model; for any other model, nothing."""
    return model.disable_adapter() if is_lora_model(model) else contextlib.nullcontext()


class BaseView(nn.Module):
    """The base model of LoRA ``model``, without a copy of its weights: every call runs ``model``
    with its adapters disabled, without gradients. The frozen reference of DPO and KTO with new
    adapters (whose zero-initialised B makes the base exactly the initial policy)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self._lora = [model]  # in a list: not a submodule, so its parameters are not counted twice

    def forward(self, *args, **kwargs):
        with torch.no_grad(), adapters_disabled(self._lora[0]):
            return self._lora[0](*args, **kwargs)


def plain_model(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a LoRA model (its adapted layers still wrapped); any other as is."""
    return model.get_base_model() if is_lora_model(model) else model


def plain_name(name: str) -> str:
    """A PEFT parameter or buffer name as the plain Hugging Face model has it."""
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def merged_weights(model: nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` (named as ``model``'s parameters or full state dict) under the plain model's names,
    LoRA merged in: ``W + scaling * B @ A`` for every adapted layer (computed in float32, stored in
    W's dtype; new tensors, W itself is untouched). Adapter tensors are left out. For a model
    without LoRA, ``weights`` comes back as it is."""
    if not is_lora_model(model):
        return weights
    return merge_adapters(weights, adapter_scalings(model))


def merge_adapters(weights: dict[str, torch.Tensor], scalings: dict[str, tuple[float, bool]]
                   ) -> dict[str, torch.Tensor]:
    """:func:`merged_weights` from a LoRA model's state dict (PEFT names) and its
    :func:`adapter_scalings` alone: what a rollout that holds no PEFT model merges with."""
    with torch.no_grad():
        out = {plain_name(name): tensor for name, tensor in weights.items() if ".lora_" not in name}
        for name, (scaling, transposed) in scalings.items():
            base = f"{plain_name(name)}.weight"
            a, b = weights[f"{name}.lora_A.{ADAPTER}.weight"], weights[f"{name}.lora_B.{ADAPTER}.weight"]
            delta = (b.to(device=out[base].device, dtype=torch.float32)
                     @ a.to(device=out[base].device, dtype=torch.float32)) * scaling
            if transposed:  # a Conv1D (GPT-2) weight is stored [in, out]
                delta = delta.T
            out[base] = (out[base].float() + delta).to(out[base].dtype)
    return out


def adapter_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of a LoRA model's full state dict (PEFT names)."""
    return {name: tensor for name, tensor in weights.items() if ".lora_" in name}


def save_adapter(model: nn.Module, weights: dict[str, torch.Tensor], target) -> None:
    """The adapter of LoRA ``model`` as a PEFT adapter folder at ``target`` (loadable with
    ``lora_adapter_path`` or ``PeftModel.from_pretrained``). ``weights``: its full state dict,
    gathered beforehand (a sharded model's own tensors are shards)."""
    model.save_pretrained(str(target), state_dict=adapter_weights(weights), safe_serialization=True)


def adapter_scalings(model: nn.Module) -> dict[str, tuple[float, bool]]:
    """PEFT module name -> (LoRA scaling: ``lora_alpha / r`` or the rsLoRA form, whether the base
    weight is stored transposed) of each adapted layer."""
    from peft.tuners.lora import LoraLayer

    return {name: (module.scaling[ADAPTER], module.fan_in_fan_out) for name, module in model.named_modules()
            if isinstance(module, LoraLayer) and ADAPTER in module.scaling}


@contextlib.contextmanager
def _quiet_peft():
    """peft reads transformers' deprecated ``is_gradient_checkpointing`` (a FutureWarning per model)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def _check_linear_only(model: nn.Module, config_key: str) -> None:
    from peft.tuners.lora import Linear, LoraLayer

    other = [f"{name} ({type(module.get_base_layer()).__name__})" for name, module in model.named_modules()
             if isinstance(module, LoraLayer) and not isinstance(module, Linear)]
    if other:
        raise ModelLoadError(f"LoRA adapts only linear layers here, and {config_key}.target_modules also picked "
                             f"{', '.join(other[:3])}: name linear layers only (or 'all-linear')")
