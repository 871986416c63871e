"""The agent loop's side of a tool call (:class:`verl.agent.agent_loop.AgentLoop` takes it as a mixin): run
one parsed call with its timeout and turn what it returned into the text (and images) the model reads,
create each trajectory's tool instances and score and release them at its end. A failing call is the
model's feedback; a tool that breaks its contract (a wrong return, a NaN reward, a hung or raising create,
calc_reward or release) stops the run naming it."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math

from verl.agent.env import maybe_await
from verl.agent.events import UserCodeExited, named
from verl.agent.trajectory import Trajectory
from verl.errors import VerlError
from verl.models.vision import is_vision_model
from verl.tools.function_tool import FunctionTool, normalize_tool_result
from verl.tools.schemas import OpenAIFunctionCallSchema, ToolResponse


class ToolCalls:
    """Needs ``self.tools`` (name -> tool), ``self.settings`` (AgentSettings) and ``self.engine``."""

    def _check_images(self, name: str, response) -> list:
        """The images of a tool's response, which the policy must be able to read (else one line)."""
        if response.video:
            raise VerlError(f"tool {name} returned {len(response.video)} video(s): a tool's videos are not supported "
                            f"here; return images (ToolResponse(image=[...])) or text")
        if not response.image:
            return []
        model = getattr(self.engine, "model", None)
        if model is None or not is_vision_model(model):
            kind = getattr(getattr(model, "config", None), "model_type", "the rollout engine's")
            raise VerlError(f"tool {name} returned {len(response.image)} image(s), and the policy ({kind}) is a text "
                            f"model that cannot read them: return text from the tool, or train a vision-language "
                            f"model (docs/vision.md)")
        from verl.data.vision import load_image

        # the forms a dataset's images take (PIL, {"bytes"}, {"path"}, a path); anything else is named
        return [load_image(image, f"tool {name}'s image {i}") for i, image in enumerate(response.image)]

    async def _call(self, trajectory: Trajectory, parsed) -> tuple[str, list]:
        """A call's text for the conversation and the images it returned (a failed call: an error text)."""
        call, bad_json = OpenAIFunctionCallSchema.from_openai_function_parsed_schema(parsed)
        tool = self.tools.get(call.name)
        if tool is None or bad_json:
            trajectory.tool_errors += 1
            return (f"Error: no tool named {call.name!r}; tools: {', '.join(self.tools)}" if tool is None
                    else f"Error: the arguments of {call.name} are not a JSON object"), []
        label = f"tool {call.name} (row {trajectory.row}, turn {trajectory.assistant_turns})"
        try:
            if isinstance(tool, FunctionTool):
                coroutine = tool.invoke(call.arguments)
            else:
                coroutine = tool.execute(trajectory.instances[call.name], call.arguments)
            result = await asyncio.wait_for(named(coroutine, label), self.settings.tool_timeout_s)
        except asyncio.TimeoutError:
            trajectory.tool_errors += 1
            return f"Error: {call.name} did not answer within {self.settings.tool_timeout_s:g} s", []
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if getattr(task, "cancelling", None) is None or task.cancelling():  # the rollout is being cancelled
                raise
            trajectory.tool_errors += 1  # something inside the tool was cancelled: its call failed
            return f"Error: {call.name} was cancelled", []
        except UserCodeExited:
            raise
        except Exception as e:  # noqa: BLE001 - a failing tool is the model's feedback, not the run's end
            trajectory.tool_errors += 1
            return f"Error: {type(e).__name__}: {e}", []
        # what the tool returned is checked outside the try: a broken tool is the run's problem, not the model's
        if isinstance(result, tuple) and len(result) == 3:
            response, reward, _ = result
        elif not isinstance(tool, FunctionTool) and not isinstance(result, (str, ToolResponse)):
            raise VerlError(f"{label}: execute returned {result!r:.120}; a tool's execute returns (ToolResponse, "
                            f"reward, metrics), e.g. (ToolResponse(text=...), 0.0, {{}})")
        else:  # a function's value: shown to the model (as JSON where it is not text)
            response, reward = result, 0.0
        response = normalize_tool_result(response)[0]
        reward = reward_of(reward, f"{label}: execute", trajectory)
        trajectory.tool_reward += reward
        trajectory.tool_rewards.append(reward)
        return response.text or "", self._check_images(call.name, response)

    async def _tool_method(self, trajectory: Trajectory, name: str, method: str, *args, **kwargs):
        """``self.tools[name].<method>(*args, **kwargs)`` of a trajectory's tool instance (create, calc_reward,
        release): one that raises or does not return within tool_timeout_s stops the run naming it."""
        label = f"tool {name}'s {method} (row {trajectory.row})"
        timeout = self.settings.tool_timeout_s
        try:
            return await asyncio.wait_for(named(getattr(self.tools[name], method)(*args, **kwargs), label), timeout)
        except asyncio.TimeoutError:
            raise VerlError(f"{label} did not return within {timeout:g} s (multi_turn.tool_timeout_s): it is not a "
                            f"call of the model's, so nothing can be answered; make it return (or raise the "
                            f"timeout)") from None
        except UserCodeExited:
            raise
        except Exception as e:
            raise VerlError(f"{label} raised {type(e).__name__}: {str(e)[:300]}") from e

    async def _create_instances(self, trajectories: list[Trajectory], tools_kwargs) -> None:
        stateful = {name: tool for name, tool in self.tools.items() if not isinstance(tool, FunctionTool)}
        if not stateful:
            return
        takes = {name: _create_parameters(tool) for name, tool in stateful.items()}  # once, not per row

        async def create(trajectory, kwargs):
            for name, tool in stateful.items():
                given = dict((kwargs or {}).get(name, {}).get("create_kwargs", {}))
                absent = [p for p in takes[name] if p not in given]
                if absent:  # e.g. a ground truth the tool scores against: its default would score every call alike
                    trajectory.defaulted += 1
                    warn_once(f"tool {name}.create", f"tool {name}: rows without extra_info.tools_kwargs.{name}."
                              f"create_kwargs.{absent[0]} (first: row {trajectory.row}) create it with the default "
                              f"of {', '.join(absent)}; agent/defaulted_values counts them")
                created = await self._tool_method(trajectory, name, "create", **given)
                trajectory.instances[name] = created[0] if isinstance(created, tuple) else created
        await asyncio.gather(*(create(t, as_dict(k)) for t, k in zip(trajectories, tools_kwargs)))

    async def _finish_instances(self, trajectories: list[Trajectory]) -> None:
        async def finish(trajectory):
            for name, instance in trajectory.instances.items():
                try:
                    reward = await self._tool_method(trajectory, name, "calc_reward", instance)
                    trajectory.tool_reward += reward_of(reward, f"tool {name}'s calc_reward (row {trajectory.row})",
                                                         trajectory)
                finally:  # released also when its reward failed
                    await self._tool_method(trajectory, name, "release", instance)
            close = getattr(trajectory.env, "close", None)
            if callable(close):
                await maybe_await(close())
        await asyncio.gather(*(finish(t) for t in trajectories if t.instances or t.env is not None))


