"""Runs inside vLLM's workers (``worker_extension_cls``): receives the actor's weights.

vLLM mixes this class into its worker class, so ``self`` is a vLLM worker. Kept free of verl
imports: vLLM may import it in a fresh worker process.
"""

from __future__ import annotations


class VerlWeightLoader:
    def verl_load_weights(self, weights) -> None:
        """Copy ``[(hf_parameter_name, tensor), ...]`` into the served model.

        vLLM's in-place reload treats them as a checkpoint: it maps Hugging Face names, fuses q/k/v
        and gate/up projections, skips tied embeddings and redoes any repacking its kernels need (the
        CPU build repacks linear weights after loading, so the model's plain ``load_weights`` cannot
        be called a second time there). vLLM versions without it fall back to ``load_weights``.
        """
        device = self.device if hasattr(self, "device") else None
        weights = ((name, tensor.to(device, non_blocking=True) if device is not None else tensor)
                   for name, tensor in weights)
        if hasattr(self, "reload_weights"):
            self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        else:
            self.model_runner.model.load_weights(weights=weights)
