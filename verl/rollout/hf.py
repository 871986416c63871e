"""Rollout with Hugging Face ``generate``: works for every causal LM, on CPU and GPU.

In the hybrid engine the rollout holds the actor's own module, so it always samples with the
current weights and is never synced; otherwise it holds a copy that :meth:`sync_weights` refreshes.

Sampling is seeded per row (:mod:`verl.rollout.seeding`): ``generate`` runs its greedy loop with a
logits processor that filters the logits (temperature, top-k, top-p), draws each row's token with
that row's seed and leaves only it standing, so the argmax picks it. ``generate``'s own sampler
would draw all rows from one random stream, and a row's response would depend on the batch.
With ``SamplingParams.logprobs`` the processor also records each drawn token's log-prob under the
filtered distribution; greedy log-probs come from the raw scores.
"""

from __future__ import annotations

import torch

from verl.rollout.base import RolloutEngine, SamplingParams, policy_eos
from verl.rollout.partial import join_generations
from verl.models.vision import forbid_placeholders, multimodal_kwargs, placeholder_ids
from verl.rollout.seeding import draw, filter_logits


def _sampled_log_probs(scores: tuple[torch.Tensor, ...], tokens: torch.Tensor) -> torch.Tensor:
    """Log-prob ``[B, T]`` of each generated token under the distribution ``generate`` sampled it
    from: ``scores`` are the logits after every processor (temperature, top-k, top-p), one
    ``[B, V]`` tensor per step. Holding them costs B x T x V floats per generate call."""
    steps = [torch.log_softmax(step.float(), dim=-1).gather(-1, tokens[:, t:t + 1])
             for t, step in enumerate(scores)]
    return torch.cat(steps, dim=1)


class _Forbid:
    """A logits processor: the vision-language model's image and video placeholders are never drawn
    (:func:`verl.models.vision.placeholder_ids`)."""

    def __init__(self, ids: list[int]):
        self.ids = ids

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return forbid_placeholders(scores, self.ids)


class _SeededDraw:
    """A logits processor that samples: each row's token is drawn with the row's own seed, and
    every other token's score is set to -inf so that generate's argmax takes the drawn one."""

    def __init__(self, params: SamplingParams, seeds: torch.Tensor, first_step: int = 0):
        self.params, self.seeds, self.first_step = params, seeds, first_step
        self.log_probs: list[torch.Tensor] = []  # [B] per decode step

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        p = self.params
        logits = filter_logits(scores, p.temperature, p.top_k, p.top_p)
        tokens, log_probs = draw(logits, self.seeds, self.first_step + len(self.log_probs))
        self.log_probs.append(log_probs)
        chosen = torch.full_like(scores, float("-inf"))
        return chosen.scatter_(-1, tokens.unsqueeze(-1), 0.0)


class _Pause:
    """A stopping criterion: every row stops once ``pause()`` says so (a partial rollout's weight swap)."""

    def __init__(self, pause):
        self.pause = pause

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), bool(self.pause()), dtype=torch.bool, device=input_ids.device)


class HFRollout(RolloutEngine):
    name = "hf"
    takes_images = True

    def __init__(self, model: torch.nn.Module, tokenizer, *, generation_batch_size: int | None = None,
                 device: torch.device | str | None = None, seed: int = 0, max_num_seqs: int | None = None):
        super().__init__(policy_eos(model, tokenizer), tokenizer.pad_token_id, seed)
        self.model = model
        # Prompts per generate call (their n samples each) and rows at once: waves of the smaller.
        self.generation_batch_size, self.max_num_seqs = generation_batch_size, max_num_seqs
        # Where inputs go: the compute device, which differs from the parameters' device when
        # they are offloaded to the CPU between uses.
        self.device = torch.device(device) if device is not None else next(model.parameters()).device

    def _generation_config(self, params: SamplingParams):
        from transformers import GenerationConfig

        # Every setting that shapes the distribution is given explicitly: ``generate`` fills unset
        # ones from the model's generation_config.json and then from its own defaults (top_k=50,
        # hub files add top_k/top_p/repetition_penalty), and the samples would no longer follow
        # SamplingParams. top_k=0 and top_p=1.0 are "off" to transformers.
        # Sampling too runs generate's greedy loop: the draw happens in _SeededDraw (module doc).
        return GenerationConfig(max_new_tokens=params.max_new_tokens, min_new_tokens=0,
                                eos_token_id=self.eos_token_ids, pad_token_id=self.pad_token_id,
                                num_return_sequences=1, num_beams=1, repetition_penalty=1.0, no_repeat_ngram_size=0,
                                do_sample=False)

    @torch.no_grad()
    def generate_responses(self, input_ids, attention_mask, params: SamplingParams, seeds, *, first_step: int = 0,
                           pause=None, media=None):
        """``first_step`` and ``pause``: as :meth:`verl.rollout.native.NativeRollout.generate_responses`;
        ``media``: each row's ``multi_modal_inputs`` (a vision-language model's images, or None)."""
        from transformers import LogitsProcessorList, StoppingCriteriaList

        device = self.device
        if not input_ids.shape[0]:  # no rows (a share of none): no responses, as the native engine gives
            return (input_ids.new_zeros((0, 0)).to(device),
                    torch.zeros((0, 0), device=device) if params.logprobs else None)
        config = self._generation_config(params)
        chunk = self.rows_at_once(params) or input_ids.shape[0]
        forbidden = placeholder_ids(self.model)
        was_training = self.model.training
        self.model.eval()
        try:
            outs, log_probs = [], []
            for start in range(0, input_ids.shape[0], chunk):
                ids = input_ids[start:start + chunk].to(device)
                mask = attention_mask[start:start + chunk].to(device)
                sampler = None if params.greedy else _SeededDraw(params, seeds[start:start + chunk], first_step)
                images = multimodal_kwargs(media[start:start + chunk] if media is not None else None, ids, self.model)
                processors = ([_Forbid(forbidden)] if forbidden else []) + ([sampler] if sampler else [])
                out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config, **images,
                                          logits_processor=LogitsProcessorList(processors),
                                          stopping_criteria=StoppingCriteriaList([_Pause(pause)] if pause else []),
                                          output_scores=params.logprobs and params.greedy,
                                          return_dict_in_generate=True)
                outs.append(out.sequences[:, ids.shape[1]:])
                if params.logprobs:
                    log_probs.append(_sampled_log_probs(out.scores, outs[-1]) if sampler is None
                                     else torch.stack(sampler.log_probs, dim=1)[:, :outs[-1].shape[1]])
        finally:
            self.model.train(was_training)
        return join_generations(list(zip(outs, log_probs if params.logprobs else [None] * len(outs))),
                                self.pad_token_id)

    def sync_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(weights)
