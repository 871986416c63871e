"""Batch-size arithmetic and cross-field checks of `TrainerConfig`, in one place.

Units: a *prompt* is one dataset row; a *sample* is one prompt-response pair, so a step holds
`data.train_batch_size x rollout.n` samples. A mini-batch (one optimiser step) is
`ppo_mini_batch_size` prompts, split evenly over the data-parallel ranks; each rank runs its share
in micro-batches of `ppo_micro_batch_size_per_gpu` samples (gradient accumulation), or with
`use_dynamic_bsz` in micro-batches of at most `ppo_max_token_len_per_gpu` tokens.
"""

from __future__ import annotations

import contextlib
import logging
import re

from verl.config import compat, verl_rules
from verl.config.node import ConfigNode
from verl.config.yaml_text import format_flow
from verl.errors import ConfigError, closest_name
from verl.tracking.tracker import LOGGER_NAMES

# The checks take the root config (verl.config.schema.TrainerConfig), which is built on this module:
# annotated as the ConfigNode it is, so that the import goes one way.

# Estimators whose baseline is the other responses to the same prompt: they need n >= 2.
GROUP_BASELINE_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline")
# Estimators whose advantages are all 0 when a prompt's samples are identical (greedy decoding).
SAME_SAMPLES_ZERO_ADVANTAGE = (*GROUP_BASELINE_ESTIMATORS, "gpg", "gdpo", "optimal_token_baseline")
# Estimators that need a learned value function.
CRITIC_ESTIMATORS = ("gae",)

_ACTOR = "actor_rollout_ref.actor"
logger = logging.getLogger("verl.config")
_N_KEY = "actor_rollout_ref.rollout.n"


def critic_enabled(cfg: ConfigNode) -> bool:
    if cfg.critic.enable is not None:
        return cfg.critic.enable
    return cfg.algorithm.adv_estimator in CRITIC_ESTIMATORS


def _dp(cfg: ConfigNode, dp_size: int | None) -> int:
    return dp_size if dp_size is not None else cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def _role_sizes(cfg: ConfigNode, role: str) -> tuple[str, int, str, int | None, int]:
    """(mini-batch key, prompts per mini-batch, micro-batch key, samples per micro-batch, epochs);
    the critic's null fields resolve to the actor's, and the key named is the one that applies."""
    actor = cfg.actor_rollout_ref.actor
    if role == "actor":
        return (f"{_ACTOR}.ppo_mini_batch_size", actor.ppo_mini_batch_size,
                f"{_ACTOR}.ppo_micro_batch_size_per_gpu", actor.ppo_micro_batch_size_per_gpu, actor.ppo_epochs)
    critic = cfg.critic
    mini_key, mini = ("critic.ppo_mini_batch_size", critic.ppo_mini_batch_size)
    if mini is None:
        mini_key, mini = f"{_ACTOR}.ppo_mini_batch_size", actor.ppo_mini_batch_size
    micro_key, micro = ("critic.ppo_micro_batch_size_per_gpu", critic.ppo_micro_batch_size_per_gpu)
    if micro is None:
        micro_key, micro = f"{_ACTOR}.ppo_micro_batch_size_per_gpu", actor.ppo_micro_batch_size_per_gpu
    epochs = critic.ppo_epochs if critic.ppo_epochs is not None else actor.ppo_epochs
    return mini_key, mini, micro_key, micro, epochs


def log_prob_token_budget(arr_cfg, role: str) -> int | None:
    """Tokens per log-prob pass of ``role`` (``rollout``: old log-probs, ``ref``) with dynamic batch
    size, else None; their null keys follow the actor's, as verl's defaults do. Takes the
    ``actor_rollout_ref`` section, which the worker holds."""
    section, actor = getattr(arr_cfg, role), arr_cfg.actor
    use = section.log_prob_use_dynamic_bsz if section.log_prob_use_dynamic_bsz is not None else actor.use_dynamic_bsz
    if not use:
        return None
    budget = section.log_prob_max_token_len_per_gpu
    return budget if budget is not None else actor.ppo_max_token_len_per_gpu


