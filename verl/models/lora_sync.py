"""LoRA weights for a rollout that holds a copy of its own (asynchronous RL), sent as adapters.

verl's ``actor_rollout_ref.model.lora.merge=false`` (its default): the trainer sends the rollout the
adapters alone, and the base weights once, with the first weights a fresh rollout gets. The rollout
keeps that base and merges each version's adapters into it with the trainer's own arithmetic
(:func:`verl.models.lora.merge_adapters`), so it generates with exactly the weights a merged sync
would give it, while a sync moves only the adapters' bytes (a rank-8 adapter on every linear layer
of Llama-2-7B: 40 MB in bfloat16, against 13.5 GB). ``lora.merge=true`` sends merged weights.

The message stays one flat state dict, so every backend of the checkpoint engine carries it as it
is: the adapted layers' scalings travel as small float64 tensors named under :data:`SCALING`.
"""

from __future__ import annotations

import torch
from torch import nn

from verl.errors import VerlError
from verl.models.lora import adapter_scalings, adapter_weights, merge_adapters

SCALING = "verl.lora_scaling:"
"""Name prefix of an adapted layer's ``[scaling, transposed]`` (its name holds ``.lora_``, as adapters' do)."""


def adapter_state(model: nn.Module, weights: dict[str, torch.Tensor], *, with_base: bool) -> dict[str, torch.Tensor]:
    """What the rollout gets of LoRA ``model``'s full state dict ``weights`` (PEFT names): its adapters
    and their scalings, and with ``with_base`` every other weight too."""
    scalings = {f"{SCALING}{name}": torch.tensor([scaling, float(transposed)], dtype=torch.float64)
                for name, (scaling, transposed) in adapter_scalings(model).items()}
    return {**(weights if with_base else adapter_weights(weights)), **scalings}


class AdapterMerger:
    """The rollout's side: :meth:`weights` turns each state it receives into the plain model's full
    weights, keeping the base of the last state that brought one."""

    def __init__(self):
        self.base: dict[str, torch.Tensor] | None = None

    def weights(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        scalings = {name.removeprefix(SCALING): (float(value[0]), bool(value[1]))
                    for name, value in state.items() if name.startswith(SCALING)}
        if not scalings:  # merged (or no LoRA): the weights themselves
            self.base = None
            return state
        base = {name: tensor for name, tensor in state.items() if ".lora_" not in name}
        if base:
            self.base = base
        elif self.base is None:
            raise VerlError("the rollout received LoRA adapters without the base weights they go on (the first "
                            "weights a rollout gets carry them); set actor_rollout_ref.model.lora.merge=true to send "
                            "merged weights instead")
        # merge_adapters reads each layer's adapters by name and leaves every ".lora_" name out of the weights.
        return merge_adapters({**self.base, **state}, scalings)
