"""A rollout that runs no model: random responses, for checking the wiring of a pipeline.

Every response has the full ``max_new_tokens`` length and ends with EOS; its tokens are drawn with
the row's own seed (:mod:`verl.rollout.seeding`), so two runs, and any split of a batch, see the
same tokens.
"""

from __future__ import annotations

import math

import torch

from verl.rollout.base import RolloutEngine, SamplingParams
from verl.rollout.seeding import mix


class DummyRollout(RolloutEngine):
    name = "dummy"

    def __init__(self, vocab_size: int, eos_token_id: int | list[int], pad_token_id: int, seed: int = 0):
        super().__init__(eos_token_id, pad_token_id, seed)
        self.vocab_size = vocab_size

    def generate_responses(self, input_ids, attention_mask, params: SamplingParams, seeds):
        special = set(self.eos_token_ids) | {self.pad_token_id}
        allowed = torch.tensor([t for t in range(self.vocab_size) if t not in special])
        steps = torch.arange(params.max_new_tokens)
        picks = (mix(seeds.unsqueeze(1), steps.unsqueeze(0)) % len(allowed))
        responses = allowed[picks]
        responses[:, -1] = self.eos_token_ids[0]
        log_probs = None
        if params.logprobs:
            # Its own sampling distribution: uniform over the allowed tokens, then a certain EOS.
            log_probs = torch.full(responses.shape, -math.log(len(allowed)))
            log_probs[:, -1] = 0.0
            log_probs = log_probs.to(input_ids.device)
        return responses.to(input_ids.device), log_probs


NO_ROLLOUT = "none"
"""The engine of a trainer that generates nothing itself (not a ``rollout.name`` a user picks)."""


class NoRollout(RolloutEngine):
    """No engine: the trainer of an asynchronous run whose rollout also validates
    (``async_training.use_trainer_do_validate=false``) generates nothing, so it holds no engine (on a
    GPU, no second copy of the weights and no KV cache). It keeps what the trainer reads of an engine
    (the EOS and pad ids); asking it to generate is a bug, said as one."""

    name = NO_ROLLOUT

    def generate_responses(self, input_ids, attention_mask, params: SamplingParams, seeds):
        raise RuntimeError("this trainer holds no rollout engine: its samples and its validation come from the "
                           "asynchronous rollout (async_training.use_trainer_do_validate=false), so nothing here "
                           "should ask it to generate")