def derived_sizes(cfg: ConfigNode, dp_size: int | None = None, role: str = "actor") -> dict[str, int]:
    """The batch sizes a step actually uses, each named with its unit (for logging)."""
    _, mini, _, micro, epochs = _role_sizes(cfg, role)
    dp = _dp(cfg, dp_size)
    n = cfg.actor_rollout_ref.rollout.n
    per_rank = mini * n // dp
    micro = micro or per_rank
    return {
        "prompts_per_step": cfg.data.train_batch_size,
        "samples_per_prompt": n,
        "samples_per_step": cfg.data.train_batch_size * n,
        "prompts_per_mini_batch": mini,
        "samples_per_mini_batch": mini * n,
        "mini_batches_per_step": cfg.data.train_batch_size // mini,
        "dp_size": dp,
        "samples_per_mini_batch_per_rank": per_rank,
        "samples_per_micro_batch": micro,
        "micro_batches_per_mini_batch": per_rank // micro,
        "ppo_epochs": epochs,
    }


def _divisor_hint(total: int, wrong: int) -> str:
    divisors = [d for d in range(1, total + 1) if total % d == 0]
    below = [d for d in divisors if d < wrong]
    above = [d for d in divisors if d > wrong]
    return " or ".join(str(d) for d in (below[-1:] + above[:1]))


def _at_least(key: str, value: int | None, low: int, meaning: str) -> None:
    if value is not None and value < low:
        raise ConfigError(f"{key}={value} must be >= {low} ({meaning})")


def _check_role(cfg: ConfigNode, dp: int, role: str) -> None:
    mini_key, mini, micro_key, micro, epochs = _role_sizes(cfg, role)
    prompts = cfg.data.train_batch_size
    n = cfg.actor_rollout_ref.rollout.n
    _at_least(mini_key, mini, 1, "prompts per mini-batch")
    _at_least(micro_key, micro, 1, "samples per micro-batch")
    _at_least(f"{'critic' if role == 'critic' else _ACTOR}.ppo_epochs", epochs, 1, "passes over each step's samples")
    if prompts % mini:
        raise ConfigError(
            f"data.train_batch_size={prompts} is not divisible by {mini_key}={mini} "
            f"({prompts} / {mini} = {prompts / mini:.2f}); choose a mini-batch size that divides it, "
            f"e.g. {_divisor_hint(prompts, mini)}")
    samples = mini * n
    batch = f"the {role} mini-batch of {mini_key}={mini} prompts x {_N_KEY}={n} = {samples} samples"
    if samples % dp:
        raise ConfigError(
            f"{batch} cannot be split evenly over {dp} data-parallel ranks ({samples} / {dp} = "
            f"{samples / dp:.2f}); choose sizes whose product is a multiple of {dp}")
    per_rank = samples // dp
    if micro is not None and per_rank % micro:
        share = f" ({per_rank} per rank over {dp} ranks)" if dp > 1 else ""
        raise ConfigError(
            f"{batch}{share} is not divisible by {micro_key}={micro} ({per_rank} / {micro} = "
            f"{per_rank / micro:.2f}); choose a micro-batch size that divides it, "
            f"e.g. {_divisor_hint(per_rank, micro)}")


class _SaidOnce(logging.Filter):
    """Drops a warning already said for the config being validated (its messages are kept on it)."""

    def __init__(self, said: set[str]):
        super().__init__()
        self.said = said

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.said:
            return False
        self.said.add(message)
        return True


@contextlib.contextmanager
def _warnings_once(cfg: ConfigNode):
    """A config validated again (main_ppo checks it before the warm start trains, the trainer when it is built)
    says each of its warnings once; another config says them anew."""
    said = cfg.__dict__.get("_said_warnings")
    if said is None:
        said = set()
        object.__setattr__(cfg, "_said_warnings", said)
    once = _SaidOnce(said)
    logger.addFilter(once)
    try:
        yield
    finally:
        logger.removeFilter(once)


