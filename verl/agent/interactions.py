"""verl's interactions (simulated users), run as environments.

verl's interaction YAML (``actor_rollout_ref.rollout.multi_turn.interaction_config_path``)::

    interaction:
      - name: gsm8k                                   # optional: else the class name without "Interaction"
        class_name: my_package.my_interaction.Gsm8kInteraction
        config: {}                                    # passed to the class, with "name" added

Each dataset row picks its interaction with ``extra_info.interaction_kwargs`` (``{"name": "gsm8k",
...}``; all of it is passed to the interaction's calls). The class is verl's interface:
``start_interaction(instance_id, **interaction_kwargs)`` when a trajectory starts,
``generate_response(instance_id, messages, **interaction_kwargs) -> (should_terminate, reply,
turn_score, extra)`` after each assistant turn that calls no tool (``messages``: the conversation
so far, as chat messages), and ``finalize_interaction(instance_id)`` at the end. The reply goes into
the trajectory as a user message (out of the loss) unless the interaction ends; the turn scores are
logged as ``reward/turn_<k>/mean`` and reach the reward function in ``extra_info["turn_scores"]``.

Here one instance of each class serves all trajectories, told apart by ``instance_id``, as in
verl. A reply on the turn that ends the interaction is not added (verl adds it; nothing is trained
after it either way).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from uuid import uuid4

from verl.agent.env import ENV_KEY, load_environment_class, maybe_await
from verl.errors import VerlError
from verl.tools.registry import import_class, yaml_entries

INTERACTION_KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"


def load_interactions(path: str | Path) -> dict[str, object]:
    """Interaction name -> the instance of its class, from verl's interaction YAML."""
    entries = yaml_entries(path, INTERACTION_KEY, "interaction", "class_name (and name, config)")
    interactions = {}
    for i, entry in enumerate(entries):
        where = f"{INTERACTION_KEY}={path}, interaction[{i}]"
        if not isinstance(entry, dict) or not entry.get("class_name"):
            raise VerlError(f"{where}: each entry needs a class_name (a mapping such as name: ..., class_name: "
                            f"pkg.module.MyInteraction), got {entry!r:.120}")
        dotted = str(entry["class_name"])
        cls = import_class(dotted, where)
        class_name = dotted.rpartition(".")[2]
        missing = [m for m in ("start_interaction", "generate_response") if not callable(getattr(cls, m, None))]
        if missing:
            raise VerlError(f"{where}: {dotted} has no {', '.join(missing)}: not an interaction class (verl's "
                            f"BaseInteraction interface)")
        simple = class_name[:-len("Interaction")] if class_name.endswith("Interaction") else class_name
        name = str(entry.get("name") or simple.lower())
        if name in interactions:
            raise VerlError(f"{where}: the name {name!r} is used twice")
        interactions[name] = cls(config={**dict(entry.get("config") or {}), "name": name})
    return interactions


def interaction_environment(path: str | Path) -> type:
    """An environment class (:mod:`verl.agent.env`) over the interactions of ``path``, loaded once."""
    interactions = load_interactions(path)

    class VerlInteraction:
        """One trajectory's side of the interaction its row names (``interactions``: name -> instance)."""

        METHODS = {"reset": "start_interaction", "step": "generate_response", "close": "finalize_interaction"}

        def describe(self, method: str) -> str:
            """What the loop's messages call ``method`` of this trajectory (the interaction's own method)."""
            inner = getattr(self, "interaction", None)
            return f"{type(inner).__name__}.{self.METHODS[method]}" if inner is not None else f"the interaction's {method}"

        async def reset(self, sample: dict) -> None:
            kwargs = _interaction_kwargs(sample.get("extra_info"))
            name = kwargs.get("name")
            if name is None and len(interactions) == 1:
                name = next(iter(interactions))
            if name not in interactions:
                raise VerlError(f"{INTERACTION_KEY}: the row's extra_info.interaction_kwargs.name={name!r} names no "
                                f"interaction of the file; it has {sorted(interactions)}")
            self.interaction, self.kwargs = interactions[name], kwargs
            prompt = sample.get("raw_prompt")
            self.messages = [dict(m) for m in (prompt.tolist() if hasattr(prompt, "tolist") else prompt or [])]
            self.instance_id = await maybe_await(self.interaction.start_interaction(uuid4().hex, **kwargs))
            return None

        async def step(self, message: str):
            self.messages.append({"role": "assistant", "content": message})
            result = await maybe_await(self.interaction.generate_response(self.instance_id, self.messages,
                                                                          **self.kwargs))
            if not (isinstance(result, tuple) and len(result) == 4):
                raise VerlError(f"{INTERACTION_KEY}: {type(self.interaction).__name__}.generate_response returned "
                                f"{result!r:.120}; it returns (should_terminate, reply, turn_score, extra)")
            done, reply, score, _ = result
            if not done and reply is None:
                raise VerlError(f"{INTERACTION_KEY}: {type(self.interaction).__name__}.generate_response returned no "
                                f"reply (None) with should_terminate=False: return the next user message, or "
                                f"should_terminate=True to end the interaction")
            if not done:
                self.messages.append({"role": "user", "content": str(reply)})
            return (None if done else reply), score, bool(done)  # a score of None is counted by the loop

        async def close(self) -> None:
            finalize = getattr(getattr(self, "interaction", None), "finalize_interaction", None)
            if callable(finalize):  # verl's base class takes no instance id, its examples do
                takes_id = len(inspect.signature(finalize).parameters) > 0
                await maybe_await(finalize(self.instance_id) if takes_id else finalize())

    VerlInteraction.interactions = interactions
    return VerlInteraction


def _interaction_kwargs(extra_info) -> dict:
    info = extra_info if isinstance(extra_info, dict) else {}
    kwargs = info.get("interaction_kwargs") or {}
    return dict(kwargs) if isinstance(kwargs, dict) else {}


def environment_of(multi_turn):
    """The environment class of a run's ``multi_turn`` section: its ``environment``, or an adapter over
    verl's ``interaction_config_path`` (this module), or None."""
    if multi_turn.environment and multi_turn.interaction_config_path:
        raise VerlError(f"{ENV_KEY} and actor_rollout_ref.rollout.multi_turn.interaction_config_path are both set: "
                        f"one side answers the model; keep one of them")
    if multi_turn.environment:
        return load_environment_class(multi_turn.environment)
    if multi_turn.interaction_config_path:
        return interaction_environment(multi_turn.interaction_config_path)
    return None
