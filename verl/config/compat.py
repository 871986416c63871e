"""verl's config keys that this project accepts without doing what they ask, or refuses.

People arrive with verl launch scripts of 50-100 `key=value` overrides. Every verl key either
works here, or is accepted with no effect (its help text says why; a value that asks for something
not done here logs one warning when the config is validated), or is refused with one line that
names the key, why, and what to use instead. Nothing a user asked for is dropped silently.

Declaring such a key in a schema section:

    use_torch_compile: bool = verl_option(True, help="...", why="nothing is compiled here")
    lora_rank: int = verl_option(0, help="...", why="LoRA is not implemented yet",
                                 refuse_if=lambda v: v > 0, when="above 0", instead="train all weights")

Refusals happen when the value is set (command line, YAML, Python), so they hold in every trainer
whose schema shares the section. Warnings, and the checks that need several keys, run in
`TrainerConfig.validate()` (see `check`), which also moves values given under verl's other
spellings to the key this project reads (`resolve`), e.g. `trainer.critic_warmup` to
`critic.warmup_steps`. docs/config.md lists all of them.
"""

from __future__ import annotations

import dataclasses
import logging
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from verl.config.key_errors import BACKENDS  # noqa: F401  (re-exported)
from verl.config.fields import walk
from verl.config.node import MISSING, ConfigNode, option
from verl.config.yaml_text import format_flow
from verl.errors import ConfigError

# The checks take the root config (verl.config.schema.TrainerConfig), which is built on this module:
# annotated as the ConfigNode it is, so that the import goes one way.

logger = logging.getLogger("verl.config")

FSDP_STRATEGIES = ("fsdp", "fsdp2")
FSDP_INSTEAD = "this project trains with FSDP: use strategy=fsdp or fsdp2 and the fsdp_config keys"


@dataclasses.dataclass(frozen=True)
class Rule:
    """How a verl key behaves here; see `verl_option`."""

    why: str | Callable[[Any], str]
    inert: bool = True
    warn_if: Callable[[Any], bool] | None = None
    refuse_if: Callable[[Any], bool] | None = None
    when: str = ""
    instead: str = ""
    normalize: Callable[[Any], Any] | None = None
    keys: tuple[str, ...] = ()  # for a free-form mapping: the entries the rule looks at

    def reason(self, value: Any) -> str:
        return self.why(value) if callable(self.why) else self.why

    def given(self, key: str, value: Any) -> str:
        """`key=value` as the user wrote it; for a mapping, only the entries the rule looks at."""
        if isinstance(value, dict) and self.keys:
            shown = [k for k in self.keys if value.get(k) not in (None, False, [], {}, "")] or list(self.keys[:1])
            return ", ".join(f"{key}.{k}={format_flow(value.get(k))}" for k in shown)
        return f"{key}={format_flow(value)}"

    def refusal(self, key: str, value: Any) -> ConfigError:
        fix = f"; {self.instead}" if self.instead else ""
        return ConfigError(f"{self.given(key, value)} is not supported here: {self.reason(value)}{fix}")

    def warning(self, key: str, value: Any) -> str:
        return f"{self.given(key, value)} has no effect here: {self.reason(value)}"


# The reason given for settings that only save memory.
MEMORY_ONLY = "a memory saving only; the numbers are the same"
# Ulysses splits each sequence over a group of ranks: the losses and gradients are those of whole
# sequences, which is what every rank computes here.
NO_SEQUENCE_PARALLEL = ("sequence parallelism is not implemented: every rank holds whole sequences (the same "
                        "losses and gradients, more activation memory per rank), so the data-parallel size is the "
                        "world size; use use_dynamic_bsz / ppo_max_token_len_per_gpu to bound the memory")

