"""Multi-turn rollouts with tools: generate, find tool calls, run them, append the results, go on.

Token in, token out. A trajectory is the exact token ids the model generated, turn after turn,
with the tool results spliced in between as the chat template renders them. Earlier turns are
never decoded and tokenized again (that can change the ids, and then the log-probs the update
computes would not be those of what the model sampled). The layout is the single-turn one of
:data:`verl.protocol.FIELDS`, with the tool results inside ``responses``:

    responses       = [a1 a1 a1 eos | t t t t | a2 a2 eos | pad]
    response_mask   = [ 1  1  1  1  | 0 0 0 0 |  1  1  1  | 0 ]   model tokens only: the loss
    attention_mask  = [ 1  1  1  1  | 1 1 1 1 |  1  1  1  | 0 ]   everything the model read

A trajectory ends when the model answers without a tool call, after
``max_assistant_turns`` assistant turns, or when the response budget (``response_length``
tokens, all turns and tool results together) is spent.

A vision-language policy (docs/vision.md) sees its prompt's images in every turn, and a tool may
return images (``ToolResponse(image=[...])``): the tool message holds them as the processor renders
them (their pad tokens inside ``responses``, out of the loss), their pixels join the trajectory's
``multi_modal_inputs`` after the prompt's, in order, and every later turn reads them. A tool result
with images that does not fit in the response budget ends the trajectory whole (an image cut in half
would not match its pixels). A text policy refuses a tool's images with one line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import torch

from verl.agent.env import maybe_await
from verl.agent.events import EventLoop, UserCodeExited, named
from verl.agent.tool_calls import ToolCalls, as_dict, reward_of
from verl.agent.parsers import ParsedTurn, tool_parser
from verl.agent.trajectory import AgentSettings, Trajectory, truncate_text
from verl.data.chat import TURN_MARK
from verl.data.collate import left_pad
from verl.errors import VerlError
from verl.models.vision import MEDIA_COLUMN, media_of
from verl.protocol import Batch
from verl.rollout.base import RolloutEngine, SamplingParams, rollout_batch
from verl.rollout.seeding import mix
from verl.tools.base_tool import BaseTool
from verl.tools.function_tool import FunctionTool

logger = logging.getLogger(__name__)


class AgentLoop(ToolCalls):
    """Runs multi-turn rollouts on ``engine`` (any engine that generates from token ids)."""

    def __init__(self, engine: RolloutEngine, tokenizer, tools: dict[str, BaseTool | FunctionTool],
                 settings: AgentSettings | None = None, device: torch.device | str | None = None,
                 environment: type | None = None):
        """``device``: where the engine wants its inputs (the worker's device). ``environment``: a class
        with ``reset`` and ``step`` (:mod:`verl.agent.env`), built once per trajectory."""
        self.engine, self.tokenizer, self.tools, self.device = engine, tokenizer, tools, device
        self.environment = environment
        self.settings = settings or AgentSettings()
        self.parser = tool_parser(self.settings.format)
        self._events = EventLoop(stall_s=self.settings.tool_timeout_s)
        self._delta_prefix = None
        self._processor = None

    # ------------------------------------------------------------------ token pieces
    def message_ids(self, messages: list[dict]) -> list[int]:
        """Token ids the chat template puts after an assistant turn's end for ``messages`` (tool results
        or a user reply), through the next generation prompt. Rendered after a fixed stand-in
        conversation, so no earlier turn of the trajectory is re-tokenized."""
        return self.tokenizer(self._delta_text(messages), add_special_tokens=False)["input_ids"]

    def message_pieces(self, messages: list[dict], images: list) -> tuple[list[int], dict | None]:
        """:meth:`message_ids` of ``messages`` whose image parts hold ``images`` (in order), each image's
        pad widened to its tokens by the policy's processor, and the images' ``pixel_values`` /
        ``image_grid_thw`` (None without images)."""
        if not images:
            return self.message_ids(messages), None
        text = self._delta_text(messages)
        if self._processor is None:
            from verl.models.vision import load_processor

            self._processor = load_processor(self.tokenizer.name_or_path)
        placeholders = text.count(self._processor.image_token)
        if placeholders != len(images):
            raise VerlError(f"the chat template rendered {placeholders} image placeholder(s) for the {len(images)} "
                            f"image(s) tools returned: its tool messages must render image parts "
                            f"({{'type': 'image'}}) as the user's do")
        out = self._processor(text=[text], images=images, return_tensors="pt", padding=False, add_special_tokens=False)
        return out["input_ids"][0].tolist(), {"pixel_values": out["pixel_values"],
                                              "image_grid_thw": out["image_grid_thw"]}

    def _delta_text(self, messages: list[dict]) -> str:
        """What the chat template renders for ``messages`` after a finished assistant turn, through the
        next generation prompt. Rendered after a stand-in exchange whose assistant turn is a marker: the
        text after the marker and the eos token the template closes the turn with (Phi-3's <|end|>, the
        third of its generation config's); what the template adds after that eos (a line break, say)
        belongs to the next message. The stand-in turn is an earlier turn there, so a template that
        renders its last assistant turn otherwise (Qwen3's: an empty think block) gives the same text."""
        stand_in = [{"role": "user", "content": "?"}, {"role": "assistant", "content": TURN_MARK}]
        full = self.tokenizer.apply_chat_template(stand_in + messages, tokenize=False, add_generation_prompt=True)
        eos_texts = [eos for eos in map(self.tokenizer.decode, self.engine.eos_token_ids) if eos]
        at = full.find(TURN_MARK)
        rest = full[at + len(TURN_MARK):] if at >= 0 else ""
        closing = [eos for eos in eos_texts if rest.startswith(eos)]
        if closing:
            return rest[len(max(closing, key=len)):]
        # A template that closes the turn with no eos: the text after the stand-in exchange rendered alone.
        if self._delta_prefix is None:
            text = self.tokenizer.apply_chat_template(stand_in, tokenize=False)
            ends = [(text.rfind(eos), eos) for eos in eos_texts]
            cut, eos = max(ends, default=(-1, ""))
            self._delta_prefix = text[:cut + len(eos)] if cut >= 0 else text
        if not full.startswith(self._delta_prefix):
            raise ValueError("the chat template renders a conversation differently once messages follow it, and "
                             "closes an assistant turn with none of the model's eos tokens, so the text of the next "
                             "messages cannot be told apart; give a template whose assistant turns end with the eos "
                             "token (actor_rollout_ref.model.custom_chat_template)")
        return full[len(self._delta_prefix):]

    # ------------------------------------------------------------------ the loop
    def generate(self, prompts: Batch, params: SamplingParams, swap=None) -> Batch:
        """``prompts`` (left-padded, as for :meth:`RolloutEngine.generate`) -> ``n`` trajectories each.
        ``swap``: new weights may arrive while generating (:mod:`verl.rollout.partial`): they are taken
        within a turn and between turns (while tools run), and ``policy_version_last`` says which
        version drew each trajectory's last token."""
        batch, seeds = self.engine.sample_rows(prompts, params)
        seeds = seeds.tolist()
        ids, mask = batch["input_ids"].cpu(), batch["attention_mask"].cpu().bool()
        trajectories = [Trajectory(ids[i][mask[i]].tolist(), seeds[i], i) for i in range(len(batch))]
        for trajectory, media in zip(trajectories, media_of(batch) or ()):
            trajectory.media = media
        tools_kwargs = _tools_kwargs(batch)
        limit = self.settings.max_assistant_turns
        try:
            self._events.run(self._create_instances(trajectories, tools_kwargs))
            if self.environment is not None:
                self._events.run(self._reset_environments(trajectories, batch))
            while True:
                active = [t for t in trajectories if not t.done]
                if not active:
                    break
                calling, answered = [], []
                for trajectory, (text, turn) in zip(active, self._assistant_turn(active, params, swap)):
                    room = params.max_new_tokens - len(trajectory.tokens)
                    if room <= 0 or (limit is not None and trajectory.assistant_turns >= limit):
                        trajectory.done = True
                    elif turn.calls or turn.errors:
                        calling.append((trajectory, turn))
                    elif trajectory.env is not None:
                        answered.append((trajectory, text))
                    else:
                        trajectory.done = True  # an answer without a call, and nobody to reply: the end
                if calling:
                    self._events.run(self._run_tools(calling, params.max_new_tokens))
                if answered:
                    self._events.run(self._environment_replies(answered, params.max_new_tokens))
        except BaseException:
            if self._events.broken is None:  # a stuck loop runs nothing more
                try:  # release what was created; the rollout's own error is the one to see
                    self._events.run(self._finish_instances(trajectories))
                except Exception as e:  # noqa: BLE001
                    logger.warning("releasing the tools of a failed rollout failed too: %s", e)
            raise
        self._events.run(self._finish_instances(trajectories))
        out = self._assemble(batch, trajectories, params)
        if swap is not None:
            out["policy_version_last"] = torch.tensor([t.version_last for t in trajectories], dtype=torch.long)
        return out

    async def _reset_environments(self, trajectories: list[Trajectory], batch: Batch) -> None:
        """One environment per trajectory; a first message it gives joins the prompt (rendered after the
        row's chat messages: the prompt was never generated, so rendering it again changes nothing)."""
        columns = {key: batch[key] if key in batch else [None] * len(batch)
                   for key in ("raw_prompt", "ground_truth", "extra_info", "data_source", "index")}
        for t in trajectories:
            t.env = self.environment()
            sample = {key: values[t.row] for key, values in columns.items()}
            first = await self._env_call(t, "reset", sample)
            if first is None:
                continue
            if t.media is not None:
                raise VerlError(f"{type(t.env).__name__}.reset returned a first message for row {t.row}, whose prompt "
                                f"has images: a first message joins the prompt by rendering it again, which a "
                                f"vision-language prompt's images do not allow here; return None from reset() and "
                                f"put the message in the row's prompt")
            messages = sample["raw_prompt"]
            if not isinstance(messages, (list, tuple)) and not hasattr(messages, "tolist"):
                raise ValueError("an environment's first message joins the prompt's chat messages, and this row has "
                                 "none (raw_prompt); return None from reset() or give the rows chat-message prompts")
            messages = list(messages.tolist() if hasattr(messages, "tolist") else messages)
            text = self.tokenizer.apply_chat_template(messages + [{"role": "user", "content": first}], tokenize=False,
                                                      add_generation_prompt=True)
            t.prompt_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]

    async def _environment_replies(self, answered: list, max_new_tokens: int) -> None:
        """Each answered trajectory's environment step: a reward for the turn, and a reply that goes on
        the conversation (out of the loss) unless the episode is over."""
        user_limit = self.settings.max_user_turns
        for trajectory, text in answered:
            result = await self._env_call(trajectory, "step", text)
            if not (isinstance(result, tuple) and len(result) == 3):
                raise VerlError(f"{type(trajectory.env).__name__}.step returned {result!r:.120} for row {trajectory.row} "
                                f"(turn {trajectory.assistant_turns}): step returns (reply, reward, done)")
            reply, reward, done = result
            trajectory.turn_rewards.append(self._turn_reward(trajectory, reward))
            if not done and reply is None:
                raise VerlError(f"{type(trajectory.env).__name__}.step returned no reply (None) with done=False for "
                                f"row {trajectory.row} (turn {trajectory.assistant_turns}): return the next user "
                                f"message, or done=True to end the episode")
            if done or (user_limit is not None and trajectory.user_turns >= user_limit):
                trajectory.done = True
                continue
            trajectory.user_turns += 1
            trajectory.splice(self.message_ids([{"role": "user", "content": str(reply)}]), max_new_tokens)

    async def _env_call(self, trajectory: Trajectory, method: str, *args):
        """``trajectory.env.<method>(*args)`` (sync or async): one that raises or does not return within
        tool_timeout_s stops the run naming the environment (or interaction), the row and the turn."""
        env = trajectory.env
        where = env.describe(method) if callable(getattr(env, "describe", None)) else f"{type(env).__name__}.{method}"
        label = f"{where} (row {trajectory.row}, turn {trajectory.assistant_turns})"
        timeout = self.settings.tool_timeout_s

        async def call():  # a sync method runs inside the named task, so a blocking one is named too
            return await maybe_await(getattr(trajectory.env, method)(*args))
        try:
            return await asyncio.wait_for(named(call(), label), timeout)
        except asyncio.TimeoutError:
            raise VerlError(f"{label} did not return within {timeout:g} s (multi_turn.tool_timeout_s bounds the "
                            f"environment's and interaction's calls too): make it return, or raise that "
                            f"limit") from None
        except UserCodeExited:
            raise
        except VerlError:  # said already (the interaction adapter's word on what the class returned)
            raise
        except Exception as e:
            raise VerlError(f"{label} raised {type(e).__name__}: {str(e)[:300]}") from e

    @staticmethod
    def _turn_reward(trajectory: Trajectory, reward) -> float:
        """A turn's reward (:func:`~verl.agent.tool_calls.reward_of`)."""
        return reward_of(reward, f"{type(trajectory.env).__name__}.step (row {trajectory.row})", trajectory, "turn")

    def _assistant_turn(self, active: list[Trajectory], params: SamplingParams,
                        swap=None) -> list[tuple[str, ParsedTurn]]:
        """One generation for every active trajectory, from its tokens so far; appends what it drew and
        returns each turn's text and the calls found in it."""
        input_ids, attention = left_pad([t.prompt_ids + t.tokens for t in active], self.engine.pad_token_id)
        budget = max(params.max_new_tokens - len(t.tokens) for t in active)
        # Each assistant turn of a sample draws with its own seed: (sample seed, turn).
        seeds = mix(torch.tensor([t.seed for t in active]), torch.tensor([t.assistant_turns for t in active]))
        turn_params = dataclasses.replace(params, max_new_tokens=budget, n=1)
        if self.device is not None:
            input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        media = [t.media for t in active]
        # A vision-language policy: every turn reads the prompt's images and those the tools returned (also
        # when new weights stop the turn midway and it goes on: verl.rollout.partial).
        images = {"media": media} if any(m is not None for m in media) else {}
        if swap is None:
            responses, log_probs = self.engine.generate_responses(input_ids, attention, turn_params, seeds, **images)
        else:
            responses, log_probs, last = self.engine.generate_resumable(input_ids, attention, turn_params, seeds, swap,
                                                                        **images)
            for trajectory, version in zip(active, last.tolist()):
                trajectory.version_last = version
        responses = responses.cpu()
        eos = set(self.engine.eos_token_ids)
        turns = []
        for i, trajectory in enumerate(active):
            room = params.max_new_tokens - len(trajectory.tokens)
            drawn = responses[i].tolist()[:room]
            end = next((j + 1 for j, tok in enumerate(drawn) if tok in eos), len(drawn))
            drawn = drawn[:end]
            logprobs = log_probs[i, :end].float().cpu().tolist() if log_probs is not None else None
            trajectory.extend(drawn, trained=True, logprobs=logprobs)
            trajectory.assistant_turns += 1
            text = self.tokenizer.decode(drawn, skip_special_tokens=True)
            turns.append((text, self.parser.parse(text)))
        return turns

    async def _run_tools(self, calling: list, max_new_tokens: int) -> None:
        """Every trajectory's calls of this turn, concurrently across the batch; results appended."""
        results = await asyncio.gather(*(self._calls_of(t, turn) for t, turn in calling))
        for (trajectory, _), (messages, images) in zip(calling, results):
            ids, media = self.message_pieces(messages, images)
            trajectory.splice(ids, max_new_tokens, media)

    async def _calls_of(self, trajectory: Trajectory, turn) -> tuple[list[dict], list]:
        """The tool messages of a turn's calls, and the images they hold (in order)."""
        calls = turn.calls[:max(self.settings.max_parallel_calls, 1)]
        trajectory.tool_calls += len(calls) + len(turn.errors)
        trajectory.tool_errors += len(turn.errors)
        outputs = [(f"Error: {error}", []) for error in turn.errors]
        answers = await asyncio.gather(*(self._call(trajectory, call) for call in calls))
        outputs += answers
        side, limit = self.settings.tool_response_truncate_side, self.settings.max_tool_response_length
        messages, images = [], []
        for text, pictures in outputs:
            text = truncate_text(text, limit, side)
            if pictures:
                images += pictures
                messages.append({"role": "tool", "content": [{"type": "image"} for _ in pictures] +
                                 ([{"type": "text", "text": text}] if text else [])})
            else:
                messages.append({"role": "tool", "content": text})
        return messages, images

    # ------------------------------------------------------------------ output
    def _assemble(self, batch: Batch, trajectories: list[Trajectory], params: SamplingParams) -> Batch:
        width = params.max_new_tokens
        pad = self.engine.pad_token_id
        responses = torch.full((len(trajectories), width), pad, dtype=torch.long)
        response_mask = torch.zeros((len(trajectories), width), dtype=torch.long)
        seen = torch.zeros((len(trajectories), width), dtype=torch.long)
        log_probs = torch.zeros((len(trajectories), width), dtype=torch.float32)
        for i, t in enumerate(trajectories):
            n = len(t.tokens)
            responses[i, :n] = torch.tensor(t.tokens, dtype=torch.long)
            response_mask[i, :n] = torch.tensor(t.mask, dtype=torch.long)
            seen[i, :n] = 1
            log_probs[i, :n] = torch.tensor(t.logprobs, dtype=torch.float32) * response_mask[i, :n]
        prompt_ids, prompt_mask = batch["input_ids"].cpu(), batch["attention_mask"].cpu()
        if self.environment is not None:  # a first message may have lengthened the prompts
            prompt_ids, prompt_mask = left_pad([t.prompt_ids for t in trajectories], pad)
        out = rollout_batch(batch, prompt_ids, prompt_mask, responses, response_mask, response_attention=seen,
                            log_probs=log_probs if params.logprobs else None)
        if any(t.media is not None for t in trajectories):
            out[MEDIA_COLUMN] = [t.media for t in trajectories]  # the prompt's images and the tools', in order
        out["agent_turns"] = torch.tensor([t.assistant_turns for t in trajectories], dtype=torch.float32)
        out["agent_tool_calls"] = torch.tensor([t.tool_calls for t in trajectories], dtype=torch.float32)
        out["agent_tool_errors"] = torch.tensor([t.tool_errors for t in trajectories], dtype=torch.float32)
        out["agent_defaulted"] = torch.tensor([t.defaulted for t in trajectories], dtype=torch.float32)
        out["agent_reward"] = torch.tensor([t.tool_reward + sum(t.turn_rewards) for t in trajectories],
                                                dtype=torch.float32)
        if self.environment is not None:
            out["agent_turn_rewards"] = [list(t.turn_rewards) for t in trajectories]
        # What verl's reward functions read about a trajectory, beside the row's own extra_info.
        infos = batch["extra_info"] if "extra_info" in batch else [None] * len(trajectories)
        out["extra_info"] = [{**as_dict(info), "num_turns": t.assistant_turns + t.user_turns + 1,
                              "turn_scores": list(t.turn_rewards), "tool_rewards": list(t.tool_rewards)}
                             for info, t in zip(infos, trajectories)]
        out.meta["temperature"] = params.logprob_temperature
        return out


def _tools_kwargs(batch: Batch) -> list:
    """Each row's ``tools_kwargs`` (``{tool name: {"create_kwargs": {...}}}``): a column of its own, or
    where verl's data puts it, in ``extra_info``."""
    if "tools_kwargs" in batch:
        return list(batch["tools_kwargs"])
    if "extra_info" in batch:
        return [info.get("tools_kwargs") if isinstance(info, dict) else None for info in batch["extra_info"]]
    return [None] * len(batch)
