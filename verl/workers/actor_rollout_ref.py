"""``ActorRolloutRefWorker``: the policy, its rollout engine and the frozen reference, in one role.

In the hybrid engine (default) the rollout generates with the actor's own module, so every
rollout sees the latest weights without copying them. The reference is a frozen copy of the
initial policy, built when a KL term needs it; with LoRA it is the actor itself with its
adapters switched off (no second copy of the weights), and the rollout gets the actor's weights
with the adapters merged in (:mod:`verl.models.lora`).
"""

from __future__ import annotations

import contextlib
import copy
import logging

import torch

from verl.algorithms import truncated_responses
from verl.config.cross_checks import log_prob_token_budget
from verl.distributed.fsdp import export_hf, full_parameters, full_state_dict, gathered, parallelize, shadow_of
from verl.distributed.process_group import world_size
from verl.errors import VerlError
from verl.models.loading import (describe_causal_lm, load_causal_lm, load_tokenizer, refuse_ids_outside,
                                 resolve_device)
from verl.models.lora import (adapters_disabled, apply_lora, is_lora_model, lora_requested, merged_weights,
                              vision_tower)
from verl.models.tiny import builtin_model_path
from verl.models.vision import is_vision_model, load_processor
from verl.protocol import Batch, model_columns
from verl.rollout import NO_ROLLOUT, SamplingParams, auto_engine, build_rollout
from verl.utils.keywords import hint_keywords
from verl.utils.memory import memory_metrics
from verl.utils.preflight import check_context_length
from verl.workers.actor import Actor, PolicyModel

logger = logging.getLogger(__name__)


def worker_section(config):
    """The ``actor_rollout_ref`` section a worker reads, from what a user may hand it: the section
    itself (the tutorial's ``config.actor_rollout_ref``), the whole ``TrainerConfig`` (its section, still
    in its tree), or the section's keys as a dict or an OmegaConf ``DictConfig`` (what verl's workers
    take), checked key by key. Another section is refused naming what it is and what to pass."""
    from collections.abc import Mapping

    from omegaconf import DictConfig, OmegaConf

    from verl.config import ConfigNode, TrainerConfig
    from verl.config.schema_actor import ActorRolloutRefConfig
    from verl.errors import ConfigError

    if isinstance(config, ActorRolloutRefConfig):
        return config
    if isinstance(config, TrainerConfig):
        return config.actor_rollout_ref
    if isinstance(config, DictConfig):  # verl's workers are built from OmegaConf sections
        config = OmegaConf.to_container(config, resolve=True)
    if isinstance(config, Mapping):
        return ActorRolloutRefConfig.from_dict(config)
    what = f"the {config._path() or type(config).__name__} section" if isinstance(config, ConfigNode) \
        else f"a {type(config).__name__}"
    raise ConfigError(f"ActorRolloutRefWorker(config=...) takes the actor_rollout_ref section, got {what}; pass "
                      f"config=cfg.actor_rollout_ref (cfg a TrainerConfig), or a dict of its keys (model, actor, "
                      f"rollout, ref)")


