"""Supervised warm start of the built-in tiny model on the built-in task, cached on disk.

RL needs a policy that is sometimes right: a random model never earns a reward. The demo
therefore fine-tunes the tiny model on worked examples until its held-out *sampled* accuracy
reaches ``sft_warmstart.target_accuracy`` (about 0.4, leaving RL room to improve), then hands
it to RL. The result is cached by a hash of everything that shapes it, so a second run starts RL
at once.

The training is :class:`~verl.trainer.sft.SFTTrainer`'s, with a stop condition: its data is the
task's worked examples (the answer after the prompt, or an agentic task's whole tool-use
conversation, trained on the model's turns only), its validation the held-out sampled accuracy,
and it ends once that reaches the target. Each step's examples are drawn from all of them anew
(``replacement=True``). It runs alone in its process (under torchrun rank 0
trains it while the other ranks wait) on plain, unsharded weights, with a constant learning rate
and no gradient clipping. Interrupted (Ctrl-C), it keeps its last step's checkpoint in the cache
folder, and the next run resumes from it.

An agentic task may add a second phase (``sft_warmstart.direct_steps``, :class:`DirectAnswerPhase`):
from the model that has learnt the tool conversations, a few steps on conversations that answer at
once (``task.direct_messages``: a guess), ``direct_tool_share`` of them still calling the tool. The
model then answers without the tool at greedy decoding and calls it in some samples, and RL has a
behaviour to learn: calling the tool is what earns the reward.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from verl.checkpoint import write_hf_folder
from verl.config.offline import SFTTrainerConfig
from verl.data import collate_prompts
from verl.data.collate import position_ids_from_mask
from verl.data.tasks import TASKS, sources_digest
from verl.distributed.process_group import alone
from verl.models.tiny import CHAR_CHAT_TEMPLATE, builtin_model_path
from verl.rollout import SamplingParams, build_rollout
from verl.tracking.summary import direct_summary
from verl.trainer.sft import SFTTrainer
from verl.utils.cache import cache_dir, cache_lock
from verl.version import __version__
from verl.workers.engine import TrainingEngine


@dataclass
class WarmStart:
    path: Path
    steps: int
    accuracy: float
    seconds: float
    cached: bool
    direct: dict | None = None  # the direct-answer phase: its steps and held-out figures at its end


def _cache_key(config) -> str:
    base = builtin_model_path()
    # The chat template shapes the training text (prompt, marker, answer), so it is part of the key
    # (the folder's name is a hash of it and the model spec; the template is also named outright).
    # So are the tasks' sources (their rows and worked examples): an edit to a task trains a new warm
    # start, even within one version.
    spec = {"version": __version__, "trainer": "SFTTrainer", "task": config.data.builtin_task,
            "tasks": sources_digest(),
            "sft": config.sft_warmstart.to_dict(),
            "seed": config.trainer.seed, "response_length": config.data.max_response_length,
            "model": json.loads((base / "config.json").read_text()), "model_folder": base.name,
            "chat_template": CHAR_CHAT_TEMPLATE}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def example_rows(rows, task) -> list[dict]:
    """The SFT rows of the warm start for rows of ``task``: the prompt and its answer, or, for an
    agentic task, the whole worked conversation (``task.sft_messages``), whose loss covers the
    model's turns only (not the tool results, which a multi-turn rollout splices in)."""
    if hasattr(task, "sft_messages"):
        return [{"messages": list(row["prompt"]) + task.sft_messages(row)} for row in rows]
    return [{"prompt": row["prompt"], "response": str(row["reward_model"]["ground_truth"])} for row in rows]


def held_out(rollout, prompts, task, max_new_tokens: int, tokenizer, temperature: float = 1.0) -> tuple[float, float]:
    """(accuracy, share of responses that call a tool) on held-out prompts, sampled at ``temperature``
    (0: greedy); ``rollout`` is an engine, or for an agentic task the multi-turn loop over one (scored
    on the whole trajectory, as the reward function sees it)."""
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, do_sample=temperature > 0)
    out = rollout.generate(prompts, params)
    seen = out["attention_mask"][:, -out["responses"].shape[1]:].bool()
    texts = [tokenizer.decode(out["responses"][i][seen[i]], skip_special_tokens=True) for i in range(len(out))]
    scores = [task.compute_score(task.DATA_SOURCE, t, gt) for t, gt in zip(texts, out["ground_truth"])]
    return sum(scores) / len(scores), sum("<tool_call>" in t for t in texts) / len(texts)


def sampled_accuracy(rollout, prompts, task, max_new_tokens: int, tokenizer) -> float:
    """Held-out accuracy at temperature 1 (see :func:`held_out`)."""
    return held_out(rollout, prompts, task, max_new_tokens, tokenizer)[0]