def validate(cfg: ConfigNode, dp_size: int | None = None) -> None:
    """Raise ConfigError on the first inconsistent setting; the message shows the arithmetic.

    First, values given under verl's other spellings move to the keys this project reads, and verl
    keys whose values ask for something not done here log a warning (see verl.config.verl_rules),
    once for a config however often it is validated."""
    with _warnings_once(cfg):
        _validate(cfg, dp_size)


def _validate(cfg: ConfigNode, dp_size: int | None) -> None:
    dp = _dp(cfg, dp_size)
    n = cfg.actor_rollout_ref.rollout.n  # single-key ranges (n >= 1, ...) are the schema's (option bounds=)
    if dp < 1:
        raise ConfigError(f"dp_size={dp} must be >= 1 (data-parallel ranks: trainer.nnodes x trainer.n_gpus_per_node)")
    compat.resolve(cfg, dp)
    verl_rules.check(cfg)
    estimator = cfg.algorithm.adv_estimator
    # Distillation without the task rewards trains on the teacher's signal alone: no group is compared.
    distilling_only = cfg.distillation.enabled and not cfg.distillation.distillation_loss.use_task_rewards
    if n == 1 and estimator in GROUP_BASELINE_ESTIMATORS and not distilling_only:
        name = "GRPO" if estimator == "grpo" else estimator
        raise ConfigError(f"{name} compares several responses per prompt; set {_N_KEY} to 4 or more "
                          f"(it is 1), or use an estimator without a group baseline "
                          f"(algorithm.adv_estimator=gae or reinforce_plus_plus)")
    if not distilling_only:
        _warn_if_greedy_groups(cfg)
    _warn_if_switched_off(cfg)
    check_loggers(cfg)
    _refuse_a_run_without_steps_or_validation(cfg)
    if estimator in CRITIC_ESTIMATORS and cfg.critic.enable is False:
        raise ConfigError(f"algorithm.adv_estimator={estimator} computes advantages from a critic's values, and "
                          f"critic.enable=false turns the critic off: set critic.enable=true (or leave it null), "
                          f"or choose an estimator without a critic (grpo, rloo, reinforce_plus_plus)")
    _check_role(cfg, dp, "actor")
    _check_token_budgets(cfg)
    _check_seq_len(cfg.data)
    if critic_enabled(cfg):
        _check_role(cfg, dp, "critic")
        _at_least("critic.warmup_steps", cfg.critic.warmup_steps, 0, "critic-only steps before the actor trains")
    actor = cfg.actor_rollout_ref.actor
    for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
        value = getattr(actor, name)
        if value is not None and value <= 0:
            raise ConfigError(f"{_ACTOR}.{name}={value} must be > 0 (the probability ratio is clipped "
                              f"to [1 - low, 1 + high]); the usual value is 0.2")
    if actor.clip_ratio_c <= 1:
        raise ConfigError(f"{_ACTOR}.clip_ratio_c={actor.clip_ratio_c} must be > 1 (dual-clip bound "
                          f"on the ratio for negative advantages); the default is 3.0")
    if actor.use_prefix_grouper:
        model = cfg.actor_rollout_ref.model
        for key, on in (("use_remove_padding", model.use_remove_padding),
                        ("enable_gradient_checkpointing", model.enable_gradient_checkpointing)):
            if on:
                raise ConfigError(f"{_ACTOR}.use_prefix_grouper=true cannot run with actor_rollout_ref.model.{key}=true "
                                  f"(shared prompts need the plain padded forward and the prompt's cache): set one of "
                                  f"them to false, or leave use_prefix_grouper null (on wherever it can be)")
    loss = actor.policy_loss
    if loss.loss_mode == "clip_cov" and loss.clip_cov_lb >= loss.clip_cov_ub:
        raise ConfigError(f"{_ACTOR}.policy_loss.clip_cov_lb={loss.clip_cov_lb} must be below clip_cov_ub="
                          f"{loss.clip_cov_ub}: clip_cov clips tokens whose covariance lies between the two, so "
                          f"no token would be clipped (the defaults are 1.0 and 5.0)")
    for role in ("actor", "ref"):
        check_fsdp_size(f"actor_rollout_ref.{role}.fsdp_config.fsdp_size",
                        getattr(cfg.actor_rollout_ref, role).fsdp_config.fsdp_size)
    check_fsdp_size("critic.fsdp_config.fsdp_size", cfg.critic.fsdp_config.fsdp_size)
    _check_dapo(cfg)
    _check_rollout_pool(cfg)
    _refuse_empty_paths(cfg)
    for section in ("custom_reward_function", "reward.custom_reward_function"):  # verl's old and new place
        _check_custom_reward(cfg.get(section), section)