class ActorRolloutRefWorker:
    """Holds ``actor_model`` (a Hugging Face causal LM), ``rollout`` and ``ref_model``.

    Methods take and return :class:`~verl.protocol.Batch`: :meth:`generate_sequences`,
    :meth:`compute_log_prob`, :meth:`compute_ref_log_prob`, :meth:`update_actor`.

    It reads its own section only (``config`` is ``TrainerConfig.actor_rollout_ref``; the whole
    ``TrainerConfig``, or a dict or ``DictConfig`` of the section's keys, are taken too:
    :func:`worker_section`); the rest is passed in: ``device`` (default ``auto``; the trainer passes ``trainer.device``), ``seed``
    (default 1; the trainer passes ``trainer.seed``), ``max_response_length`` (default
    ``rollout.response_length``, which follows ``data.max_response_length`` inside a TrainerConfig),
    ``rollout_correction`` (verl's ``algorithm.rollout_correction`` as a
    :class:`~verl.algorithms.rollout_correction.RolloutCorrection`; default: token-level TIS as the
    actor section asks, nothing more), ``generates`` (False: no rollout engine, for the trainer of an
    asynchronous run whose rollout also validates).
    """

    @hint_keywords
    def __init__(self, config, *, tokenizer=None, with_ref: bool = True, device=None,
                 max_response_length: int | None = None, total_steps: int | None = None, seed: int | None = None,
                 rollout_correction=None, generates: bool = True):
        self.config = config = worker_section(config)
        # Everything comes from this section or the arguments: the rollout's prompt_length and
        # response_length follow data.max_prompt_length / max_response_length inside a TrainerConfig.
        self.device = resolve_device(device or "auto")
        # Where rollout outputs go: checked before any model loads (a typo or a missing GPU is one line).
        self.rollout_device = resolve_device(config.rollout.device, key="actor_rollout_ref.rollout.device",
                                             instead="or leave it unset (the actor's device)") \
            if config.rollout.device else self.device
        self.max_response_length = max_response_length or config.rollout.response_length
        seed = seed if seed is not None else 1
        model_cfg = config.model
        path = policy_folder(model_cfg)
        self.model_path = path
        self.tokenizer = tokenizer or load_policy_tokenizer(model_cfg, path)
        model = load_policy_model(model_cfg, path)
        # A vision-language policy's export holds its image processor with the tokenizer.
        self.processor = load_processor(model_cfg.tokenizer_path or path) if is_vision_model(model) else None
        if model_cfg.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable()
        lora = lora_requested(model_cfg)
        ref_model = copy.deepcopy(model).requires_grad_(False) if with_ref and not lora else None
        # hf and native in the hybrid engine decode with an empty twin of the actor that is given
        # the actor's gathered weights for each rollout (fsdp.gathered). vllm, and hf or native
        # without the hybrid engine, hold a copy of the weights, synced now and after every update
        # (hf and native: a copy of the model made here, before the actor is sharded). vllm and
        # dummy only read the model's config.
        # rollout.name=auto: main_ppo has resolved it (and said so); the Python API resolves it here.
        # generates=False: an asynchronous run's trainer whose rollout also validates holds no engine at all.
        engine = rollout_engine_name(config.rollout, model) if generates else NO_ROLLOUT
        self.rollout_shares_actor = config.hybrid_engine and engine in ("hf", "native")
        self.rollout_holds_copy = engine in ("hf", "native", "vllm") and not self.rollout_shares_actor
        rollout_model = model
        if self.rollout_shares_actor:
            rollout_model = shadow_of(model)
        elif engine in ("hf", "native"):
            rollout_model = copy.deepcopy(model).requires_grad_(False).to(self.device)
        # The rollout models above are plain copies of the base (before the adapters go on): they get
        # merged weights at every sync.
        if lora:
            model = apply_lora(model, model_cfg)
        if config.actor.freeze_vision_tower:
            freeze_vision_tower(model)

        actor_cfg, rollout_cfg = config.actor, config.rollout
        # Sharded here, from outside the roles, each by its own fsdp_config section.
        model = parallelize(model, actor_cfg.fsdp_config, device=self.device)
        if ref_model is not None:
            ref_model = parallelize(ref_model, config.ref.fsdp_config, device=self.device)
        if with_ref and lora:
            ref_model = model  # scored under adapters_disabled: the base weights
        # The longest sequence of the run: prompt + response (a sliding-window model shares prompts within it).
        max_length = rollout_cfg.prompt_length + self.max_response_length if rollout_cfg.prompt_length else None
        # Each data-parallel rank trains on its share of every mini-batch (the config checks that it divides).
        self.actor = Actor(model, actor_cfg, self.device,
                           samples_per_mini_batch=actor_cfg.ppo_mini_batch_size * rollout_cfg.n // world_size(),
                           total_steps=total_steps,
                           log_prob_micro_batch_size=rollout_cfg.log_prob_micro_batch_size_per_gpu,
                           log_prob_max_token_len=log_prob_token_budget(config, "rollout"),
                           remove_padding=model_cfg.use_remove_padding, seed=seed, norm_len=self.max_response_length,
                           rollout_correction=rollout_correction, share_prompts=actor_cfg.use_prefix_grouper,
                           max_length=max_length)
        self.ref = PolicyModel(ref_model, self.device, config.ref.log_prob_micro_batch_size_per_gpu,
                               max_token_len=log_prob_token_budget(config, "ref"),
                               remove_padding=model_cfg.use_remove_padding,
                               share_prompts=actor_cfg.use_prefix_grouper,
                               max_length=max_length) if ref_model is not None else None
        self.rollout = make_rollout(config, engine, rollout_model, self.tokenizer, path, device=self.device,
                                    seed=seed, max_response_length=self.max_response_length)
        self.sync_rollout_weights()
        self.agent_loop = agent_loop_of(rollout_cfg.multi_turn, self.rollout, self.tokenizer, self.device) \
            if generates else None
        logger.info("ActorRolloutRefWorker: model %s (%s parameters) on %s, rollout=%s, reference=%s, "
                    "shared prompts=%s", path, f"{sum(p.numel() for p in model.parameters()):,}", self.device,
                    engine, "yes" if self.ref else "no", "yes" if self.actor.share_prompts else "no")

    @property
    def actor_model(self) -> torch.nn.Module:
        return self.actor.model

    @property
    def ref_model(self) -> torch.nn.Module | None:
        return self.ref.model if self.ref else None

    # ---------------------------------------------------------------- for the controller (group.call)
    def pad_token_id(self) -> int:
        return self.tokenizer.pad_token_id

    def decode(self, responses: torch.Tensor) -> list[str]:
        """Response token ids ``[B, T_resp]`` -> texts (special tokens dropped)."""
        return self.tokenizer.batch_decode(responses, skip_special_tokens=True)

    def state_dict(self) -> dict:
        """The actor's full training state (a collective under data parallelism: every rank calls it)."""
        return self.actor.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore the actor from :meth:`state_dict`; the rollout then generates with those weights."""
        self.actor.load_state_dict(state)
        self.sync_rollout_weights()

    def sync_rollout_weights(self) -> None:
        """Give the rollout engine the actor's current weights, where it holds a copy of its own
        (a collective under FSDP: every rank calls it)."""
        if self.rollout_holds_copy:
            self.rollout.sync_weights(self.rollout_weights())

    def rollout_weights(self, lora: str = "merged") -> dict[str, torch.Tensor]:
        """What a rollout's copy of the policy loads (a collective under FSDP: every rank calls it): the
        actor's full weights, LoRA adapters merged in; of a LoRA model, with ``lora="adapters"`` its
        adapters alone, with ``"adapters+base"`` also the base weights (:mod:`verl.models.lora_sync`)."""
        model = self.actor.model
        if lora == "merged" or not is_lora_model(model):
            return merged_weights(model, full_state_dict(model, every_rank=True))
        from verl.models.lora_sync import adapter_state

        if lora == "adapters":  # the adapters alone are gathered, not the whole model
            return adapter_state(model, full_parameters(model, lambda name: ".lora_" in name), with_base=False)
        return adapter_state(model, full_state_dict(model, every_rank=True), with_base=True)

    def export_hf(self, target) -> None:
        """The policy and tokenizer as a Hugging Face folder at ``target``, written by rank 0 (every
        rank must call this: gathering the sharded weights is a collective)."""
        export_hf(self.actor.model, self.processor or self.tokenizer, target)

    def sampling_params(self, validate: bool = False) -> SamplingParams:
        """Training sampling (with the engine's log-probs when asked for), or validation sampling."""
        cfg = self.config.rollout
        src = cfg.val_kwargs if validate else cfg
        logprobs = not validate and (cfg.calculate_log_probs or self.config.actor.rollout_is_correction)
        return SamplingParams(max_new_tokens=self.max_response_length, n=src.n, temperature=src.temperature,
                              top_p=src.top_p, top_k=src.top_k, do_sample=src.do_sample, logprobs=logprobs)

    def generate_sequences(self, prompts: Batch, params: SamplingParams | None = None) -> Batch:
        """Prompts -> prompts x n with ``responses``, ``response_mask`` and the full sequences."""
        prompts = need_batch(prompts, "generate_sequences", self.actor_model.config)
        need_left_padded(prompts)
        params = params or self.sampling_params()
        check_context_length(self.actor_model.config, prompts["input_ids"].shape[1], params.max_new_tokens)
        # Decoding with the actor's weights: gathered once for the whole rollout, never per token.
        generate = self.agent_loop.generate if self.agent_loop is not None else self.rollout.generate
        with gathered(self.actor_model, self.rollout.model) if self.rollout_shares_actor else contextlib.nullcontext():
            out = generate(prompts.to(self.device), params)
        return out.to(self.rollout_device) if self.rollout_device != self.device else out

    def compute_log_prob(self, batch: Batch) -> Batch:
        """``old_log_probs`` and ``entropys`` under the current policy; with
        ``actor.calculate_sum_pi_squared`` also ``sum_pi_squared`` (the optimal token baseline reads it)."""
        batch = need_batch(batch, "compute_log_prob", self.actor_model.config)
        if self.config.actor.calculate_sum_pi_squared:
            log_prob, entropy, spp = self.actor.compute_log_prob(batch, with_entropy=True, with_sum_pi_squared=True)
            return Batch({"old_log_probs": log_prob, "entropys": entropy, "sum_pi_squared": spp})
        log_prob, entropy = self.actor.compute_log_prob(batch, with_entropy=True)
        return Batch({"old_log_probs": log_prob, "entropys": entropy})

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """``ref_log_prob`` under the frozen reference policy (with LoRA: the actor's base weights)."""
        batch = need_batch(batch, "compute_ref_log_prob", self.actor_model.config)
        if self.ref is None:
            raise RuntimeError("this worker was built without a reference model (with_ref=False)")
        with adapters_disabled(self.ref.model):
            log_prob, _ = self.ref.compute_log_prob(batch)
        return Batch({"ref_log_prob": log_prob})

    def update_actor(self, batch: Batch, *, loss_fn=None, mini_batch_size: int | None = None,
                     micro_batch_size: int | None = None, epochs: int | None = None) -> dict[str, float]:
        """PPO update of the actor on ``batch``, then the rollout sees the new weights.

        With ``actor.mask_truncated_responses`` (DAPO overlong filtering) responses cut off at
        the length limit are left out of the loss: their ``response_mask`` is 0 here.
        ``loss_fn``, ``mini_batch_size``, ``micro_batch_size`` (else ``actor.ppo_micro_batch_size_per_gpu``)
        and ``epochs`` override the configured values for this call (:meth:`Actor.update`).
        """
        batch = need_batch(batch, "update_actor", self.actor_model.config)
        metrics = {}
        if self.config.actor.mask_truncated_responses:
            truncated = truncated_responses(batch["responses"], batch["response_mask"], self.rollout.eos_token_ids)
            keep = (~truncated).unsqueeze(-1).to(batch["response_mask"].dtype)
            batch = Batch({**batch.tensors, "response_mask": batch["response_mask"] * keep}, batch.non_tensors,
                          batch.meta)
            metrics["actor/truncated_masked_ratio"] = truncated.float().mean().item()
        metrics.update(self.actor.update(batch, loss_fn=loss_fn, mini_batch_size=mini_batch_size, epochs=epochs,
                                         micro_batch_size=micro_batch_size or
                                         self.config.actor.ppo_micro_batch_size_per_gpu))
        self.sync_rollout_weights()
        metrics.update(memory_metrics(self.device))
        return metrics


def freeze_vision_tower(model) -> None:
    """``actor.freeze_vision_tower``: the vision tower's weights take no gradient (a text model has no
    tower: said, nothing changes)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    tower = vision_tower(base)
    if tower is None:
        logger.warning("actor_rollout_ref.actor.freeze_vision_tower=true: %s has no vision tower; nothing to freeze",
                       type(base).__name__)
        return
    tower.requires_grad_(False)


def policy_folder(model_cfg) -> str:
    """The policy's model folder or hub id (``model.path``; the built-in tiny model when unset)."""
    return str(model_cfg.path) if model_cfg.path else str(builtin_model_path())


def need_batch(value, method: str, model_config=None) -> Batch:
    """The worker's methods take a :class:`Batch`; a dict (a tokenizer's output, the tutorial's step batch)
    failed with "'dict' object has no attribute 'to'" or a KeyError deep inside. With ``model_config``, its
    ``input_ids`` must be ids the model embeds: ids of another tokenizer failed with "index out of range in
    self" inside the model. Returns the batch with the columns a model reads typed (:func:`model_columns`)."""
    if not isinstance(value, Batch):
        raise VerlError(f"ActorRolloutRefWorker.{method} takes a verl.protocol.Batch, got {type(value).__name__}: "
                        f"wrap the tensors, Batch({{'input_ids': ..., 'attention_mask': ..., ...}}) (prompts padded "
                        f"on the left, with position_ids); PPOTrainer.step is the call that takes a plain dict")
    value = model_columns(value, f"ActorRolloutRefWorker.{method}")  # int32 ids as int64, numpy columns as tensors
    if model_config is not None and "input_ids" in value:
        refuse_ids_outside(value["input_ids"], model_config.get_text_config().vocab_size,
                           f"ActorRolloutRefWorker.{method}: ")
    return value


def need_left_padded(prompts: Batch) -> None:
    """Prompts to generate from end where the response begins: padded on the left. A tokenizer's own default
    is often the right (``AutoTokenizer``'s for Qwen2, GPT-2), and such a row was decoded on after its pad
    tokens without a word said; a prompt without its ``attention_mask`` failed with a KeyError in the engine."""
    missing = [key for key in ("input_ids", "attention_mask") if key not in prompts]
    if missing:
        raise VerlError(f"ActorRolloutRefWorker.generate_sequences: the prompts lack {missing}; give the tokenizer's "
                        f"input_ids and attention_mask [B, T_prompt], padded on the left")
    mask = prompts["attention_mask"]
    if mask.dim() == 2 and mask.shape[1] > 1:
        right = (mask[:, 1:] < mask[:, :-1]).any(dim=1).nonzero()
        if len(right):
            row = int(right[0])
            raise VerlError(f"ActorRolloutRefWorker.generate_sequences: prompt row {row} is padded on the right "
                            f"(attention_mask {mask[row].tolist()!s:.80}), so the response would follow its pad "
                            f"tokens; pad prompts on the left: tokenizer.padding_side = 'left' before tokenizing "
                            f"(verl.utils.model.load_hf_tokenizer and worker.tokenizer are set so)")


def load_policy_tokenizer(model_cfg, path: str):
    return load_tokenizer(model_cfg.tokenizer_path or path, trust_remote_code=model_cfg.trust_remote_code,
                          chat_template=model_cfg.custom_chat_template)


def load_policy_model(model_cfg, path: str) -> torch.nn.Module:
    """The policy as the ``model`` section asks (dtype, attention, remote code, config overrides, dropout)."""
    return load_causal_lm(path, dtype=model_cfg.dtype, attn_implementation=model_cfg.attn_implementation,
                          trust_remote_code=model_cfg.trust_remote_code, override_config=dict(model_cfg.override_config),
                          disable_dropout=model_cfg.disable_dropout)


def describe_policy_model(model_cfg, path: str):
    """:func:`load_policy_model`'s model described without its weights (config, generation config, dtype):
    what an engine that loads the folder itself (vllm) needs of it."""
    return describe_causal_lm(path, dtype=model_cfg.dtype, trust_remote_code=model_cfg.trust_remote_code,
                              override_config=dict(model_cfg.override_config),
                              disable_dropout=model_cfg.disable_dropout)


def rollout_engine_name(rollout_cfg, model) -> str:
    """``rollout.name``, ``auto`` made the engine for ``model``'s architecture (main_ppo has resolved and said
    it already; the Python API resolves it here)."""
    return rollout_cfg.name if rollout_cfg.name != "auto" else auto_engine(model.config.model_type)[0]


def make_rollout(config, engine: str, model, tokenizer, path: str, *, device, seed: int, max_response_length: int):
    """The rollout engine ``engine`` over ``model`` with the ``actor_rollout_ref`` section's settings."""
    rollout_cfg = config.rollout
    prompt_length = rollout_cfg.prompt_length
    return build_rollout(engine, model, tokenizer, generation_batch_size=rollout_cfg.generation_batch_size, seed=seed,
                         device=device, model_path=path, rollout_config=rollout_cfg,
                         max_model_len=prompt_length + max_response_length if prompt_length else None,
                         trust_remote_code=config.model.trust_remote_code)


def agent_loop_of(multi_turn, engine, tokenizer, device):
    """The multi-turn loop over ``engine`` with the run's tools (``rollout.multi_turn``), or None for
    single-turn rollouts. Tools load in every worker process: each rank runs its own samples' calls."""
    if not multi_turn.enable:
        return None
    from verl.agent.agent_loop import AgentLoop, AgentSettings
    from verl.tools.registry import load_tools

    tools = load_tools(multi_turn.tool_config_path, multi_turn.function_tool_path)
    settings = AgentSettings(max_assistant_turns=multi_turn.max_assistant_turns,
                             max_parallel_calls=multi_turn.max_parallel_calls,
                             max_tool_response_length=multi_turn.max_tool_response_length,
                             tool_response_truncate_side=multi_turn.tool_response_truncate_side,
                             format=multi_turn.format, tool_timeout_s=multi_turn.tool_timeout_s,
                             max_user_turns=multi_turn.max_user_turns)
    from verl.agent.interactions import environment_of

    return AgentLoop(engine, tokenizer, tools, settings, device=device, environment=environment_of(multi_turn))
