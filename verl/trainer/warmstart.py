"""Supervised warm start of the built-in tiny model on the built-in task, cached on disk.

RL needs a policy that is sometimes right: a random model never earns a reward. The demo
therefore fine-tunes the tiny model on worked examples until its held-out *sampled* accuracy
reaches ``sft_warmstart.target_accuracy`` (about 0.4, leaving RL room to improve), then hands
it to RL. The result is cached by a hash of everything that shapes it, so a second run starts RL
at once.
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
from verl.config.schema_actor import FSDPConfig, OptimConfig
from verl.data import collate_prompts
from verl.data.collate import left_pad
from verl.data.tasks import TASKS
from verl.models.loading import load_causal_lm, load_tokenizer, resolve_device
from verl.models.tiny import CHAR_CHAT_TEMPLATE, builtin_model_path
from verl.protocol import Batch
from verl.rollout import HFRollout, SamplingParams
from verl.trainer.progress import Progress
from verl.trainer.sft_loss import sft_counts, sft_loss
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
    spec = {"version": __version__, "task": config.data.builtin_task, "sft": config.sft_warmstart.to_dict(),
            "seed": config.trainer.seed, "response_length": config.data.max_response_length,
            "model": json.loads((base / "config.json").read_text()), "model_folder": base.name,
            "chat_template": CHAR_CHAT_TEMPLATE}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _encode_examples(rows, tokenizer, task):
    """(prompt ids, whole example ids, trained mask) for each row of ``task``: the answer and eos after
    the prompt, or, for an agentic task, its worked conversation (see :func:`_conversation_ids`)."""
    out = []
    for row in rows:
        prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if hasattr(task, "sft_messages"):
            ids, trained = _conversation_ids(row["prompt"], task.sft_messages(row), prompt, tokenizer)
        else:
            ids = tokenizer(str(row["reward_model"]["ground_truth"]), add_special_tokens=False)["input_ids"]
            ids, trained = ids + [tokenizer.eos_token_id], [1] * (len(ids) + 1)
        out.append((prompt_ids, prompt_ids + ids, [0] * len(prompt_ids) + trained))
    return out


def _conversation_ids(prompt_messages, messages, prompt_text: str, tokenizer) -> tuple[list[int], list[int]]:
    """The ids after the prompt of a worked conversation, and which of them are trained on: what the
    model writes in its turns (content and end of turn), not the tool results and the chat template's
    markers around them. Each piece is tokenized on its own, as a multi-turn rollout splices them."""
    ids, trained, history, text = [], [], list(prompt_messages), prompt_text
    for message in messages:
        pieces = []
        if message["role"] == "assistant":
            opened = tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=False)
            pieces.append((opened[len(text):], 0))
            text = opened
        history.append(message)
        rendered = tokenizer.apply_chat_template(history, tokenize=False)
        if not rendered.startswith(text):
            raise ValueError("the chat template renders earlier turns differently once more follow")
        pieces.append((rendered[len(text):], 1 if message["role"] == "assistant" else 0))
        text = rendered
        for piece, is_trained in pieces:
            piece_ids = tokenizer(piece, add_special_tokens=False)["input_ids"] if piece else []
            ids += piece_ids
            trained += [is_trained] * len(piece_ids)
    return ids, trained


def _sft_batch(examples, pad_id: int) -> Batch:
    """Left-padded examples with ``loss_mask`` on the trained tokens (the SFT loss's batch)."""
    full = [e[1] for e in examples]
    input_ids, attention_mask = left_pad(full, pad_id)
    loss_mask = torch.zeros_like(attention_mask)
    for i, (_, seq, trained) in enumerate(examples):
        loss_mask[i, input_ids.shape[1] - len(seq):] = torch.tensor(trained, dtype=loss_mask.dtype)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return Batch({"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
                  "loss_mask": loss_mask})


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
    multi-turn loop with the built-in tools."""
    rollout = HFRollout(model, tokenizer)
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


def _train(config, folder: Path, progress: bool) -> WarmStart:
    cfg = config.sft_warmstart
    task = TASKS[config.data.builtin_task]
    done = folder / "warmstart.json"
    start = time.perf_counter()
    rng = random.Random(config.trainer.seed)
    torch.manual_seed(config.trainer.seed)
    device = resolve_device(config.trainer.device)
    base = str(builtin_model_path())
    tokenizer = load_tokenizer(base)
    model = load_causal_lm(base).to(device)
    # One process on a tiny model: plain (unsharded) weights, constant learning rate, no clipping.
    # Not data-parallel: under torchrun rank 0 trains it alone while the other ranks wait.
    engine = TrainingEngine(model, OptimConfig(lr=cfg.lr, weight_decay=0.0), FSDPConfig(), device,
                            grad_clip=math.inf, total_steps=cfg.max_steps, seed=config.trainer.seed,
                            metric_prefix="train", data_parallel=False)
    train = _encode_examples(task.make_rows("train"), tokenizer, task)
    eval_rows = task.make_rows("test", n=cfg.eval_samples, seed=config.trainer.seed)
    eval_prompts = collate_prompts([{"input_ids": p, "raw_prompt": r["prompt"], "data_source": r["data_source"],
                                     "ground_truth": r["reward_model"]["ground_truth"], "extra_info": {},
                                     "index": i} for i, ((p, _, _), r) in
                                    enumerate(zip(_encode_examples(eval_rows, tokenizer, task), eval_rows))],
                                   tokenizer.pad_token_id).to(device)
    rollout = task_rollout(task, model, tokenizer)
    accuracy, step = 0.0, 0
    bar = Progress(cfg.max_steps, enabled=progress, desc="SFT warm start")
    for step in range(1, cfg.max_steps + 1):
        batch = _sft_batch(rng.sample(train, cfg.batch_size), tokenizer.pad_token_id)
        loss = engine.train_batch(batch, sft_loss, counts_fn=sft_counts, additive={"train/loss"})["train/loss"]
        if step % cfg.eval_every == 0:
            accuracy = sampled_accuracy(rollout, eval_prompts, task, config.data.max_response_length, tokenizer)
        bar.update(f"loss={loss:.3f} sampled_acc={accuracy:.2f} (stops at {cfg.target_accuracy})")
        if step % cfg.eval_every == 0 and accuracy >= cfg.target_accuracy:
            break
    bar.close()
    if progress:
        print(f"SFT warm start done: {step} steps, held-out sampled accuracy {accuracy:.2f}", flush=True)
    seconds = time.perf_counter() - start
    write_hf_folder(model, tokenizer, folder / "model")
    done.write_text(json.dumps({"steps": step, "accuracy": accuracy, "seconds": seconds}))
    return WarmStart(folder / "model", step, accuracy, seconds, cached=False)
