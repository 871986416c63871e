"""Environments: interactive tasks where something answers each assistant turn.

An environment plays the other side of a conversation, one instance per trajectory::

    class GuessTheNumber(Environment):
        def reset(self, sample):                 # the dataset row: ground_truth, extra_info, ...
            self.secret = int(sample["ground_truth"])
            return "Guess my number between 1 and 100."     # a first user message, or None
        def step(self, message):                 # the model's turn, as text
            guess = int(message.strip())
            if guess == self.secret:
                return None, 1.0, True           # (reply, reward for this turn, done)
            return ("higher" if guess < self.secret else "lower"), 0.0, False

``reset`` and ``step`` may also be coroutines. The replies go into the trajectory as user messages
(rendered by the chat template, out of the loss, like tool results); the per-turn rewards add to
the reward function's score and are logged as ``reward/turn_<k>/mean``. Name the class with
``actor_rollout_ref.rollout.multi_turn.environment=path/to/file.py:ClassName`` (or
``package.module.ClassName``); the class is built with no arguments, once per trajectory.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

from verl.errors import VerlError

ENV_KEY = "actor_rollout_ref.rollout.multi_turn.environment"


class Environment:
    """The interface (subclassing it is optional: any class with ``reset`` and ``step`` works)."""

    def reset(self, sample: dict) -> str | None:
        """Start an episode for one dataset row; return a first user message, or None."""
        return None

    def step(self, message: str) -> tuple[str | None, float, bool]:
        """The model's message -> ``(reply, reward, done)``; a None reply also ends the episode."""
        raise NotImplementedError


async def maybe_await(value):
    return await value if inspect.isawaitable(value) else value


def load_environment_class(spec: str):
    """``path/to/file.py:ClassName`` or ``package.module.ClassName`` -> the class, checked."""
    if ":" in spec:
        path, _, name = spec.rpartition(":")
        file = Path(path).expanduser()
        if not file.is_file():
            raise VerlError(f"{ENV_KEY}={spec}: no such file {path}")
        module_name = f"verl_user_env_{abs(hash(str(file.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(module_name, file)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            raise VerlError(f"{ENV_KEY}={spec}: the file failed to run: {type(e).__name__}: {e}") from e
    else:
        module_name, _, name = spec.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise VerlError(f"{ENV_KEY}={spec}: cannot import {module_name} ({e}); give path/to/file.py:ClassName "
                            f"or an importable package.module.ClassName") from None
    cls = getattr(module, name, None)
    if not inspect.isclass(cls) or not all(callable(getattr(cls, m, None)) for m in ("reset", "step")):
        raise VerlError(f"{ENV_KEY}={spec}: {name} is not an environment class (a class with reset(sample) and "
                        f"step(message) methods)")
    return cls
