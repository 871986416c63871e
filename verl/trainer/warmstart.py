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
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from verl.checkpoint import write_hf_folder
from verl.config.offline import SFTTrainerConfig
from verl.data import collate_prompts
from verl.data.tasks import TASKS, sources_digest
from verl.distributed.process_group import alone
from verl.models.tiny import CHAR_CHAT_TEMPLATE, builtin_model_path
from verl.rollout import SamplingParams, build_rollout
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


def sampled_accuracy(rollout, prompts, task, max_new_tokens: int, tokenizer) -> float:
    """Held-out accuracy at temperature 1; ``rollout`` is an engine, or for an agentic task the
    multi-turn loop over one (scored on the whole trajectory, as the reward function sees it)."""
    out = rollout.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0))
    seen = out["attention_mask"][:, -out["responses"].shape[1]:].bool()
    texts = [tokenizer.decode(out["responses"][i][seen[i]], skip_special_tokens=True) for i in range(len(out))]
    scores = [task.compute_score(task.DATA_SOURCE, t, gt) for t, gt in zip(texts, out["ground_truth"])]
    return sum(scores) / len(scores)


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
    return WarmStart(folder / "model", stats["steps"], stats["accuracy"], stats["seconds"], cached=True)


class WarmStartTrainer(SFTTrainer):
    """The SFT trainer on ``config``'s built-in task, validated by held-out sampled accuracy and
    stopped once that reaches ``sft_warmstart.target_accuracy``. Build and fit it inside
    :func:`~verl.distributed.process_group.alone`."""

    label = "SFT warm start"
    # Each step's examples drawn from all of them anew: the plateau before the model copies digits
    # ends sooner than with epochs of one permutation each (calculator, seed 1: 380 steps against
    # more than 820).
    replacement = True

    def __init__(self, config, folder: Path, *, progress: bool = True):
        """``folder``: the cache entry; its ``run/`` holds the run's metrics (and a checkpoint after an
        interruption), ``model/`` the result."""
        self.task = TASKS[config.data.builtin_task]
        self.model_dir = folder / "model"
        self.rl_config = config
        cfg = config.sft_warmstart
        self.eval_rows = self.task.make_rows("test", n=cfg.eval_samples, seed=config.trainer.seed)
        super().__init__(SFTTrainerConfig.from_dict({
            "data": {"train_batch_size": cfg.batch_size, "messages_key": "messages" if self.agentic else None,
                     "max_length": 1 << 20, "seed": config.trainer.seed},
            "model": {"path": str(builtin_model_path()), "disable_dropout": False},
            "optim": {"lr": cfg.lr, "weight_decay": 0.0},
            "trainer": {"total_training_steps": cfg.max_steps, "test_freq": cfg.eval_every, "val_before_train": False,
                        "save_freq": -1, "logger": [], "progress_bar": progress, "default_local_dir": str(folder / "run"),
                        "device": config.trainer.device, "seed": config.trainer.seed}}))
        self.eval_prompts = self._eval_prompts()
        self.rollout = task_rollout(self.task, self.policy.model, self.tokenizer)

    @property
    def agentic(self) -> bool:
        return hasattr(self.task, "sft_messages")

    def rows(self) -> tuple[list[dict], list[dict]]:
        return example_rows(self.task.make_rows("train"), self.task), example_rows(self.eval_rows, self.task)

    def make_policy(self, model: torch.nn.Module) -> TrainingEngine:
        # One process on a tiny model: plain (unsharded) weights, not data-parallel, no clipping.
        return TrainingEngine(model.to(self.device), self.config.optim, self.config.model.fsdp_config, self.device,
                              grad_clip=math.inf, total_steps=self.total_steps,
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


def _train(config, folder: Path, progress: bool) -> WarmStart:
    start = time.perf_counter()
    with alone():
        trainer = WarmStartTrainer(config, folder, progress=progress)
        trainer.fit()  # ends with the export to folder/model
    steps, accuracy = trainer.global_step, trainer.accuracy()
    if progress:
        print(f"SFT warm start done: {steps} steps, held-out sampled accuracy {accuracy:.2f}", flush=True)
    seconds = time.perf_counter() - start
    (folder / "warmstart.json").write_text(json.dumps({"steps": steps, "accuracy": accuracy, "seconds": seconds}))
    return WarmStart(folder / "model", steps, accuracy, seconds, cached=False)