def task_rollout(task, model, tokenizer):
    """The engine the warm start measures with: plain generation, or for an agentic task the
    multi-turn loop with the built-in tools. The fastest engine for the model (``auto``: native for the
    built-in Qwen2), which draws what hf draws: the checks, and so where the warm start stops, are hf's."""
    rollout = build_rollout("auto", model, tokenizer)
    if not hasattr(task, "sft_messages"):
        return rollout
    from verl.agent.agent_loop import AgentLoop, AgentSettings
    from verl.tools import builtin
    from verl.tools.function_tool import load_function_tools

    tools = {tool.name: tool for tool in load_function_tools(builtin.__file__)}
    return AgentLoop(rollout, tokenizer, tools, AgentSettings(max_assistant_turns=2), device=rollout.device)


def warm_start(config, *, progress: bool = True) -> WarmStart:
    """Return the warm-started model folder, training it first unless the cache has it."""
    folder = cache_dir("warmstart") / f"{config.data.builtin_task}-{_cache_key(config)}"
    task = TASKS[config.data.builtin_task]
    cfg = config.sft_warmstart
    if cfg.direct_steps and not hasattr(task, "direct_messages"):
        raise ValueError(f"sft_warmstart.direct_steps={cfg.direct_steps} needs a built-in task that uses a tool "
                         f"(data.builtin_task=calculator); {config.data.builtin_task!r} answers without one. Set "
                         f"sft_warmstart.direct_steps=0")
    unused = [f"sft_warmstart.{key}={getattr(cfg, key)}" for key in ("direct_tool_calls", "direct_lr", "direct_batch_size")
              if getattr(cfg, key) is not None]
    if unused and not cfg.direct_steps:
        raise ValueError(f"{', '.join(unused)} set for the phase of direct answers, which sft_warmstart.direct_steps=0 "
                         f"turns off; set direct_steps (its most steps with direct_tool_calls, e.g. 200), or leave "
                         f"{'them' if len(unused) > 1 else 'it'} null")
    if getattr(task, "VISION", False):  # pictures: the vision-language warm start, on the built-in Qwen2-VL
        from verl.models.tiny_vision import builtin_vl_model_path
        from verl.trainer import vision_warmstart

        # Keyed by the model and by the training loop's source too (the task's is in the key): an edit retrains.
        shaped_by = builtin_vl_model_path().name + Path(vision_warmstart.__file__).read_text()
        folder = folder.with_name(f"{folder.name}-{hashlib.sha256(shaped_by.encode()).hexdigest()[:8]}")
        with cache_lock(folder, waiting=f"Another process is training this warm start ({folder}); waiting for it"):
            return vision_warmstart.vision_warm_start(config, folder, progress)
    cached = _cached(folder)
    if cached is not None:
        return cached
    # Another run training the same warm start: wait for it and use its result.
    with cache_lock(folder, waiting=f"Another process is training this warm start ({folder}); waiting for it"):
        return _cached(folder) or _train(config, folder, progress)


def _cached(folder: Path) -> WarmStart | None:
    done = folder / "warmstart.json"
    if not done.exists():
        return None
    stats = json.loads(done.read_text())
    return WarmStart(folder / "model", stats["steps"], stats["accuracy"], stats["seconds"], cached=True,
                     direct=stats.get("direct"))


