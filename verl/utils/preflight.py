"""Clear errors for the problems new users hit first (the tutorial's troubleshooting table).

Each check is a pure function: it either returns a fixed value or raises a :class:`VerlError`
whose message names what was received, what was expected and the setting that fixes it.

* too-old PyTorch            -> :func:`check_torch_version` (run by ``import verl``)
* reward shape mismatch      -> :func:`normalize_reward`
* prompt longer than context -> :func:`check_context_length`
* CUDA out of memory         -> :func:`oom_hint` / :func:`explain_oom`

This module is imported by ``import verl``, so torch is imported inside the functions that need
it, never at module level: ``import verl`` stays fast.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from verl.errors import VerlError

if TYPE_CHECKING:
    import torch

MIN_TORCH = (2, 6)  # the public FSDP2 and DTensor APIs (fully_shard, distribute_tensor(src_data_rank=...))
TORCH_INSTALL_HINT = "pip install --upgrade 'torch>=2.6'"


# ------------------------------------------------------------------------------------- torch
def check_torch_version(version_str: str | None) -> None:
    """Raise ImportError unless ``version_str`` (``torch.__version__``) is at least 2.6.

    Only the release number counts: ``"2.6.0a0"`` (a nightly of 2.6) and ``"2.13.0+cpu"`` pass,
    ``"2.3.1+cu121"`` fails. None means torch is not installed.
    """
    if version_str is None:
        raise ImportError(f"verl needs PyTorch >= {_dotted(MIN_TORCH)}, and torch is not installed. "
                          f"Install it with: {TORCH_INSTALL_HINT}")
    match = re.match(r"(\d+)\.(\d+)", version_str)
    if match is None:
        raise ImportError(f"cannot read the PyTorch version {version_str!r}; verl needs PyTorch >= "
                          f"{_dotted(MIN_TORCH)}. Reinstall it with: {TORCH_INSTALL_HINT}")
    found = (int(match.group(1)), int(match.group(2)))
    if found < MIN_TORCH:
        raise ImportError(f"verl needs PyTorch >= {_dotted(MIN_TORCH)} (FSDP2, torch.compile), found "
                          f"{version_str}. Upgrade with: {TORCH_INSTALL_HINT} "
                          f"(for CUDA builds add the index URL of your CUDA version, e.g. "
                          f"--index-url https://download.pytorch.org/whl/cu121)")


def installed_torch_version() -> str | None:
    """torch's version from the installed package's metadata (without importing torch), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def _dotted(parts: tuple[int, ...]) -> str:
    return ".".join(map(str, parts))


# ------------------------------------------------------------------------------------ reward
def normalize_reward(reward: Any, batch_size: int) -> torch.Tensor:
    """One finite float reward per row, shape ``[B]`` (see :func:`_reward_vector`); a NaN or infinite
    reward, which would turn the whole update into NaN, is an error naming its row."""
    import torch

    values = _reward_vector(reward, batch_size).float()
    bad = (~torch.isfinite(values)).nonzero().flatten().tolist()
    if bad:
        raise VerlError(f"reward of row {bad[0]} is {values[bad[0]].item()} ({len(bad)} row(s) not finite); every "
                        f"reward must be a finite number: check the reward model or function for a division by "
                        f"zero or an empty input")
    return values


def _reward_vector(reward: Any, batch_size: int) -> torch.Tensor:
    """One reward per row, shape ``[B]``, from what a reward model or function returned.

    Accepted: a Python number or 0-d tensor when ``batch_size`` is 1 (the tutorial's scalar
    reward), and a tensor / numpy array / list of shape ``[B]``, ``[B, 1]`` or ``[1, B]``.
    A scalar for several rows is an error, not a broadcast: one score for a whole batch is
    almost always a reward function that reduced over the batch by mistake.
    """
    import numpy as np
    import torch

    expected = f"[B] with B={batch_size}"
    if isinstance(reward, (bool, int, float, np.number, np.bool_)):
        values = torch.tensor([float(reward)])
        if batch_size != 1:
            raise VerlError(f"reward is a single number ({float(reward):g}) but the batch has {batch_size} "
                            f"rows; return one reward per row, shape {expected}")
        return values
    if isinstance(reward, torch.Tensor):
        values = reward.detach()
    elif isinstance(reward, (np.ndarray, list, tuple)):
        rows = reward.reshape(-1) if isinstance(reward, np.ndarray) else reward
        none = next((i for i, v in enumerate(rows) if v is None or isinstance(v, (list, tuple)) and None in v), None)
        if none is not None:  # numpy reads None as nan: "reward of row 0 is nan" said a number was computed
            raise VerlError(f"reward of row {none} is None; every row needs a finite number (did the reward "
                            f"function return nothing for it?)")
        try:
            values = torch.as_tensor(np.asarray(reward, dtype=np.float64))
        except (TypeError, ValueError) as exc:
            raise VerlError(f"reward must hold numbers, one per row ({expected}); could not read "
                            f"{type(reward).__name__} {reward!r:.200} ({exc})") from None
    else:
        raise VerlError(f"reward must be a number, a tensor, a numpy array or a list of shape {expected}; "
                        f"got {type(reward).__name__}")
    if values.is_complex():
        raise VerlError(f"reward must hold real numbers, got dtype {values.dtype} of shape {list(values.shape)}")
    shape = tuple(values.shape)
    if shape == () and batch_size == 1:
        values = values.reshape(1)
    elif shape in ((batch_size,), (batch_size, 1), (1, batch_size)):
        values = values.reshape(batch_size)
    else:
        fix = " (a scalar reward needs a batch of 1)" if shape == () else ""
        raise VerlError(f"reward has shape {list(shape)} but the batch has {batch_size} rows; expected "
                        f"shape {expected}, or [B, 1]{fix}")
    return values.float()