def verl_option(default: Any = MISSING, *, help: str, why: str | Callable[[Any], str], inert: bool = True,
                warn_if: Callable[[Any], bool] | None = None, refuse_if: Callable[[Any], bool] | None = None,
                when: str = "", instead: str = "", normalize: Callable[[Any], Any] | None = None,
                keys: Iterable[str] = (), aliases: Iterable[str] = (), bounds: str | None = None,
                choices: Iterable[str] | None = None) -> Any:
    """A leaf field for one of verl's keys that does not (fully) work here.

    `inert`: the key has no effect at all (the help text gets "No effect here: <why>.").
    `warn_if(value)`: the value asks for a behaviour not done here; `validate()` logs a warning.
    `refuse_if(value)`: the value would change results if ignored; setting it raises ConfigError
    (`when` describes those values in the help text, `instead` says what to use).
    `normalize(value)`: applied before the checks, e.g. verl's -1 for "not set" -> None.
    `keys`: for a free-form mapping, the entries the checks read (named in messages).
    `bounds` / `choices`: as for `option()`, checked after `normalize`.
    """
    rule = Rule(why, inert, warn_if, refuse_if, when, instead, normalize, tuple(keys))
    reason = why if isinstance(why, str) else ""
    notes = []
    if inert:
        notes.append(f"No effect here{': ' + reason if reason else ''}.")
    if refuse_if is not None:
        text = f"Refused {when}" if when else "Other values are refused"
        if not inert and reason:
            text += f": {reason}"
        notes.append(text + (f"; {instead}." if instead else "."))
    elif warn_if is not None:
        notes.append(f"Setting it {when} logs a warning." if when else "A value that asks for it logs a warning.")
    field = option(default, help=" ".join([help, *notes]), aliases=aliases, bounds=bounds, choices=choices)
    field.metadata = types.MappingProxyType({**field.metadata, "verl_rule": rule})
    return field


def verl_section_alias(factory: Callable[[], ConfigNode], *, help: str, aliases: Iterable[str]) -> Any:
    """A nested section that verl also spells another way (e.g. `critic.fsdp` for `critic.fsdp_config`)."""
    return dataclasses.field(default_factory=factory, metadata={"help": help, "aliases": tuple(aliases)})


def strategy_option(help: str, default: str = "fsdp") -> Any:
    """verl's `strategy` key: fsdp and fsdp2 both run this project's FSDP engine; others are refused."""
    return verl_option(default, help=help, inert=False, refuse_if=lambda v: v not in FSDP_STRATEGIES,
                       why=lambda v: (f"the {BACKENDS[v]} backend is not supported" if v in BACKENDS
                                      else f"unknown training backend {v!r}"),
                       when="for anything but fsdp / fsdp2", instead=FSDP_INSTEAD)


def _rule(cls: type, name: str) -> Rule | None:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.metadata.get("verl_rule")
    return None


class Section(ConfigNode):
    """Base of the trainer's sections: applies the `verl_option` rules as values are set. (Keys of
    other backends' sections, actor.megatron.* and the like, are refused by `unknown_key_error`.)"""

    def _check(self, spec, value, *args, **kwargs):
        rule = _rule(type(self), spec.name) if spec.node_type is None else None
        if rule is not None and rule.normalize is not None:
            value = rule.normalize(value)
        value = super()._check(spec, value, *args, **kwargs)
        if rule is not None and rule.refuse_if is not None and rule.refuse_if(value):
            raise rule.refusal(self._path(spec.name), value)
        return value


# ------------------------------------------------------------------ checks at validate()
def _rules(cfg: ConfigNode) -> Iterator[tuple[ConfigNode, str, Rule, Any]]:
    """(section, field name, rule, value) of every verl_option below ``cfg``."""
    for entry in walk(cfg):
        if not entry.is_section and "verl_rule" in entry.spec.metadata:
            name = entry.spec.name
            yield entry.owner, name, entry.spec.metadata["verl_rule"], getattr(entry.owner, name)


def check(cfg: ConfigNode) -> None:
    """Refuse what a free-form value changed in place asks for, and log one warning per key whose
    value asks for something not done here. Called by `validate()`."""
    for node, name, rule, value in _rules(cfg):
        if rule.refuse_if is not None and rule.refuse_if(value):
            raise rule.refusal(node._path(name), value)
        if rule.warn_if is not None and rule.warn_if(value):
            logger.warning(rule.warning(node._path(name), value))