# Paths where '' (`key=` on the command line, an empty YAML string) would not be refused later, but read
# as something else: the current folder (its files as a dataset; the run's output written among them),
# or no reward function at all. What to give instead, by key.
EMPTY_PATHS = {"data.train_files": "give a .parquet/.jsonl file (or a list), or leave the key out for the built-in "
                                   "task",
               "data.val_files": "give a .parquet/.jsonl file (or a list), or leave the key out (null) for none",
               "trainer.default_local_dir": "give the output folder, e.g. trainer.default_local_dir=outputs/run",
               "actor_rollout_ref.model.path": "give a model folder or a hub id, or leave the key out for the built-in "
                                               "model",
               "custom_reward_function.path": "give the .py file of the reward function, or leave the key out (null) "
                                              "for the built-in scorers"}


_ENV_VARIABLE = re.compile(r"\$(?:([A-Za-z_]\w*)|\{([A-Za-z_]\w*)\})")


def _refuse_empty_paths(cfg: ConfigNode) -> None:
    for key, instead in EMPTY_PATHS.items():
        value = cfg.get(key)
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, str) and not v.strip() for v in values):
            what = "holds an empty path" if isinstance(value, (list, tuple)) else "is empty"
            raise ConfigError(f"{key} {what} ({key}={format_flow(value)}): {instead}")
        # '$HOME/runs' from a YAML file, a quoted shell argument or Python: nothing expands it, so the run would
        # write into (or look for) a folder named '$HOME' under the current one.
        variable = next((m for v in values if isinstance(v, str) for m in [_ENV_VARIABLE.search(v)] if m), None)
        if variable:
            name = variable.group(1) or variable.group(2)
            raise ConfigError(f"{key}={format_flow(value)} holds {variable.group(0)}, which nothing expands here (a "
                              f"shell does so only outside quotes, YAML and Python never): write ${{oc.env:{name}}} "
                              f"in its place, or the path itself")


def _refuse_a_run_without_steps_or_validation(cfg: ConfigNode) -> None:
    """total_training_steps=0 only validates (verl's trainer.val_only); with nothing to validate the run
    would load the models, train nothing, and export the model it was given, with exit code 0."""
    trainer, data = cfg.trainer, cfg.data
    if trainer.total_training_steps != 0:
        return
    has_val = data.val_files is not None or data.train_files is None  # the built-in task brings its own
    if has_val and trainer.val_before_train:
        return
    why = "trainer.val_before_train=false" if has_val else "no data.val_files is given"
    raise ConfigError(f"trainer.total_training_steps=0 trains no step (it only validates), and {why}: the run "
                      f"would do nothing; set trainer.total_training_steps to the number of steps, or leave it out "
                      f"(null) to train trainer.total_epochs; to only validate, give data.val_files and "
                      f"trainer.val_before_train=true")


# verl's other loggers, passed by the config check: the tracker refuses them by name when the run starts, but
# "file", verl's JSON lines, which is metrics.jsonl here (verl.tracking.tracker.FILE_LOGGER).
VERL_ONLY_LOGGERS = ("mlflow", "swanlab", "vemlp_wandb", "clearml", "trackio", "file")