# ---------------------------------------------------------------------------- context length
CONTEXT_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def model_context_length(model_config: Any) -> tuple[str, int] | None:
    """``(attribute name, limit)`` of a Hugging Face model config, or None when it states none.

    Architectures name the limit differently (Llama/Qwen: max_position_embeddings, GPT-2:
    n_positions, others: max_sequence_length or seq_length); the first one present counts.
    """
    if hasattr(model_config, "get_text_config"):  # a vision-language model: its language model's limit
        model_config = model_config.get_text_config()
    for name in CONTEXT_LENGTH_KEYS:
        value = getattr(model_config, name, None)
        if isinstance(value, int) and value > 0:
            return name, value
    return None


def check_context_length(model_config: Any, prompt_length: int, response_length: int | None = 0, *,
                         truncation_key: str = "data.truncation",
                         max_prompt_key: str = "data.max_prompt_length",
                         max_response_key: str = "data.max_response_length",
                         filter_key: str | None = "data.filter_overlong_prompts") -> None:
    """Raise when ``prompt_length + response_length`` tokens do not fit the model's context.

    The message names both lengths, the model's limit and the settings that fix it (``filter_key``:
    the switch that drops long prompts, None where there is none). A config without a stated limit
    is not checked.
    """
    found = model_context_length(model_config)
    if found is None:
        return
    name, limit = found
    response_length = response_length or 0
    total = prompt_length + response_length
    if total <= limit:
        return
    # The setting to lower first: the one that leaves the other room (a response of the whole context
    # leaves a prompt none, so "prompt to 0 or less" would be no advice).
    if response_length < limit:
        lower = f"{max_prompt_key} (to {limit - response_length} or less with the current response length) and/or " \
                f"{max_response_key}"
    else:
        lower = f"{max_response_key} (to {max(limit - prompt_length, 1)} or less with the current prompt length) " \
                f"and/or {max_prompt_key}"
    raise VerlError(
        f"input length exceeds the model's maximum context length: prompt {prompt_length} + response "
        f"{response_length} = {total} tokens, but the model takes at most {limit} ({name} in its "
        f"config.json). Lower {lower} so that they sum to at most {limit}; prompts longer than {max_prompt_key} "
        f"raise unless {truncation_key}=left (keep the end of the prompt) or {truncation_key}=right"
        + (f", or are dropped with {filter_key}=true" if filter_key else ""))


# ------------------------------------------------------------------------------ out of memory
# Settings that lower each role's peak memory, by WorkerGroup name. `offload_keys` are switches
# that trade speed for memory (set them to true); `micro_batch_keys` are sizes to make smaller.
ROLE_OOM_HINTS: dict[str, dict[str, tuple[str, ...]]] = {
    "actor_rollout_ref": {
        "offload_keys": ("actor_rollout_ref.actor.fsdp_config.param_offload",
                         "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
                         "actor_rollout_ref.ref.fsdp_config.param_offload",
                         "actor_rollout_ref.model.enable_gradient_checkpointing"),
        "micro_batch_keys": ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
                             "data.train_batch_size",
                             "actor_rollout_ref.rollout.gpu_memory_utilization"),
    },
    "critic": {
        "offload_keys": ("critic.fsdp_config.param_offload", "critic.fsdp_config.optimizer_offload",
                         "critic.model.enable_gradient_checkpointing"),
        "micro_batch_keys": ("critic.ppo_micro_batch_size_per_gpu", "data.train_batch_size"),
    },
    "reward": {
        "offload_keys": (),
        "micro_batch_keys": ("reward_model.micro_batch_size_per_gpu", "data.train_batch_size"),
    },
}
DEFAULT_OOM_HINTS = ROLE_OOM_HINTS["actor_rollout_ref"]


def is_out_of_memory(exc: BaseException) -> bool:
    """True for ``torch.cuda.OutOfMemoryError`` and for RuntimeErrors that say "out of memory"."""
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def oom_hint(exc: BaseException, *, micro_batch_keys: Sequence[str], offload_keys: Sequence[str],
             role_name: str = "worker", method: str | None = None) -> VerlError | None:
    """A VerlError explaining an out-of-memory ``exc`` and listing the settings that help; None
    when ``exc`` is not an out-of-memory error."""
    if not is_out_of_memory(exc):
        return None
    where = f"{role_name}.{method}" if method else role_name
    lines = [f"{where} ran out of device memory. Settings that lower the {role_name} role's memory use:"]
    lines += [f"  {key}=true" for key in offload_keys]
    lines += [f"  a smaller {key}" for key in micro_batch_keys]
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    lines.append(f"(original error: {type(exc).__name__}: {first_line})")
    return VerlError("\n".join(lines))


@contextlib.contextmanager
def explain_oom(role_name: str, hints: Mapping[str, Sequence[str]] | None = None, *,
                method: str | None = None) -> Iterator[None]:
    """Re-raise an out-of-memory error inside the block as a VerlError (chained from it).

    ``hints`` holds ``micro_batch_keys`` and ``offload_keys``; None = this role's entry in
    :data:`ROLE_OOM_HINTS` (the actor's for unknown roles). Other errors pass unchanged.
    """
    try:
        yield
    except RuntimeError as exc:
        keys = hints if hints is not None else ROLE_OOM_HINTS.get(role_name, DEFAULT_OOM_HINTS)
        error = oom_hint(exc, micro_batch_keys=keys["micro_batch_keys"], offload_keys=keys["offload_keys"],
                         role_name=role_name, method=method)
        if error is None:
            raise
        raise error from exc