_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _dtype(name: str | None) -> str | None:
    return _DTYPES.get(name, name) if name is not None else None


def _move(cfg: ConfigNode, src: str, dst: str, value: Any, unset: Any, dst_default: Any) -> None:
    """Set `dst` to `value` (given under verl's key `src`) and reset `src` to `unset`; a `dst` that
    was set to something else is a conflict."""
    current = cfg.get(dst)
    if current != dst_default and current != value:
        raise ConfigError(f"{src}={format_flow(value)} and {dst}={format_flow(current)} name the same setting "
                          f"with different values; give only {dst}")
    cfg.set(dst, value)
    cfg.set(src, unset)


def resolve(cfg: ConfigNode, dp: int) -> None:
    """Move values given under verl's other spellings to the keys this project reads, and refuse
    combinations that cannot be honoured. Idempotent: a moved key goes back to its default."""
    arr = cfg.actor_rollout_ref
    # Global micro-batch sizes (verl divides them by the data-parallel size).
    for section, global_key, per_gpu_key in (
            ("actor_rollout_ref.actor", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu"),
            ("critic", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu"),
            ("critic", "forward_micro_batch_size", "forward_micro_batch_size_per_gpu"),
            ("actor_rollout_ref.ref", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu"),
            ("actor_rollout_ref.rollout", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu")):
        total = cfg.get(f"{section}.{global_key}")
        if total is None:
            continue
        if total % dp:
            raise ConfigError(f"{section}.{global_key}={total} counts samples over all {dp} data-parallel ranks "
                              f"and must divide by {dp}; give {section}.{per_gpu_key} instead")
        _move(cfg, f"{section}.{global_key}", f"{section}.{per_gpu_key}", total // dp, None, None)
    # Gradient clipping: verl's newer optim.clip_grad.
    for role in ("actor_rollout_ref.actor", "critic"):
        clip = cfg.get(f"{role}.optim.clip_grad")
        if clip is not None:
            _move(cfg, f"{role}.optim.clip_grad", f"{role}.grad_clip", float(clip), None, 1.0)
    # The critic-only warm-up steps.
    if cfg.trainer.critic_warmup:
        _move(cfg, "trainer.critic_warmup", "critic.warmup_steps", cfg.trainer.critic_warmup, 0, 0)
    # verl's newer reward section.
    reward = cfg.reward
    if reward.custom_reward_function.path is not None:
        _move(cfg, "reward.custom_reward_function.path", "custom_reward_function.path",
              reward.custom_reward_function.path, None, None)
        _move(cfg, "reward.custom_reward_function.name", "custom_reward_function.name",
              reward.custom_reward_function.name, "compute_score", "compute_score")
    if reward.custom_reward_function.reward_kwargs:
        _move(cfg, "reward.custom_reward_function.reward_kwargs", "custom_reward_function.reward_kwargs",
              dict(reward.custom_reward_function.reward_kwargs), {}, {})
    if reward.reward_manager.name != "naive":
        _move(cfg, "reward.reward_manager.name", "reward_model.reward_manager", reward.reward_manager.name,
              "naive", "naive")
    if reward.reward_model.enable:
        _move(cfg, "reward.reward_model.enable", "reward_model.enable", True, False, False)
    if reward.reward_model.model_path is not None:
        _move(cfg, "reward.reward_model.model_path", "reward_model.model.path", reward.reward_model.model_path,
              None, None)
    # verl's older DAPO spelling: reward_model.reward_kwargs.overlong_buffer_cfg.
    kwargs = dict(cfg.reward_model.reward_kwargs)
    overlong = kwargs.pop("overlong_buffer_cfg", None)
    if overlong:
        for name, default in (("enable", False), ("len", None), ("penalty_factor", 1.0)):
            if name in overlong:
                _move(cfg, f"reward_model.reward_kwargs.overlong_buffer_cfg.{name}",
                      f"reward_model.overlong_buffer.{name}", overlong[name], default, default)
        cfg.reward_model.reward_kwargs = kwargs
    for name in kwargs:
        logger.warning("reward_model.reward_kwargs.%s has no effect here: the naive reward manager takes no "
                       "arguments (pass arguments to your function with custom_reward_function.reward_kwargs)", name)
    # Rollout correction: token-level truncated importance sampling is actor.rollout_is_correction.
    # The rest (sequence level, batch normalisation, rejection sampling) stays in algorithm.rollout_correction,
    # which the actor reads; the rollout must then report its log-probs.
    correction = cfg.algorithm.rollout_correction
    if correction.rollout_is is not None:
        try:
            # float() would read verl's 'lower_upper' as one number with a digit separator
            if "_" in str(correction.rollout_is_threshold):
                raise ValueError
            threshold = float(correction.rollout_is_threshold)
        except ValueError:
            raise ConfigError(f"algorithm.rollout_correction.rollout_is_threshold={correction.rollout_is_threshold}"
                              f": two-sided bounds (IcePop) are not implemented; give one upper cap, e.g. 2.0"
                              ) from None
        if threshold <= 0:
            raise ConfigError(f"algorithm.rollout_correction.rollout_is_threshold={threshold} must be > 0")
    if correction.rollout_rs is not None:
        from verl.algorithms.rollout_correction import parse_rs  # config imports no torch at module level
        try:
            parse_rs(correction.rollout_rs, correction.rollout_rs_threshold)
        except ValueError as err:
            raise ConfigError(f"algorithm.rollout_correction: {err}") from None
    if correction.rollout_is == "sequence" or correction.rollout_rs is not None or correction.bypass_mode:
        cfg.set("actor_rollout_ref.rollout.calculate_log_probs", True)
    if correction.bypass_mode and arr.actor.policy_loss.loss_mode != "vanilla":
        logger.warning("actor_rollout_ref.actor.policy_loss.loss_mode=%s has no effect with "
                       "algorithm.rollout_correction.bypass_mode=true: the policy loss is loss_type=%s's (as in verl)",
                       arr.actor.policy_loss.loss_mode, correction.loss_type)
    if correction.loss_type != "ppo_clip" and not correction.bypass_mode:
        logger.warning("algorithm.rollout_correction.loss_type=%s has no effect without bypass_mode=true (as in "
                       "verl): the policy loss is actor_rollout_ref.actor.policy_loss.loss_mode's",
                       correction.loss_type)
    # An estimator reading sum_v pi^2 (the optimal token baseline) takes it from the old-log-prob pass,
    # which bypass mode skips.
    from verl.algorithms.advantages import estimator_inputs  # config imports no torch at module level

    estimator = cfg.algorithm.adv_estimator
    if "sum_pi_squared" in estimator_inputs(estimator):
        if correction.bypass_mode:
            raise ConfigError(f"algorithm.adv_estimator={estimator} reads the old policy's log-probs and "
                              f"sum_pi_squared from the old-log-prob pass, which algorithm.rollout_correction."
                              f"bypass_mode=true skips: turn bypass_mode off, or choose another estimator")
        cfg.set("actor_rollout_ref.actor.calculate_sum_pi_squared", True)
    # In bypass mode token-level weights are pi_theta / pi_rollout, computed in the bypass loss: they stay here.
    if correction.rollout_is == "token" and not correction.bypass_mode:
        _move(cfg, "algorithm.rollout_correction.rollout_is", "actor_rollout_ref.actor.rollout_is_correction",
              True, None, False)
        _move(cfg, "algorithm.rollout_correction.rollout_is_threshold",
              "actor_rollout_ref.actor.rollout_is_threshold", float(correction.rollout_is_threshold), 2.0, 2.0)
    # Weight and compute dtypes of the FSDP engine.
    actor_dtype = _dtype(arr.actor.fsdp_config.model_dtype)
    if actor_dtype is not None:
        if _dtype(arr.model.dtype) != actor_dtype:
            _move(cfg, "actor_rollout_ref.actor.fsdp_config.model_dtype", "actor_rollout_ref.model.dtype",
                  actor_dtype, None, "float32")
        else:
            cfg.set("actor_rollout_ref.actor.fsdp_config.model_dtype", None)
    for key, value in (("actor_rollout_ref.ref.fsdp_config.model_dtype", arr.ref.fsdp_config.model_dtype),
                       ("critic.fsdp.model_dtype", cfg.critic.fsdp_config.model_dtype)):
        if value is not None and _dtype(value) != _dtype(arr.model.dtype):
            raise ConfigError(f"{key}={value}: the reference and the critic load the policy's weight dtype here "
                              f"(actor_rollout_ref.model.dtype={arr.model.dtype}); set that key instead")
    for prefix, fsdp in (("actor_rollout_ref.actor", arr.actor.fsdp_config),
                         ("actor_rollout_ref.ref", arr.ref.fsdp_config), ("critic", cfg.critic.fsdp_config)):
        if fsdp.dtype is not None:
            _move(cfg, f"{prefix}.fsdp_config.dtype", f"{prefix}.fsdp_config.mixed_precision.param_dtype",
                  fsdp.dtype, None, "auto")
    # Lengths: verl's rollout copies data.max_prompt_length / max_response_length.
    for key, data_key in (("prompt_length", "max_prompt_length"), ("response_length", "max_response_length")):
        value = getattr(arr.rollout, key)
        if value is not None and value != getattr(cfg.data, data_key):
            raise ConfigError(f"actor_rollout_ref.rollout.{key}={value} differs from data.{data_key}="
                              f"{getattr(cfg.data, data_key)}; here the rollout uses data.{data_key}: set that "
                              f"key (and leave rollout.{key} unset)")
    flag = arr.actor.use_remove_padding
    if flag is not None and flag != arr.model.use_remove_padding:
        raise ConfigError(f"actor_rollout_ref.actor.use_remove_padding={format_flow(flag)} differs from "
                          f"actor_rollout_ref.model.use_remove_padding={format_flow(arr.model.use_remove_padding)}; "
                          f"here the model's key decides for the actor and the reference: set that one")
    if cfg.data.gen_batch_size is not None and cfg.data.gen_batch_size != cfg.data.train_batch_size:
        raise ConfigError(f"data.gen_batch_size={cfg.data.gen_batch_size}: prompts are drawn in batches of "
                          f"data.train_batch_size={cfg.data.train_batch_size} here (also by dynamic sampling, "
                          f"algorithm.filter_groups); leave data.gen_batch_size unset")
    keep_critic = cfg.trainer.max_critic_ckpt_to_keep
    if keep_critic is not None and keep_critic != cfg.trainer.max_actor_ckpt_to_keep:
        logger.warning("trainer.max_critic_ckpt_to_keep=%s has no effect here: a checkpoint holds the actor and the "
                       "critic together, and trainer.max_actor_ckpt_to_keep=%s counts them", keep_critic,
                       cfg.trainer.max_actor_ckpt_to_keep)


# ------------------------------------------------------------------ verl's defaults of free-form sections
# Accepted as free-form mappings holding verl's keys and defaults, so that `a.b.c=value` works without
# `+` as it does in verl; only the switches below act (a warning or a refusal), the rest has no effect.
def profiler_defaults() -> dict:
    """verl's per-role `profiler` section (actor, ref, rollout, critic)."""
    schedule = {"skip_first": 0, "wait": 0, "warmup": 0, "active": 0, "repeat": 0}
    return {
        "tool": None, "enable": False, "all_ranks": False, "ranks": [], "save_path": None,
        "relocate_results": False, "finish_hook_cmd": None, "finish_hook_all_ranks": False, "finish_hook_ranks": [],
        "tool_config": {
            "nsys": {"discrete": False},
            "npu": {"contents": [], "level": "level0", "analysis": True, "discrete": False,
                    "profile_token_start": None, "profile_token_end": None},
            "torch": {"contents": [], "discrete": False, "schedule": schedule,
                      "profile_token_start": None, "profile_token_end": None},
            "torch_memory": {"trace_alloc_max_entries": 100000, "stack_depth": 32},
            "precision_debugger": {"config_path": None, "steps": None, "stages": None, "strict": False},
        },
    }


def global_profiler_defaults() -> dict:
    """verl's top-level `global_profiler` section."""
    nsight = {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph"}
    return {
        "tool": None, "steps": None, "profile_continuous_steps": False, "save_path": "outputs/profile",
        "relocate_results": False, "finish_hook_cmd": None, "finish_hook_all_ranks": False, "finish_hook_ranks": [],
        "global_tool_config": {
            "nsys": {"discrete": False, "controller_nsight_options": dict(nsight),
                     "worker_nsight_options": {**nsight, "capture-range": "cudaProfilerApi",
                                               "capture-range-end": None, "kill": "none"}},
            "torch_memory": {"trace_alloc_max_entries": 100000, "stack_depth": 32, "context": "all",
                             "stacks": "all", "kw_args": {}},
            "precision_debugger": {"config_path": None, "steps": None, "stages": None, "strict": False},
        },
    }


def checkpoint_defaults() -> dict:
    """verl's per-role `checkpoint` section (what a checkpoint holds)."""
    return {"save_contents": ["model", "optimizer", "extra"], "load_contents": ["model", "optimizer", "extra"],
            "async_save": False, "strict": True}


def mtp_defaults() -> dict:
    """verl's `model.mtp` section (multi-token prediction)."""
    return {"enable": False, "enable_train": False, "enable_rollout": False, "detach_encoder": False,
            "mtp_loss_scaling_factor": 0.1, "speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4, "method": "mtp",
            "num_speculative_tokens": 1}


def lora_defaults() -> dict:
    """verl's `model.lora` section (the engine form of the LoRA settings)."""
    return {"type": "lora", "merge": False, "rank": 0, "alpha": 32, "dropout": 0.0,
            "target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], "exclude_modules": [],
            "dropout_position": "pre", "lora_A_init_method": "xavier", "lora_B_init_method": "zero",
            "a2a_experimental": False, "dtype": None, "adapter_path": None, "freeze_vision_model": True,
            "freeze_vision_projection": True, "freeze_language_model": True}


def checkpoint_engine_defaults() -> dict:
    """verl's `rollout.checkpoint_engine` section (how weights reach the rollout engine)."""
    return {"backend": "naive", "update_weights_bucket_megabytes": 2048, "engine_kwargs": {},
            "custom_backend_module": None}


def ray_kwargs_defaults() -> dict:
    """verl's top-level `ray_kwargs` section."""
    return {"ray_init": {"num_cpus": None, "runtime_env": {"py_executable": None}}, "timeline_json_file": None}


def distillation_defaults() -> dict:
    """verl's top-level `distillation` section's free-form parts (the typed ones are in the schema)."""
    inference = {"name": None, "dtype": None, "gpu_memory_utilization": 0.5, "enforce_eager": True,
                 "cudagraph_capture_sizes": None, "free_cache_engine": True, "data_parallel_size": 1,
                 "expert_parallel_size": 1, "tensor_model_parallel_size": 2, "max_num_batched_tokens": 8192,
                 "max_model_len": None, "max_num_seqs": 1024, "load_format": "auto", "engine_kwargs": {},
                 "limit_images": None, "enable_chunked_prefill": True, "enable_prefix_caching": True,
                 "disable_log_stats": True, "skip_tokenizer_init": True, "prompt_length": None,
                 "response_length": None, "temperature": None}
    return {
        "n_gpus_per_node": 8, "nnodes": 0,
        "teacher_models": {"teacher_model": {"key": None, "model_path": None, "num_replicas": 0,
                                             "inference": inference}},
        "teacher_key": "data_source",
    }


def qat_defaults() -> dict:
    """verl's `qat` section (quantisation-aware training)."""
    return {"enable": False, "mode": "w4a16", "group_size": 16,
            "ignore_patterns": ["lm_head", "embed_tokens", "re:.*mlp.gate$"], "activation_observer": "static_minmax",
            "quantization_config_path": None}


def turbo_defaults() -> dict:
    """verl's `fsdp_config.turbo_config` section (the FSDP-Turbo engine)."""
    plan = {"param_dtype": "bf16", "reduce_dtype": "fp32", "output_dtype": "bf16", "fsdp_implementation": "native",
            "num_to_forward_prefetch": 1, "num_to_backward_prefetch": 1}
    return {"distributed": {"fully_shard_parallel_size": 16, "tensor_parallel_size": 1, "expert_parallel_size": 1,
                            "expert_fully_shard_parallel_size": 1, "ulysses_parallel_size": 1, "fsdp_plan": plan}}


def reward_rollout_defaults() -> dict:
    """verl's `reward.reward_model.rollout` section (the engine serving a reward model)."""
    return {"name": None, "dtype": "bfloat16", "gpu_memory_utilization": 0.5, "enforce_eager": True,
            "cudagraph_capture_sizes": None, "free_cache_engine": True, "data_parallel_size": 1,
            "expert_parallel_size": 1, "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1,
            "max_num_batched_tokens": 8192, "max_model_len": None, "max_num_seqs": 1024, "load_format": "auto",
            "layered_summon": False, "scheduling_policy": "fcfs", "full_determinism": False, "seed": 42,
            "multi_stage_wake_up": False, "engine_kwargs": {}, "limit_images": None, "enable_chunked_prefill": True,
            "enable_prefix_caching": True, "disable_log_stats": True, "skip_tokenizer_init": False,
            "ignore_eos": False, "temperature": 1.0, "top_k": -1, "top_p": 1, "do_sample": True, "n": 1,
            "prompt_length": 2048, "response_length": 2048, "quantization": None, "quantization_config_file": None,
            "mtp": None, "disaggregation": {"enabled": False, "prefill_replicas": 1, "decode_replicas": 1,
                                            "decode_tensor_model_parallel_size": None, "transfer_backend": "nixl",
                                            "bootstrap_port": None, "ib_device": None}}


def transfer_queue_defaults() -> dict:
    """verl's top-level `transfer_queue` section."""
    return {"enable": False, "metrics": {"enabled": False, "port": 0},
            "backend": {"storage_backend": "SimpleStorage",
                        "SimpleStorage": {"total_storage_size": 100000, "num_data_storage_units": 8},
                        "MooncakeStore": {"auto_init": False, "metadata_server": "localhost:50123",
                                          "master_server_address": "localhost:50124", "local_hostname": "localhost",
                                          "protocol": "tcp", "global_segment_size": 4294967296,
                                          "local_buffer_size": 1073741824, "device_name": ""}}}


def trainer_v1_defaults() -> dict:
    """verl's `trainer.v1` section (its newer trainer loop's modes)."""
    hybrid = {"enable_switch": False, "switch_threshold_ratio": 0.4, "adaptive_switch_threshold": True,
              "switch_threshold_step_up": 0.05, "switch_threshold_step_down": 0.03,
              "switch_threshold_release_steps": 2, "switch_cost_window_size": 3}
    return {"trainer_mode": "sync", "sync": {}, "colocate_async": {"num_warmup_batches": 1},
            "separate_async": {"num_warmup_batches": 1, "parameter_sync_step": 4, "hybrid_rollout": hybrid},
            "sampler": {"max_off_policy_threshold": 8, "max_off_policy_strategy": "drop",
                        "sync_refill_failed_groups": False, "custom_sampler": {"path": None, "name": None},
                        "sampler_kwargs": {}}}


def skip_defaults() -> dict:
    """verl's top-level `skip` section (rollout caching for debugging)."""
    return {name: {"enable": False, "dump_dir": "~/.verl/rollout_dump", "steps": [], "action": "cache"}
            for name in ("rollout", "rollout_tq", "async_rollout")}