def check_loggers(cfg: ConfigNode, keys=("trainer.logger", "logger.type")) -> None:
    """A misspelt logger name is said with the config, before the data and models load."""
    for key in keys:
        value = cfg.get(key)
        names = [value] if isinstance(value, str) else list(value or [])
        for name in names:
            if name in LOGGER_NAMES or name in VERL_ONLY_LOGGERS:
                continue
            if isinstance(name, str) and "," in name:
                raise ConfigError(f"{key}={name!r} is one name holding commas; write a list: "
                                  f"{key}=[{','.join(n.strip() for n in name.split(','))}]")
            close = closest_name(name, LOGGER_NAMES, cutoff=0.6)
            hint = f"did you mean {close!r}? " if close else ""
            raise ConfigError(f"unknown logger {name!r} in {key}={format_flow(value)}; {hint}"
                              f"choose from {', '.join(LOGGER_NAMES)}")


def _check_custom_reward(custom, section: str) -> None:
    """A function name or arguments without the file to find them in would be ignored, and the run
    scored by the built-in scorers instead of the function meant."""
    if custom.path:
        return
    given = [f"{section}.{key}={value!r}" for key, value, unset in
             (("name", custom.name, "compute_score"), ("reward_kwargs", dict(custom.reward_kwargs), {}))
             if value != unset]
    if given:
        raise ConfigError(f"{' and '.join(given)} without {section}.path: the function is read from that file, so "
                          f"nothing would load it and the built-in scorers would score the run; set "
                          f"{section}.path=my_reward.py (the file that defines it)")


def _check_rollout_pool(cfg: ConfigNode) -> None:
    """verl's top-level ``rollout.nnodes`` / ``n_gpus_per_node`` size the rollout of an asynchronous run, and
    ``async_training.rollout_placement`` places it; a synchronous run would ignore them, so they are refused
    there rather than dropped."""
    pool, a = cfg.rollout, cfg.async_training
    given = [f"rollout.{key}={value}" for key, value in (("nnodes", pool.nnodes), ("n_gpus_per_node",
                                                                                    pool.n_gpus_per_node)) if value != 1]
    if a.rollout_placement != "process":
        given.append(f"async_training.rollout_placement={a.rollout_placement}")
    if not a.enable and given:
        given = " ".join(given)
        raise ConfigError(f"{given} sizes or places the rollout of an asynchronous run, and async_training.enable is "
                          f"false: a synchronous run generates on the trainer's own ranks (trainer.nnodes x "
                          f"trainer.n_gpus_per_node). Set async_training.enable=true for a rollout of its own, or "
                          f"drop {given}")


def check_fsdp_size(key: str, value: int) -> None:
    """``fsdp_size`` is -1 (all ranks) or a number of ranks; the schema's range (>= -1) lets 0 through."""
    if value == 0:
        raise ConfigError(f"{key}=0 is not a number of ranks: use -1 (shard over all ranks) or a divisor of "
                          f"the world size")


def _warn_if_greedy_groups(cfg: ConfigNode) -> None:
    """Greedy decoding (temperature 0 or do_sample=false) gives every sample of a prompt the same
    response, so a group baseline makes every advantage 0: the run would train on nothing."""
    rollout = cfg.actor_rollout_ref.rollout
    estimator = cfg.algorithm.adv_estimator
    greedy = [f"rollout.{key}" for key, on in (("temperature=0", rollout.temperature == 0),
                                                ("do_sample=false", not rollout.do_sample)) if on]
    if greedy and rollout.n > 1 and estimator in SAME_SAMPLES_ZERO_ADVANTAGE:
        logger.warning("algorithm.adv_estimator=%s with actor_rollout_ref.%s decodes greedily: the %d samples of a "
                       "prompt are the same response, so their advantages are all 0 and the actor does not learn; "
                       "sample instead (actor_rollout_ref.rollout.temperature=1.0, do_sample=true)",
                       estimator, " and ".join(greedy), rollout.n)


