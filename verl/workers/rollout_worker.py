"""``RolloutWorker``: a rollout engine with its own copy of the policy, apart from the trainer.

Asynchronous RL (docs/async.md) runs it in a process (or a thread) of its own: it generates the
next steps' samples while the trainer updates, and takes the trainer's weights only when they are
handed to it (:meth:`load_weights`), each with its policy version. Every response it returns is
stamped with that version, and carries the engine's log-probs when asked.
"""

from __future__ import annotations

import torch

from verl.models.loading import resolve_device
from verl.models.lora_sync import AdapterMerger
from verl.protocol import Batch
from verl.rollout import SamplingParams
from verl.utils.preflight import check_context_length
from verl.workers.actor_rollout_ref import (agent_loop_of, describe_policy_model, load_policy_model,
                                            load_policy_tokenizer, make_rollout, policy_folder, rollout_engine_name)


class RolloutWorker:
    """``config``: the ``actor_rollout_ref`` section (the model, the rollout engine and its sampling)."""

    def __init__(self, config, *, device=None, max_response_length: int | None = None, seed: int = 1):
        self.config = config
        self.device = resolve_device(device or "auto")
        self.max_response_length = max_response_length or config.rollout.response_length
        model_cfg, rollout_cfg = config.model, config.rollout
        path = policy_folder(model_cfg)
        # A tokenizer of its own: a fast tokenizer is not safe to share with a thread that also uses it.
        self.tokenizer = load_policy_tokenizer(model_cfg, path)
        described = describe_policy_model(model_cfg, path)
        engine = rollout_engine_name(rollout_cfg, described)
        if engine not in ("hf", "native", "vllm"):
            raise ValueError(f"asynchronous RL runs the rollout with hf, native or vllm (got {engine})")
        # vLLM loads the folder into an engine of its own: a torch copy here would only hold host memory
        if engine == "vllm":
            model = described
        else:
            model = load_policy_model(model_cfg, path).requires_grad_(False).to(self.device)
        self.rollout = make_rollout(config, engine, model, self.tokenizer, path, device=self.device, seed=seed,
                                    max_response_length=self.max_response_length)
        self.model_config = model.config
        self.agent_loop = agent_loop_of(rollout_cfg.multi_turn, self.rollout, self.tokenizer, self.device)
        self.version: int | None = None
        """The policy version of the weights held (None: the folder's, before any sync)."""
        self.adapters = AdapterMerger()

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Generate with ``state`` from now on: full weights, or LoRA adapters (merged here into the base
        weights a first state brought: :mod:`verl.models.lora_sync`)."""
        self.rollout.sync_weights(self.adapters.weights(state))
        self.version = version

    def generate_sequences(self, prompts: Batch, params: SamplingParams, swap=None) -> Batch:
        """Prompts -> prompts x n with responses, as ``ActorRolloutRefWorker.generate_sequences``, and
        ``policy_version_first`` / ``policy_version_last`` on every row: the version that drew its first
        and its last token. They differ only with ``swap`` (:mod:`verl.rollout.partial`), where weights
        that arrive mid-generation are taken at once."""
        self.check_length(prompts, params)
        generate = self.agent_loop.generate if self.agent_loop is not None else self.rollout.generate
        if swap is not None and swap.pending():
            swap.apply()  # weights that came before the request: every row starts on them
        first = -1 if self.version is None else self.version
        with torch.no_grad():
            out = generate(prompts.to(self.device), params, swap=swap)
        out["policy_version_first"] = torch.full((len(out),), first, dtype=torch.long)
        if "policy_version_last" not in out:
            out["policy_version_last"] = out["policy_version_first"].clone()
        return out

    def check_length(self, prompts: Batch, params: SamplingParams) -> None:
        check_context_length(self.model_config, prompts["input_ids"].shape[1], params.max_new_tokens)

    # ------------------------------------------------------------------ rows that come and go
    def takes_rows(self, prompts: Batch | None = None, params: SamplingParams | None = None) -> bool:
        """Whether rows (of ``prompts``, sampled with ``params``) can go through a
        :class:`~verl.rollout.row_decoder.RowDecoder` beside those of other requests (continuous batching across
        requests, :mod:`verl.distributed.rollout_rows`): not with a multi-turn agent loop, images, an engine other
        than native, or a model the native engine runs through its own forward."""
        from verl.models.vision import images_of
        from verl.rollout.native import NativeRollout

        if self.agent_loop is not None or not isinstance(self.rollout, NativeRollout):
            return False
        if prompts is None:
            return self.rollout.takes_rows(None)
        if images_of(prompts) is not None:
            return False
        return self.rollout.takes_rows(prompts["input_ids"].shape[1] + params.max_new_tokens)

    def row_decoder(self, prompts: Batch, params: SamplingParams):
        """An empty decoder for rows sampled with ``params`` (:meth:`takes_rows` said yes for ``prompts``); it
        reads the weights held now."""
        self.rollout.model.eval()
        return self.rollout.row_decoder(params, prompts["input_ids"].shape[1] + params.max_new_tokens)

    def rows_of(self, prompts: Batch, params: SamplingParams) -> tuple[Batch, torch.Tensor]:
        """The rows of a request (prompts x n, on this worker's device) and their sampling seeds."""
        self.check_length(prompts, params)
        return self.rollout.sample_rows(prompts.to(self.device), params)

    def finish(self, rows: Batch, responses: torch.Tensor, log_probs: torch.Tensor | None, params: SamplingParams,
               first: torch.Tensor, last: torch.Tensor) -> Batch:
        """What :meth:`generate_sequences` returns for ``rows`` generated row by row: ``first`` / ``last``, the
        policy version that drew each row's first and last token."""
        out = self.rollout.finish(rows, responses, params, log_probs if params.logprobs else None)
        out["policy_version_first"], out["policy_version_last"] = first, last
        return out
