"""Reward functions as the manager sees them: one callable, its name, weight and calling style.

Three calling styles are accepted, told apart by the function's parameters:

* verl's, one sample per call: ``compute_score(data_source, solution_str, ground_truth, extra_info)``
  returning a number or a dict with a ``"score"`` (its other keys are logged);
* TRL's, the whole batch in one call: ``f(prompts, completions, **kwargs) -> list[float]``, where
  ``kwargs`` holds the dataset columns (``ground_truth``, ``data_source``, ``extra_info``, ...). As in
  TRL, conversational prompts give conversational completions (``[{"role": "assistant", ...}]``).
* verl's batch reward manager's (``reward_model.reward_manager=batch``), the whole batch in one call:
  ``compute_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs)`` returning one
  number or ``{"score": ...}`` dict per response.

Either may be ``async def``: the samples of a verl-style async function are scored concurrently
(at most ``max_concurrency`` at a time), and async functions of both styles run concurrently
with one another.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import linecache
import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from verl.data.io import is_messages
from verl.errors import RewardError

logger = logging.getLogger(__name__)

TRL_PARAMETERS = ("prompts", "completions", "completion_ids")
SLOW_CALL_S = 60.0
"""A reward call running longer than this is said once, with where it is: a reward function that never
returns (a request without a timeout, a loop) otherwise leaves the run waiting without a word."""
BATCH_PARAMETERS = ("data_sources", "solution_strs", "ground_truths", "extra_infos")
STYLES = ("verl", "trl", "batch")


def _name_of(fn: Callable) -> str:
    inner = fn.func if isinstance(fn, functools.partial) else fn
    return getattr(inner, "__name__", None) or repr(inner)


def _is_async(fn: Callable) -> bool:
    inner = fn.func if isinstance(fn, functools.partial) else fn
    return inspect.iscoroutinefunction(inner) or inspect.iscoroutinefunction(getattr(inner, "__call__", None))


def _style(fn: Callable) -> str:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # some builtins and C callables have no signature: call them verl's way
        return "verl"
    if any(p in params for p in TRL_PARAMETERS):
        return "trl"
    return "batch" if any(p in params for p in BATCH_PARAMETERS) else "verl"


@dataclass
class RewardFunction:
    """One reward function with its weight; ``style`` is "verl", "trl" or "batch" (detected from the
    parameters when not given)."""

    fn: Callable[..., Any]
    weight: float = 1.0
    name: str = ""
    style: str = ""
    is_async: bool = field(init=False)

    def __post_init__(self):
        if not callable(self.fn):
            raise RewardError(f"reward function {self.name or self.fn!r} is a {type(self.fn).__name__}, "
                              f"not callable")
        self.name = self.name or _name_of(self.fn)
        self.style = self.style or _style(self.fn)
        if self.style not in STYLES:
            raise RewardError(f"reward function {self.name}: style must be one of {STYLES}, got {self.style!r}")
        self.is_async = _is_async(self.fn)
        _check_parameters(self)

    async def results(self, samples: list[dict], max_concurrency: int) -> list[Any]:
        """One raw result per sample, in order; an exception raised for a sample is returned in its
        place (the manager decides whether that stops the step). A batch (TRL-style or verl batch) function that raises
        or returns the wrong number of values raises ``RewardError`` naming the function."""
        if self.style != "verl":
            return await self._batch_results(samples)
        if not self.is_async:
            results = []
            with _SlowCalls(self.name) as watch:
                for i, s in enumerate(samples):
                    watch.begin(f"sample {i} (solution_str={s['response']!r:.60})")
                    results.append(_capture(lambda s=s: self.fn(**_verl_kwargs(s))))
            return results
        gate = asyncio.Semaphore(max(1, max_concurrency))

        async def one(sample):
            async with gate:
                try:
                    return await self.fn(**_verl_kwargs(sample))
                except Exception as e:  # noqa: BLE001 - reported per sample by the manager
                    return e
        return list(await asyncio.gather(*(one(s) for s in samples)))

    async def _batch_results(self, samples: list[dict]) -> list[Any]:
        kwargs = _trl_kwargs(samples) if self.style == "trl" else _batch_kwargs(samples)
        try:
            with _SlowCalls(self.name) as watch:
                watch.begin(f"the batch of {len(samples)} samples")
                out = self.fn(**kwargs)
            if inspect.isawaitable(out):
                out = await out
        except Exception as e:
            raise RewardError(f"reward function {self.name} raised {type(e).__name__}: {e} "
                              f"(called once for the batch of {len(samples)} samples)") from e
        taking = "(prompts, completions, **kwargs)" if self.style == "trl" else f"({', '.join(BATCH_PARAMETERS)})"
        if not isinstance(out, (list, tuple)) and not hasattr(out, "tolist"):
            raise RewardError(f"reward function {self.name} returned {type(out).__name__} {out!r:.200}; a function "
                              f"taking {taking} must return a list with one score per "
                              f"completion ({len(samples)} here)")
        if hasattr(out, "tolist"):  # a numpy array or tensor: [B], or [B, 1] as a model's scores come
            shape = tuple(getattr(out, "shape", ()))
            out = out.reshape(-1).tolist() if len(shape) == 2 and shape[1] == 1 else out.tolist()
        if not isinstance(out, (list, tuple)):  # np.mean(...) or a 0-d tensor: one number for the whole batch
            raise RewardError(f"reward function {self.name} returned one number ({out!r:.60}) for the batch of "
                              f"{len(samples)} completions; a function taking {taking} must return a list with one "
                              f"score per completion")
        out = list(out)
        if len(out) != len(samples):
            raise RewardError(f"reward function {self.name} returned {len(out)} scores for {len(samples)} "
                              f"completions; return exactly one score per completion")
        return out


# What every call passes by name, whatever the data (TRL's style also passes each extra_info key).
_ALWAYS = {"verl": ("data_source", "solution_str", "ground_truth", "extra_info"),
           "trl": (*TRL_PARAMETERS, "ground_truth", "data_source", "extra_info", "solution", "answer"),
           "batch": BATCH_PARAMETERS}
_DEFINE = {"verl": "def compute_score(data_source, solution_str, ground_truth, extra_info=None)",
           "trl": "def reward(prompts, completions, **kwargs) (TRL's style: kwargs holds the dataset's columns)",
           "batch": "def compute_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs) (verl's "
                    "batch reward manager: lists in, one score per response out)"}


def _check_parameters(function: RewardFunction) -> None:
    """A function that cannot take the arguments every call passes fails now, when it is loaded, not at
    the first step after the models have loaded (and, with reward.on_error=zero, not as a zero for every
    sample of the run)."""
    try:
        signature = inspect.signature(function.fn)
    except (TypeError, ValueError):  # no signature to read (some C callables): the call will tell
        return
    # TRL's style may also name a column of the data (an extra_info key), given at the call: only an
    # argument it cannot take is an error here.
    bind = signature.bind_partial if function.style == "trl" else signature.bind
    try:
        bind(**dict.fromkeys(_ALWAYS[function.style]))
    except TypeError as e:
        per_sample = function.style == "batch" and _style(function.fn) == "verl"  # reward_manager=batch said so
        raise RewardError(f"reward function {function.name}{signature} cannot be called with the arguments "
                          f"{', '.join(_ALWAYS[function.style])} ({e}); define it as {_DEFINE[function.style]}, "
                          f"with these parameter names" + (", or leave reward_model.reward_manager at naive to "
                                                           "call it once per response" if per_sample else "")) from None


class _SlowCalls:
    """Watches the calls made one after another in a ``with`` block from one thread (each begun with
    :meth:`begin`); one past :data:`SLOW_CALL_S` is said once, naming the function, what it scores and the
    line it is running now (read from the calling thread's stack). One helper thread per block, waking a
    few times per period: nothing per call."""

    def __init__(self, name: str):
        self.name, self.thread = name, threading.get_ident()
        self.what, self.started, self.said = "", time.monotonic(), False
        self.done = threading.Event()

    def begin(self, what: str) -> None:
        self.what, self.started, self.said = what, time.monotonic(), False

    def __enter__(self):
        threading.Thread(target=self._watch, daemon=True, name=f"reward-watch-{self.name}").start()
        return self

    def __exit__(self, *exc):
        self.done.set()

    def _watch(self) -> None:
        while not self.done.wait(SLOW_CALL_S / 4):
            if self.said or time.monotonic() - self.started < SLOW_CALL_S:
                continue
            self.said = True
            frame = _own_frame(sys._current_frames().get(self.thread))
            where = ""
            if frame is not None:
                line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
                where = f"; it is at {frame.f_code.co_filename}:{frame.f_lineno} ({line!r:.80}) now"
            logger.warning("reward function %s has been scoring %s for over %.0f s and has not returned%s; the step "
                           "waits for it. A loop, or a call that never returns (a request without a timeout)? Give "
                           "the call a time limit, or stop the run (Ctrl-C shows where it is)", self.name, self.what,
                           SLOW_CALL_S, where)


def _own_frame(frame):
    """The innermost frame of ``frame``'s stack that is the user's code, not the standard library's or an
    installed package's (a hung ``requests.get`` is reported at the line that called it)."""
    import sysconfig

    libraries = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})
    innermost = frame
    while frame is not None and frame.f_code.co_filename.startswith(libraries):
        frame = frame.f_back
    return frame or innermost