_warned: set[str] = set()
logger = logging.getLogger(__name__)


def warn_once(key: str, message: str) -> None:
    """Log ``message`` the first time this process meets ``key``."""
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)


def reward_of(value, label: str, trajectory: Trajectory, kind: str = "tool") -> float:
    """A tool's or an environment turn's reward (``kind``): None (it gave none) is 0, warned once per ``label``
    without its row and counted in agent/defaulted_values; anything else that is not a finite number stops the
    run (a NaN would reach the advantages)."""
    if value is None:
        trajectory.defaulted += 1
        warn_once(label.split(" (row")[0], f"{label} returned reward None: such rewards count 0, and "
                  f"agent/defaulted_values counts them; return 0.0 to say so")
        return 0.0
    try:
        reward = float(value)
    except (TypeError, ValueError):
        reward = math.nan
    if not math.isfinite(reward):
        raise VerlError(f"{label} returned reward {value!r:.100}: a {kind}'s reward must be a finite number (or None "
                        f"for none)")
    return reward


def _create_parameters(tool) -> list[str]:
    """The named parameters of ``tool.create`` a row's create_kwargs can set (not the instance id)."""
    try:
        parameters = inspect.signature(tool.create).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.name != "instance_id"
            and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]


def as_dict(value) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return {}
    return dict(value) if isinstance(value, dict) else {}
