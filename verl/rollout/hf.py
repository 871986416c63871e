"""Rollout with Hugging Face ``generate``: works for every causal LM, on CPU and GPU.

In the hybrid engine the rollout holds the actor's own module, so it always samples with the
current weights and :meth:`sync_weights` has nothing to do.
"""

from __future__ import annotations

import torch

from verl.rollout.base import RolloutEngine, SamplingParams


class HFRollout(RolloutEngine):
    name = "hf"

    def __init__(self, model: torch.nn.Module, tokenizer, *, generation_batch_size: int | None = None,
                 device: torch.device | str | None = None):
        eos = model.generation_config.eos_token_id if model.generation_config.eos_token_id is not None \
            else tokenizer.eos_token_id
        super().__init__(eos, tokenizer.pad_token_id)
        self.model = model
        self.generation_batch_size = generation_batch_size
        # Where inputs go: the compute device, which differs from the parameters' device when
        # they are offloaded to the CPU between uses.
        self.device = torch.device(device) if device is not None else next(model.parameters()).device

    def _generation_config(self, params: SamplingParams):
        from transformers import GenerationConfig

        kwargs = dict(max_new_tokens=params.max_new_tokens, eos_token_id=self.eos_token_ids,
                      pad_token_id=self.pad_token_id, num_return_sequences=1)
        if params.greedy:
            return GenerationConfig(do_sample=False, **kwargs)
        return GenerationConfig(do_sample=True, temperature=params.temperature,
                                top_p=params.top_p if params.top_p < 1.0 else None,
                                top_k=params.top_k if params.top_k > 0 else None, **kwargs)

    @torch.no_grad()
    def generate_responses(self, input_ids, attention_mask, params: SamplingParams) -> torch.Tensor:
        device = self.device
        config = self._generation_config(params)
        chunk = self.generation_batch_size or input_ids.shape[0]
        was_training = self.model.training
        self.model.eval()
        try:
            outs = []
            for start in range(0, input_ids.shape[0], chunk):
                ids = input_ids[start:start + chunk].to(device)
                mask = attention_mask[start:start + chunk].to(device)
                seq = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
                outs.append(seq[:, ids.shape[1]:])
        finally:
            self.model.train(was_training)
        width = max(o.shape[1] for o in outs)
        return torch.cat([torch.nn.functional.pad(o, (0, width - o.shape[1]), value=self.pad_token_id)
                          for o in outs])

    def sync_weights(self, model: torch.nn.Module) -> None:
        if model is not self.model:  # a separate copy (hybrid_engine=false): refresh it
            self.model.load_state_dict(model.state_dict())