class WarmStartTrainer(SFTTrainer):
    """The SFT trainer on ``config``'s built-in task, validated by held-out sampled accuracy and
    stopped once that reaches ``sft_warmstart.target_accuracy``. Build and fit it inside
    :func:`~verl.distributed.process_group.alone`."""

    label = "SFT warm start"
    # Each step's examples drawn from all of them anew: the plateau before the model copies digits
    # ends sooner than with epochs of one permutation each (calculator, seed 1: 380 steps against
    # more than 820).
    replacement = True
    run_name = "run"  # the cache entry's folder for this phase's metrics and interrupted checkpoint

    def __init__(self, config, folder: Path, *, progress: bool = True, start: Path | None = None,
                 model_dir: Path | None = None):
        """``folder``: the cache entry; its ``run/`` holds the run's metrics (and a checkpoint after an
        interruption), ``model/`` (or ``model_dir``) the result. ``start``: the model to train (the
        built-in one by default)."""
        self.task = TASKS[config.data.builtin_task]
        self.model_dir = model_dir or folder / "model"
        self.rl_config = config
        cfg = config.sft_warmstart
        steps, every = self.schedule(cfg)
        batch_size, lr = self.batch_size_and_lr(cfg)
        self.eval_rows = self.task.make_rows("test", n=cfg.eval_samples, seed=config.trainer.seed)
        super().__init__(SFTTrainerConfig.from_dict({
            "data": {"train_batch_size": batch_size, "messages_key": "messages" if self.agentic else None,
                     "max_length": 1 << 20, "seed": config.trainer.seed},
            "model": {"path": str(start or builtin_model_path()), "disable_dropout": False},
            "optim": {"lr": lr, "weight_decay": 0.0},
            "trainer": {"total_training_steps": steps, "test_freq": every, "val_before_train": False,
                        "save_freq": -1, "logger": [], "progress_bar": progress,
                        "default_local_dir": str(folder / self.run_name),
                        "device": config.trainer.device, "seed": config.trainer.seed}}))
        self.eval_prompts = self._eval_prompts()
        self.rollout = task_rollout(self.task, self.policy.model, self.tokenizer)

    def schedule(self, cfg) -> tuple[int, int]:
        """(most steps, steps between accuracy checks) of this phase."""
        return cfg.max_steps, cfg.eval_every

    def batch_size_and_lr(self, cfg) -> tuple[int, float]:
        """(examples per step, learning rate) of this phase."""
        return cfg.batch_size, cfg.lr

    @property
    def agentic(self) -> bool:
        return hasattr(self.task, "sft_messages")

    def rows(self) -> tuple[list[dict], list[dict]]:
        return example_rows(self.task.make_rows("train"), self.task), example_rows(self.eval_rows, self.task)

    def make_policy(self, model: torch.nn.Module) -> TrainingEngine:
        # One process on a tiny model: plain (unsharded) weights, not data-parallel.
        clip = self.rl_config.sft_warmstart.grad_clip
        return TrainingEngine(model.to(self.device), self.config.optim, self.config.model.fsdp_config, self.device,
                              grad_clip=math.inf if clip is None else clip, total_steps=self.total_steps,
                              seed=self.config.trainer.seed, metric_prefix="train", data_parallel=False)

    def _eval_prompts(self):
        items = []
        for i, row in enumerate(self.eval_rows):
            text = self.tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
            items.append({"input_ids": self.tokenizer(text, add_special_tokens=False)["input_ids"],
                          "raw_prompt": row["prompt"], "data_source": row["data_source"],
                          "ground_truth": row["reward_model"]["ground_truth"], "extra_info": {}, "index": i})
        return collate_prompts(items, self.tokenizer.pad_token_id).to(self.device)

    def validate(self) -> dict[str, float]:
        """``val/sampled_accuracy``: the held-out prompts' mean score at temperature 1."""
        accuracy = sampled_accuracy(self.rollout, self.eval_prompts, self.task,
                                    self.rl_config.data.max_response_length, self.tokenizer)
        return {"val/sampled_accuracy": accuracy}

    def accuracy(self) -> float:
        return self.val_history[-1][1]["val/sampled_accuracy"] if self.val_history else 0.0

    def goal_reached(self) -> bool:
        return self.accuracy() >= self.rl_config.sft_warmstart.target_accuracy

    def postfix(self, metrics: dict) -> str:
        return (f"loss={metrics['train/loss']:.3f} sampled_acc={self.accuracy():.2f} "
                f"(stops at {self.rl_config.sft_warmstart.target_accuracy})")

    def export(self, target: Path | None = None) -> None:
        write_hf_folder(self.policy.model, self.tokenizer, target or self.model_dir)


