"""vLLM rollout (GPU only): fast sampling with vLLM's ``LLM`` engine, fed token ids, weights synced.

Construction checks for vLLM and CUDA first and names the fix without them (``rollout.name=hf``).

How it maps onto vLLM's offline API:

* the engine is built from the actor's model folder with ``skip_tokenizer_init``: prompts go in
  as token ids (left padding stripped) and responses come back as token ids, so vLLM never
  re-tokenizes and the trainer's tokenizer stays the only one;
* each row is one request with ``n=1``: the rollout interface has already repeated every prompt
  ``n`` times, and per-row requests keep rows and samples aligned;
* the actor's EOS ids are ``stop_token_ids``; a stopping EOS is kept in the response (the
  response mask ends on it, as with the Hugging Face engine);
* ``SamplingParams.logprobs`` asks vLLM for the sampled token's log-prob (``logprobs=0``) from the
  processed distribution (``logprobs_mode="processed_logprobs"``: after temperature, top-k and
  top-p, the distribution the token was drawn from), which is what ``rollout_log_probs`` means;
* ``sync_weights`` sends the actor's full state dict to vLLM's workers through
  ``LLM.collective_rpc`` and a worker extension (:mod:`verl.rollout.vllm_worker`) that calls the
  model's own ``load_weights`` (vLLM maps Hugging Face parameter names itself), then drops the
  prefix cache, whose entries were computed with the old weights;
* with ``tensor_model_parallel_size=1`` the engine runs in this process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so weights are handed over by reference, not copied
  through a pipe.

This module has been exercised only against a stand-in for vLLM's API (tests/unit/test_rollout_vllm.py):
no machine this project's CI or developers use has both vLLM and a GPU.
"""

from __future__ import annotations

import importlib.util
import logging
import os

import torch
import torch.nn.functional as F

from verl.errors import VerlError
from verl.rollout.base import RolloutEngine, SamplingParams

logger = logging.getLogger(__name__)

WORKER_EXTENSION = "verl.rollout.vllm_worker.VerlWeightLoader"


def check_vllm_available() -> None:
    """Raise a :class:`VerlError` naming the fix when vLLM cannot run here."""
    missing = []
    if importlib.util.find_spec("vllm") is None:
        missing.append("the vllm package is not installed (pip install 'verl[vllm]')")
    if not torch.cuda.is_available():
        missing.append("no CUDA GPU is visible")
    if missing:
        raise VerlError("rollout name 'vllm' cannot run here: " + "; ".join(missing) +
                        ". Use the Hugging Face engine instead: actor_rollout_ref.rollout.name=hf")


class VLLMRollout(RolloutEngine):
    name = "vllm"

    def __init__(self, model_path: str, tokenizer, *, eos_token_id, tensor_model_parallel_size: int = 1,
                 dtype: str = "bfloat16", gpu_memory_utilization: float = 0.5, max_num_seqs: int = 256,
                 max_model_len: int | None = None, seed: int = 0, trust_remote_code: bool = False):
        check_vllm_available()
        super().__init__(eos_token_id, tokenizer.pad_token_id, seed)
        if tensor_model_parallel_size == 1:
            # One GPU: run the engine in this process, so weight syncs pass tensors by reference.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import vllm

        self._vllm = vllm
        kwargs = dict(model=model_path, skip_tokenizer_init=True, dtype=dtype,
                      tensor_parallel_size=tensor_model_parallel_size, gpu_memory_utilization=gpu_memory_utilization,
                      max_num_seqs=max_num_seqs, max_model_len=max_model_len, seed=seed,
                      trust_remote_code=trust_remote_code, worker_extension_cls=WORKER_EXTENSION)
        try:
            self.llm = vllm.LLM(**kwargs, logprobs_mode="processed_logprobs")
            self.processed_logprobs = True
        except TypeError as e:  # vLLM before 0.10.2 has no logprobs_mode: its log-probs are the raw model's
            if "logprobs_mode" not in str(e):
                raise
            self.llm = vllm.LLM(**kwargs)
            self.processed_logprobs = False

    def _sampling_params(self, params: SamplingParams, seed: int):
        greedy = params.greedy
        # A seed per request: vLLM then draws that request's tokens from its own generator.
        return self._vllm.SamplingParams(
            n=1, max_tokens=params.max_new_tokens, temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p, top_k=-1 if greedy or params.top_k <= 0 else params.top_k,
            stop_token_ids=list(self.eos_token_ids), logprobs=0 if params.logprobs else None, detokenize=False,
            seed=None if greedy else seed)

    @torch.no_grad()
    def generate_responses(self, input_ids, attention_mask, params: SamplingParams, seeds):
        if params.logprobs and not self.processed_logprobs and not params.greedy:
            raise VerlError("this vLLM version reports log-probs before temperature/top-k/top-p, not those of the "
                            "distribution it samples from; upgrade vLLM (>= 0.10.2) or set "
                            "actor_rollout_ref.rollout.calculate_log_probs=false")
        mask = attention_mask.bool()
        requests = [{"prompt_token_ids": ids[keep].tolist()} for ids, keep in zip(input_ids, mask)]
        sampling = [self._sampling_params(params, int(seed)) for seed in seeds]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        rows, log_probs = [], []
        for output in outputs:
            sample = output.outputs[0]
            tokens = list(sample.token_ids)
            # A stop token id ends the request; make sure it is in the response, as EOS is.
            if isinstance(sample.stop_reason, int) and (not tokens or tokens[-1] != sample.stop_reason):
                tokens.append(sample.stop_reason)
            rows.append(torch.tensor(tokens, dtype=torch.long))
            if params.logprobs:
                steps = sample.logprobs or []
                values = [steps[t][token].logprob if t < len(steps) else 0.0 for t, token in enumerate(tokens)]
                log_probs.append(torch.tensor(values, dtype=torch.float32))
        width = max((len(r) for r in rows), default=0)
        responses = torch.stack([F.pad(r, (0, width - len(r)), value=self.pad_token_id) for r in rows])
        if not params.logprobs:
            return responses, None
        return responses, torch.stack([F.pad(lp, (0, width - len(lp))) for lp in log_probs])

    def sync_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load the actor's full state dict into the engine."""
        self.llm.collective_rpc("verl_load_weights", args=(list(weights.items()),))
        self.llm.reset_prefix_cache()
        logger.info("vLLM rollout: loaded %d tensors from the actor", len(weights))
