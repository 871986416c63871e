"""verl's other spellings of the keys this project reads, moved onto them at `validate()`.

:func:`resolve` applies the tables below, then the few rules that need code (parsing, several keys
at once): a key of :data:`MOVES` that is set moves to the key read here (the old one goes back to
its default; both set to different values is a conflict), a pair of :data:`MUST_AGREE` that differs
is refused or warned about with its message. Idempotent: a moved key is back at its default.
The keys verl has and this project does not use are declared in the schema (:mod:`verl.config.verl_rules`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from verl.config.node import ConfigNode
from verl.config.yaml_text import format_flow
from verl.errors import ConfigError

# resolve() takes the root config (verl.config.schema.TrainerConfig), which is built on this module:
# annotated as the ConfigNode it is, so that the import goes one way.

logger = logging.getLogger("verl.config")

_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _dtype(name: str | None) -> str | None:
    return _DTYPES.get(name, name)  # None stays None


def _move(cfg: ConfigNode, src: str, dst: str, value: Any, unset: Any, dst_default: Any) -> None:
    """Set `dst` to `value` (given under verl's key `src`) and reset `src` to `unset`; a `dst` that
    was set to something else is a conflict."""
    current = cfg.get(dst)
    if current != dst_default and current != value:
        raise ConfigError(f"{src}={format_flow(value)} and {dst}={format_flow(current)} name the same setting "
                          f"with different values; give only {dst}")
    cfg.set(dst, value)
    cfg.set(src, unset)


@dataclasses.dataclass(frozen=True)
class Move:
    """verl's key ``src``, when set (not ``unset``), moves to ``dst``, the key read here (whose own
    default is ``dst_default``), its value through ``convert``. ``per_rank``: ``src`` counts over all
    data-parallel ranks and ``dst`` per rank (the value is divided, and must divide). ``only_with``:
    moved only when that other verl key is set too."""

    src: str
    dst: str
    unset: Any = None
    dst_default: Any = None
    convert: Callable[[Any], Any] | None = None
    per_rank: bool = False
    only_with: str | None = None


MOVES = (
    # Global micro-batch sizes (verl divides them by the data-parallel size).
    Move("actor_rollout_ref.actor.ppo_micro_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
         per_rank=True),
    Move("critic.ppo_micro_batch_size", "critic.ppo_micro_batch_size_per_gpu", per_rank=True),
    Move("critic.forward_micro_batch_size", "critic.forward_micro_batch_size_per_gpu", per_rank=True),
    Move("actor_rollout_ref.ref.log_prob_micro_batch_size", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
         per_rank=True),
    Move("actor_rollout_ref.rollout.log_prob_micro_batch_size",
         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", per_rank=True),
    # Gradient clipping: verl's newer optim.clip_grad.
    Move("actor_rollout_ref.actor.optim.clip_grad", "actor_rollout_ref.actor.grad_clip", dst_default=1.0, convert=float),
    Move("critic.optim.clip_grad", "critic.grad_clip", dst_default=1.0, convert=float),
    # The critic-only warm-up steps.
    Move("trainer.critic_warmup", "critic.warmup_steps", unset=0, dst_default=0),
    # verl's newer reward section.
    Move("reward.custom_reward_function.name", "custom_reward_function.name", unset="compute_score",
         dst_default="compute_score", only_with="reward.custom_reward_function.path"),  # before the path moves
    Move("reward.custom_reward_function.path", "custom_reward_function.path"),
    Move("reward.custom_reward_function.reward_kwargs", "custom_reward_function.reward_kwargs", unset={},
         dst_default={}, convert=dict),
    Move("reward.reward_manager.name", "reward_model.reward_manager", unset="naive", dst_default="naive"),
    Move("reward.reward_model.enable", "reward_model.enable", unset=False, dst_default=False),
    Move("reward.reward_model.model_path", "reward_model.model.path"),
    # The compute dtype of the FSDP engine.
    *(Move(f"{role}.fsdp_config.dtype", f"{role}.fsdp_config.mixed_precision.param_dtype", dst_default="auto")
      for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")),
)


@dataclasses.dataclass(frozen=True)
class MustAgree:
    """verl's key ``key``, when set (not None), must equal ``other`` here: else the config is refused
    (or, with ``warn``, a warning is logged) with ``"{key}={value}"`` and ``message``, which may name
    ``{other_value}``."""

    key: str
    other: str
    message: str
    warn: bool = False


MUST_AGREE = (
    # Lengths: verl's rollout copies data.max_prompt_length / max_response_length.
    MustAgree("actor_rollout_ref.rollout.prompt_length", "data.max_prompt_length",
              " differs from data.max_prompt_length={other_value}; here the rollout uses data.max_prompt_length: set "
              "that key (and leave rollout.prompt_length unset)"),
    MustAgree("actor_rollout_ref.rollout.response_length", "data.max_response_length",
              " differs from data.max_response_length={other_value}; here the rollout uses data.max_response_length: "
              "set that key (and leave rollout.response_length unset)"),
    MustAgree("actor_rollout_ref.actor.use_remove_padding", "actor_rollout_ref.model.use_remove_padding",
              " differs from actor_rollout_ref.model.use_remove_padding={other_value}; here the model's key decides "
              "for the actor and the reference: set that one"),
    MustAgree("data.gen_batch_size", "data.train_batch_size",
              ": prompts are drawn in batches of data.train_batch_size={other_value} here (also by dynamic sampling, "
              "algorithm.filter_groups); leave data.gen_batch_size unset"),
    MustAgree("trainer.max_critic_ckpt_to_keep", "trainer.max_actor_ckpt_to_keep",
              " has no effect here: a checkpoint holds the actor and the critic together, and "
              "trainer.max_actor_ckpt_to_keep={other_value} counts them", warn=True),
)


def apply_move(cfg: ConfigNode, move: Move, dp: int) -> None:
    """Apply one :class:`Move` (``dp``: the data-parallel size a per-rank move divides by)."""
    value = cfg.get(move.src)
    if value == move.unset or (move.only_with is not None and cfg.get(move.only_with) is None):
        return
    if move.per_rank:
        if value % dp:
            section = move.src.rpartition(".")[0]
            raise ConfigError(f"{move.src}={value} counts samples over all {dp} data-parallel ranks and must divide "
                              f"by {dp}; give {section}.{move.dst.rpartition('.')[2]} instead")
        value //= dp
    _move(cfg, move.src, move.dst, move.convert(value) if move.convert else value, move.unset, move.dst_default)


def _check_agreement(cfg: ConfigNode, rule: MustAgree) -> None:
    value = cfg.get(rule.key)
    other = cfg.get(rule.other)
    if value is None or value == other:
        return
    text = f"{rule.key}={format_flow(value)}" + rule.message.format(other_value=format_flow(other))
    if rule.warn:
        logger.warning(text)
    else:
        raise ConfigError(text)


def _reward_manager_kwargs(cfg: ConfigNode, kwargs: dict) -> None:
    """verl hands ``reward_model.reward_kwargs`` to its reward manager: the batch manager passes them on to
    ``custom_reward_function`` at every call (done here too, see :func:`reward_manager_call_kwargs`), the DAPO
    manager reads ``max_resp_len`` (the length its overlong penalty counts from; here data.max_response_length),
    and the others take none (verl stops with a TypeError; a warning here)."""
    manager = cfg.reward_model.reward_manager
    if manager == "dapo" and "max_resp_len" in kwargs:
        max_resp_len, max_len = kwargs.pop("max_resp_len"), cfg.data.max_response_length
        if max_resp_len is not None and max_resp_len != max_len:
            raise ConfigError(f"reward_model.reward_kwargs.max_resp_len={max_resp_len} differs from "
                              f"data.max_response_length={max_len}: the overlong penalty here counts from "
                              f"data.max_response_length (verl's DAPO scripts set both to the same value); give "
                              f"them the same value, or drop max_resp_len")
        cfg.reward_model.reward_kwargs = kwargs
    if manager == "batch" and cfg.custom_reward_function.path:
        both = sorted(set(kwargs) & set(dict(cfg.custom_reward_function.reward_kwargs)))
        if both:
            raise ConfigError(f"reward_model.reward_kwargs and custom_reward_function.reward_kwargs both give "
                              f"{both}: verl's batch reward manager passes both to the function, which cannot take "
                              f"one argument twice; give each in one place")
        return
    for name in kwargs:
        logger.warning("reward_model.reward_kwargs.%s has no effect here: the %s reward manager takes no arguments "
                       "(verl's batch manager passes them to custom_reward_function; pass arguments to your "
                       "function with custom_reward_function.reward_kwargs)", name, manager)


def reward_manager_call_kwargs(cfg: ConfigNode) -> dict:
    """The keyword arguments every call of ``custom_reward_function`` gets: its own ``reward_kwargs`` and, with
    ``reward_model.reward_manager=batch``, ``reward_model.reward_kwargs`` (verl's batch manager passes those)."""
    own = dict(cfg.custom_reward_function.reward_kwargs)
    if cfg.reward_model.reward_manager != "batch":
        return own
    return {**dict(cfg.reward_model.reward_kwargs), **own}


def resolve(cfg: ConfigNode, dp: int) -> None:
    """Move values given under verl's other spellings to the keys this project reads (:data:`MOVES`),
    refuse combinations that cannot be honoured (:data:`MUST_AGREE` and the rules below). Idempotent:
    a moved key goes back to its default."""
    arr = cfg.actor_rollout_ref
    for move in MOVES:
        apply_move(cfg, move, dp)
    # verl's older DAPO spelling: reward_model.reward_kwargs.overlong_buffer_cfg.
    kwargs = dict(cfg.reward_model.reward_kwargs)
    overlong = kwargs.pop("overlong_buffer_cfg", None)
    if overlong:
        for name, default in (("enable", False), ("len", None), ("penalty_factor", 1.0)):
            if name in overlong:
                _move(cfg, f"reward_model.reward_kwargs.overlong_buffer_cfg.{name}",
                      f"reward_model.overlong_buffer.{name}", overlong[name], default, default)
        cfg.reward_model.reward_kwargs = kwargs
    _reward_manager_kwargs(cfg, kwargs)
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
    for rule in MUST_AGREE:
        _check_agreement(cfg, rule)