def _capture(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - reported per sample by the manager
        return e


def _verl_kwargs(sample: dict) -> dict:
    return {"data_source": sample["data_source"], "solution_str": sample["response"],
            "ground_truth": sample["ground_truth"], "extra_info": sample["extra_info"]}


def _batch_kwargs(samples: list[dict]) -> dict:
    return {"data_sources": [s["data_source"] for s in samples], "solution_strs": [s["response"] for s in samples],
            "ground_truths": [s["ground_truth"] for s in samples], "extra_infos": [s["extra_info"] for s in samples]}


def _trl_kwargs(samples: list[dict]) -> dict:
    prompts = [s["raw_prompt"] if s["raw_prompt"] is not None else s["prompt_text"] for s in samples]
    completions = [[{"role": "assistant", "content": s["response"]}] if is_messages(p) else s["response"]
                   for s, p in zip(samples, prompts)]
    kwargs = {"prompts": prompts, "completions": completions,
              "completion_ids": [s["response_ids"] for s in samples]}
    for key in ("ground_truth", "data_source", "extra_info"):
        kwargs[key] = [s[key] for s in samples]
    # TRL passes every dataset column by name; extra_info's keys are the extra columns here.
    # Two common names are also given as aliases of the ground truth.
    extra_keys = {k for s in samples if isinstance(s["extra_info"], dict) for k in s["extra_info"]}
    for key in sorted(extra_keys - kwargs.keys()):
        kwargs[key] = [(s["extra_info"] or {}).get(key) for s in samples]
    for alias in ("solution", "answer"):
        kwargs.setdefault(alias, kwargs["ground_truth"])
    return kwargs


def run_all(functions: list[RewardFunction], samples: list[dict], max_concurrency: int) -> list[list[Any]]:
    """Every function's raw results (``[function][sample]``); async functions run concurrently."""
    async def gather():
        return await asyncio.gather(*(f.results(samples, max_concurrency) for f in functions))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return list(asyncio.run(gather()))
    # Called from inside a running event loop (e.g. a notebook): run ours on a helper thread.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        return list(pool.submit(asyncio.run, gather()).result())