# Settings that act only under a switch: (switch, the settings it enables). verl's recipes set
# kl_loss_coef and use_kl_loss together; set without the switch, the coefficient is read by nothing.
SWITCHED_SETTINGS = (
    ("actor_rollout_ref.actor.use_kl_loss", ("actor_rollout_ref.actor.kl_loss_coef",
                                             "actor_rollout_ref.actor.kl_loss_type")),
    ("algorithm.use_kl_in_reward", ("algorithm.kl_ctrl.kl_coef", "algorithm.kl_ctrl.type",
                                    "algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.horizon")),
)


def warn_if_resume_path_unused(trainer) -> None:
    """``trainer.resume_from_path`` given while ``resume_mode`` does not read it (RL and offline trainers)."""
    if trainer.resume_from_path and trainer.resume_mode != "resume_path":
        logger.warning("trainer.resume_from_path=%s has no effect: trainer.resume_mode=%s %s; set "
                       "trainer.resume_mode=resume_path to resume from it", trainer.resume_from_path,
                       trainer.resume_mode,
                       "starts from step 0" if trainer.resume_mode == "disable" else
                       "resumes from the newest checkpoint in trainer.default_local_dir, if any")


def _warn_if_switched_off(cfg: ConfigNode) -> None:
    """A setting changed from its default while the switch it belongs to is off: one warning per switch."""
    defaults = type(cfg)()
    warn_if_resume_path_unused(cfg.trainer)
    _warn_if_no_critic_reads(cfg)
    for switch, keys in SWITCHED_SETTINGS:
        if cfg.get(switch):
            continue
        given = [f"{key}={format_flow(cfg.get(key))}" for key in keys if cfg.get(key) != defaults.get(key)]
        if given:
            many = len(given) > 1
            logger.warning("%s %s no effect: %s=false turns it off; set %s=true to use it, or leave %s at the "
                           "default", " and ".join(given), "have" if many else "has", switch, switch,
                           "them" if many else "it")


def _warn_if_no_critic_reads(cfg: ConfigNode) -> None:
    """Critic settings in a run that trains no critic (a PPO launch turned into GRPO, a critic.model.path
    given to GRPO): said once, with the estimator that leaves the critic out."""
    if critic_enabled(cfg):
        return
    said = {entry.owner._path(entry.spec.name) for entry, rule in verl_rules.rules(cfg.critic) if rule.inert}
    given = [f"critic.{item}" for item in cfg.critic.to_overrides()
             if not item.startswith("enable=") and f"critic.{item.split('=', 1)[0]}" not in said]  # said apart
    if given:
        why = ("critic.enable=false turns it off" if cfg.critic.enable is False else
               f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} trains no critic (only "
               f"{', '.join(CRITIC_ESTIMATORS)} does)")
        logger.warning("%s %s no effect: %s; set algorithm.adv_estimator=gae to train with a critic, or leave %s at "
                       "the default", ", ".join(given[:3]) + (", ..." if len(given) > 3 else ""),
                       "have" if len(given) > 1 else "has", why, "them" if len(given) > 1 else "it")


def _check_token_budgets(cfg: ConfigNode) -> None:
    arr, critic = cfg.actor_rollout_ref, cfg.critic
    meaning = "tokens per micro-batch with dynamic batch size"
    _at_least(f"{_ACTOR}.ppo_max_token_len_per_gpu", arr.actor.ppo_max_token_len_per_gpu, 1, meaning)
    for role in ("rollout", "ref"):
        _at_least(f"actor_rollout_ref.{role}.log_prob_max_token_len_per_gpu",
                  getattr(arr, role).log_prob_max_token_len_per_gpu, 1, meaning)
    _at_least("critic.ppo_max_token_len_per_gpu", critic.ppo_max_token_len_per_gpu, 1, meaning)
    _at_least("critic.forward_max_token_len_per_gpu", critic.forward_max_token_len_per_gpu, 1, meaning)
    _warn_if_a_sample_outgrows_its_budget(cfg)