class DirectAnswerPhase(WarmStartTrainer):
    """The agentic warm start's second phase: from the model that has learnt the tool conversations,
    steps on the task's training rows answered at once (``task.direct_messages``), a seeded
    ``direct_tool_share`` of them with the whole tool conversation instead. It runs
    ``sft_warmstart.direct_steps`` steps or, with ``direct_tool_calls`` set, stops after the first step
    where greedy decoding opens a call on no held-out prompt and the expected share of sampled responses
    that open one is at least that (:func:`call_odds`, after every step). Its last check adds held-out
    greedy and sampled accuracy and how often each calls the tool, from real rollouts."""

    label = "SFT warm start, direct answers"
    run_name = "run-direct"

    def schedule(self, cfg) -> tuple[int, int]:
        return cfg.direct_steps, (cfg.direct_steps if cfg.direct_tool_calls is None else 1)

    def batch_size_and_lr(self, cfg) -> tuple[int, float]:
        return (cfg.batch_size if cfg.direct_batch_size is None else cfg.direct_batch_size,
                cfg.lr if cfg.direct_lr is None else cfg.direct_lr)

    def enough_calls(self, odds: dict) -> bool:
        want = self.rl_config.sft_warmstart.direct_tool_calls
        return want is not None and odds["val/greedy_opens_call"] == 0 and odds["val/expected_tool_calls"] >= want

    def rows(self) -> tuple[list[dict], list[dict]]:
        train = self.task.make_rows("train")
        share = self.rl_config.sft_warmstart.direct_tool_share
        calls = set(random.Random(self.rl_config.trainer.seed).sample(range(len(train)), round(share * len(train))))
        rows = [{"messages": list(row["prompt"]) +
                 (self.task.sft_messages(row) if i in calls else self.task.direct_messages(row))}
                for i, row in enumerate(train)]
        return rows, example_rows(self.eval_rows, self.task)

    def validate(self) -> dict[str, float]:
        figures = call_odds(self.policy.model, self.eval_prompts, self.tokenizer)
        if not (self.enough_calls(figures) or self.global_step >= self.total_steps):
            return figures
        length = self.rl_config.data.max_response_length
        for name, temperature in (("sampled", 1.0), ("greedy", 0.0)):
            accuracy, calls = held_out(self.rollout, self.eval_prompts, self.task, length, self.tokenizer, temperature)
            figures.update({f"val/{name}_accuracy": accuracy, f"val/{name}_tool_calls": calls})
        return figures

    def goal_reached(self) -> bool:
        return bool(self.val_history) and self.enough_calls(self.val_history[-1][1])

    def postfix(self, metrics: dict) -> str:
        if not self.val_history:
            return f"loss={metrics['train/loss']:.3f}"
        odds = self.val_history[-1][1]
        return (f"loss={metrics['train/loss']:.3f} expected_calls={odds['val/expected_tool_calls']:.2f} "
                f"greedy_calls={odds['val/greedy_opens_call']:.2f}")


CALL_OPENING = "<tool_call>"  # how a Hermes-format call begins (verl.agent's parser reads that format)


def call_odds(model: torch.nn.Module, prompts, tokenizer) -> dict[str, float]:
    """How often a response to ``prompts`` opens a tool call, exactly, from one forward pass over each
    prompt followed by the call's opening tokens: ``val/expected_tool_calls``, the mean probability of
    a sampled response (temperature 1) beginning with it, and ``val/greedy_opens_call``, the share of
    prompts whose greedy response begins with it (each of its tokens the most likely one)."""
    ids, prompt_mask = prompts["input_ids"], prompts["attention_mask"]
    opening = torch.tensor(tokenizer(CALL_OPENING, add_special_tokens=False)["input_ids"], device=ids.device)
    rows, width = ids.shape[0], opening.numel()
    input_ids = torch.cat([ids, opening.expand(rows, width)], dim=1)
    mask = torch.cat([prompt_mask, prompt_mask.new_ones(rows, width)], dim=1)
    logits = model(input_ids=input_ids, attention_mask=mask,
                   position_ids=position_ids_from_mask(mask)).logits[:, -width - 1:-1].float()
    log_probs = torch.log_softmax(logits, dim=-1)
    opened = log_probs.gather(-1, opening.expand(rows, width).unsqueeze(-1)).squeeze(-1).sum(-1)
    greedy = (logits.argmax(-1) == opening).all(-1)
    return {"val/expected_tool_calls": opened.exp().mean().item(), "val/greedy_opens_call": greedy.float().mean().item()}


def _train(config, folder: Path, progress: bool) -> WarmStart:
    start = time.perf_counter()
    two_phases = config.sft_warmstart.direct_steps > 0
    tool_model, first_done = folder / "tool-model", folder / "tool-phase.json"
    direct = None
    with alone():
        if two_phases and first_done.exists():  # an interrupted second phase: the first is done
            first = json.loads(first_done.read_text())
            steps, accuracy = first["steps"], first["accuracy"]
        else:
            trainer = WarmStartTrainer(config, folder, progress=progress, model_dir=tool_model if two_phases else None)
            trainer.fit()  # ends with the export to folder/model (folder/tool-model before a second phase)
            steps, accuracy = trainer.global_step, trainer.accuracy()
            if progress:
                print(f"SFT warm start done: {steps} steps, held-out sampled accuracy {accuracy:.2f}", flush=True)
            if two_phases:
                first_done.write_text(json.dumps({"steps": steps, "accuracy": accuracy}))
        if two_phases:
            second = DirectAnswerPhase(config, folder, progress=progress, start=tool_model)
            second.fit()
            figures = second.val_history[-1][1]
            direct = {"steps": second.global_step, **{k.removeprefix("val/"): v for k, v in figures.items()}}
            if progress:
                print(f"SFT warm start, direct answers done: {direct_summary(direct)}", flush=True)
    seconds = time.perf_counter() - start
    (folder / "warmstart.json").write_text(json.dumps({"steps": steps, "accuracy": accuracy, "seconds": seconds,
                                                       "direct": direct}))
    return WarmStart(folder / "model", steps, accuracy, seconds, cached=False, direct=direct)
