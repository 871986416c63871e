"""Runs inside vLLM's workers (``worker_extension_cls``): receives the actor's weights.

vLLM mixes this class into its worker class, so ``self`` is a vLLM worker and ``self.model_runner.model``
the model it serves. Kept free of verl imports: vLLM may import it in a fresh worker process.
"""

from __future__ import annotations


class VerlWeightLoader:
    def verl_load_weights(self, weights) -> None:
        """Copy ``[(hf_parameter_name, tensor), ...]`` into the served model (vLLM maps the names,
        fuses q/k/v and gate/up projections, and skips tied embeddings)."""
        model = self.model_runner.model
        device = next(model.parameters()).device
        model.load_weights(weights=((name, tensor.to(device, non_blocking=True)) for name, tensor in weights))
