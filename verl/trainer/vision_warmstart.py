"""The warm start of a built-in visual task (``data.builtin_task=shapes``, docs/vision.md): the built-in
tiny Qwen2-VL fine-tuned on the task's pictures and answers until its held-out sampled accuracy
reaches ``sft_warmstart.target_accuracy``, then handed to RL; cached on disk like the text warm start
(:mod:`verl.trainer.warmstart`).

Each step draws ``sft_warmstart.batch_size`` training rows (with replacement), appends each answer and
EOS as the response, and takes one AdamW step (the gradient norm clipped to ``sft_warmstart.grad_clip``
when set) on the answer tokens' cross-entropy, computed by the RL path's own log-prob function with
the images (:func:`verl.models.logprob.compute_response_logprobs`).
Every ``eval_every`` steps the ``hf`` engine samples the held-out prompts at temperature 1.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

from verl.checkpoint import write_hf_folder
from verl.data import RLDataset, collate_prompts, write_parquet
from verl.models.logprob import compute_response_logprobs
from verl.models.vision import load_processor, media_of
from verl.rollout import HFRollout
from verl.rollout.base import rollout_batch
from verl.trainer.warmstart import sampled_accuracy


def answer_batch(items: list[dict], tokenizer):
    """Prompts with images (dataset items) and their answers (``ground_truth`` + EOS) as a rollout-layout
    batch: what the warm start's loss reads."""
    prompts = collate_prompts(items, tokenizer.pad_token_id)
    answers = [tokenizer(str(it["ground_truth"]), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
               for it in items]
    width = max(map(len, answers))
    responses = torch.tensor([a + [tokenizer.pad_token_id] * (width - len(a)) for a in answers])
    mask = torch.tensor([[1] * len(a) + [0] * (width - len(a)) for a in answers])
    return rollout_batch(prompts, prompts["input_ids"], prompts["attention_mask"], responses, mask)


def train_vision_warm_start(config, task, base: Path, target: Path, progress: bool = True) -> tuple[int, float]:
    """Fine-tune the model at ``base`` on ``task`` until the target accuracy (or ``max_steps``), export it
    with its processor to ``target``; returns the steps taken and the last accuracy."""
    from transformers import AutoModelForImageTextToText

    cfg, seed = config.sft_warmstart, config.trainer.seed
    processor = load_processor(str(base))
    tokenizer = processor.tokenizer
    work = target.parent / "data"
    write_parquet(task.make_rows("train"), work / "train.parquet")
    write_parquet(task.make_rows("test", n=cfg.eval_samples, seed=seed), work / "test.parquet")
    length = dict(max_prompt_length=config.data.max_prompt_length, processor=processor)
    train = RLDataset(str(work / "train.parquet"), tokenizer, **length)
    held_out = collate_prompts([item for item in RLDataset(str(work / "test.parquet"), tokenizer, **length)],
                               tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_pretrained(base)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    rng = random.Random(seed)
    step, accuracy = 0, 0.0
    while step < cfg.max_steps:
        step += 1
        batch = answer_batch([train[rng.randrange(len(train))] for _ in range(cfg.batch_size)], tokenizer)
        log_probs, _ = compute_response_logprobs(model, batch["input_ids"], batch["attention_mask"],
                                                 batch["position_ids"], batch["responses"], media=media_of(batch))
        mask = batch["response_mask"]
        loss = -(log_probs * mask).sum() / mask.sum()
        optimizer.zero_grad()
        loss.backward()
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        if step % cfg.eval_every == 0:
            model.eval()
            with torch.no_grad():
                accuracy = sampled_accuracy(HFRollout(model, tokenizer), held_out, task,
                                            config.data.max_response_length, tokenizer)
            model.train()
            if progress:
                print(f"vision warm start step {step}: loss {loss.item():.3f}, held-out sampled accuracy "
                      f"{accuracy:.2f} (stops at {cfg.target_accuracy})", flush=True)
            if accuracy >= cfg.target_accuracy:
                break
    write_hf_folder(model, processor, target)
    return step, accuracy


def vision_warm_start(config, folder: Path, progress: bool = True):
    """The cached warm start of ``config``'s visual task in ``folder`` (trained first unless there)."""
    from verl.data.tasks import TASKS
    from verl.models.tiny_vision import builtin_vl_model_path
    from verl.trainer.warmstart import WarmStart

    done = folder / "warmstart.json"
    if not done.exists():
        start = time.perf_counter()
        steps, accuracy = train_vision_warm_start(config, TASKS[config.data.builtin_task], builtin_vl_model_path(),
                                                  folder / "model", progress)
        done.write_text(json.dumps({"steps": steps, "accuracy": accuracy, "seconds": time.perf_counter() - start}))
        return WarmStart(folder / "model", steps, accuracy, json.loads(done.read_text())["seconds"], cached=False)
    stats = json.loads(done.read_text())
    return WarmStart(folder / "model", stats["steps"], stats["accuracy"], stats["seconds"], cached=True)