def _warn_if_a_sample_outgrows_its_budget(cfg: ConfigNode) -> None:
    """A token budget of dynamic batch size below the longest sample the data settings allow: such a sample
    runs alone in a micro-batch past the budget (memory the budget was meant to cap; verl stops there).
    Said once, naming each budget and the sum it is below."""
    arr, critic, data = cfg.actor_rollout_ref, cfg.critic, cfg.data
    longest = data.max_prompt_length + data.max_response_length
    budgets = {f"{_ACTOR}.ppo_max_token_len_per_gpu": arr.actor.ppo_max_token_len_per_gpu if arr.actor.use_dynamic_bsz
               else None,
               "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": log_prob_token_budget(arr, "rollout"),
               "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": log_prob_token_budget(arr, "ref")}
    if critic.use_dynamic_bsz:
        budgets["critic.ppo_max_token_len_per_gpu"] = critic.ppo_max_token_len_per_gpu
        budgets["critic.forward_max_token_len_per_gpu"] = (critic.forward_max_token_len_per_gpu
                                                            or critic.ppo_max_token_len_per_gpu)
    below = [f"{key}={budget}" for key, budget in budgets.items() if budget is not None and budget < longest]
    if below:
        logger.warning("%s %s below the longest sample, data.max_prompt_length + data.max_response_length = %d tokens: "
                       "with dynamic batch size a sample longer than its budget runs alone in a micro-batch of more "
                       "tokens than the budget allows (verl stops there); raise %s to at least %d (verl's advice: a "
                       "few times that)", ", ".join(below), "is" if len(below) == 1 else "are", longest,
                       "it" if len(below) == 1 else "them", longest)


def _check_seq_len(data) -> None:
    """data.seq_len is a ceiling on a sample's tokens: the longest prompt plus the longest response fit."""
    if data.seq_len is None:
        return
    total = data.max_prompt_length + data.max_response_length
    if total > data.seq_len:
        raise ConfigError(f"data.seq_len={data.seq_len} is the most tokens a sample may hold, but "
                          f"data.max_prompt_length={data.max_prompt_length} + data.max_response_length="
                          f"{data.max_response_length} = {total}: lower those two so that they sum to at most "
                          f"{data.seq_len}, or raise data.seq_len (null = no ceiling)")


def _check_dapo(cfg: ConfigNode) -> None:
    """DAPO switches (dynamic sampling, overlong shaping) and the rollout importance ratio."""
    groups = cfg.algorithm.filter_groups
    if groups.enable:
        if cfg.actor_rollout_ref.rollout.n < 2:
            raise ConfigError(f"algorithm.filter_groups.enable=true keeps prompts whose responses score "
                              f"differently, which needs {_N_KEY} >= 2 (it is {cfg.actor_rollout_ref.rollout.n})")
        _at_least("algorithm.filter_groups.max_num_gen_batches", groups.max_num_gen_batches, 1,
                  "prompt batches drawn per step, the first included")
    buffer = cfg.reward_model.overlong_buffer
    max_len = cfg.data.max_response_length
    if buffer.enable and buffer.len is not None and not 1 <= buffer.len <= max_len:
        raise ConfigError(f"reward_model.overlong_buffer.len={buffer.len} must be between 1 and "
                          f"data.max_response_length={max_len} (the penalty covers the last len tokens)")
    if buffer.enable and buffer.penalty_factor < 0:
        raise ConfigError(f"reward_model.overlong_buffer.penalty_factor={buffer.penalty_factor} must be >= 0 "
                          f"(it is the size of a penalty)")
    threshold = cfg.actor_rollout_ref.actor.rollout_is_threshold
    if threshold <= 0:
        raise ConfigError(f"{_ACTOR}.rollout_is_threshold={threshold} must be > 0 (cap of the rollout "
                          f"importance ratio); the usual value is 2.0")


def overlong_buffer_len(cfg: ConfigNode) -> int:
    """The penalty buffer in tokens: `reward_model.overlong_buffer.len`, or a fifth of the maximum length."""
    buffer = cfg.reward_model.overlong_buffer
    return buffer.len if buffer.len is not None else max(1, cfg.data.max_response_length // 5)
