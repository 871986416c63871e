"""What LoRA saves: trainable parameters, optimiser state, checkpoint size and peak memory, full
fine-tuning vs LoRA, on the same GRPO run (PPO with a critic with ``--critic``).

    python benchmarks/bench_lora.py [--hidden 512] [--layers 8] [--rank 8] [--critic] [--out outputs/bench_lora]

Builds a randomly initialised Qwen2 model of the given size (the built-in tokenizer), then runs
``main_ppo`` on the built-in addition task for 2 steps, saving at step 2, once with every weight
training and once with ``lora_rank=--rank`` adapters on all linear layers (the critic's too with
``--critic``). Each run is its own process, so its peak resident memory (``ru_maxrss``) is its
own. Printed per run: the parameters the checkpoint holds, the bytes of optimiser state,
the checkpoint's size on disk, and the peak memory, with the LoRA/full ratios. A measurement:
nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, resource, sys
import torch
torch.set_num_threads(1)
from verl.trainer.main_ppo import main
rc = main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump({"rc": rc, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}, f)
"""


def tensor_bytes(tree) -> int:
    import torch

    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(tensor_bytes(v) for v in tree)
    return 0


def run(name: str, model: Path, out: Path, extra: list[str]) -> dict:
    import torch

    args = [f"actor_rollout_ref.model.path={model}", "sft_warmstart.enable=false", "trainer.total_training_steps=2",
            "trainer.save_freq=2", "trainer.val_before_train=false", "trainer.test_freq=-1",
            "trainer.progress_bar=false", "trainer.logger=[jsonl]", "data.train_batch_size=8",
            "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "data.max_prompt_length=32",
            "data.max_response_length=8",
            f"trainer.default_local_dir={out / name}", *extra]
    report = out / f"{name}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(report), *args], cwd=REPO, env=env, capture_output=True,
                          text=True)
    if done.returncode != 0 or json.loads(report.read_text())["rc"] != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    checkpoint = out / name / "global_step_2" / "state.pt"
    state = torch.load(checkpoint, weights_only=False)
    roles = [r for r in ("actor", "critic") if r in state]
    return {"name": name, "peak_rss_mb": json.loads(report.read_text())["peak_rss_mb"],
            "checkpoint_mb": checkpoint.stat().st_size / 2**20,
            "saved_params": sum(t.numel() for r in roles for t in state[r]["model"].values()),
            "optimizer_mb": sum(tensor_bytes(state[r]["optimizer"]["state"]) for r in roles) / 2**20}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--critic", action="store_true", help="PPO with a critic (gae), LoRA on both models")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "bench_lora")
    args = parser.parse_args(argv)
    from verl.models.tiny import make_tiny_model_folder

    args.out.mkdir(parents=True, exist_ok=True)
    model = make_tiny_model_folder(args.out / "model", num_layers=args.layers, hidden_size=args.hidden,
                                   intermediate_size=3 * args.hidden, num_heads=max(1, args.hidden // 64),
                                   num_kv_heads=max(1, args.hidden // 128))
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    algorithm = (["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=8"] if args.critic
                 else ["algorithm.adv_estimator=grpo"])
    lora = [f"actor_rollout_ref.model.lora_rank={args.rank}", f"actor_rollout_ref.model.lora_alpha={2 * args.rank}"]
    if args.critic:
        lora += [f"critic.model.lora_rank={args.rank}", f"critic.model.lora_alpha={2 * args.rank}"]
    rows = [run("full", model, args.out, algorithm), run(f"lora-r{args.rank}", model, args.out, algorithm + lora)]
    print(f"Qwen2, hidden {config.hidden_size}, {config.num_hidden_layers} layers, "
          f"{'PPO with a critic' if args.critic else 'GRPO'}; LoRA on all linear layers")
    print(f"{'run':<10} {'params saved':>14} {'optimiser MB':>13} {'checkpoint MB':>14} {'peak RSS MB':>12}")
    for r in rows:
        print(f"{r['name']:<10} {r['saved_params']:>14,} {r['optimizer_mb']:>13.1f} {r['checkpoint_mb']:>14.1f} "
              f"{r['peak_rss_mb']:>12.0f}")
    full, lora_row = rows
    print(f"{'LoRA/full':<10} {lora_row['saved_params'] / full['saved_params']:>14.4f} "
          f"{lora_row['optimizer_mb'] / full['optimizer_mb']:>13.4f} "
          f"{lora_row['checkpoint_mb'] / full['checkpoint_mb']:>14.4f} "
          f"{lora_row['peak_rss_mb'] / full['peak_rss_mb']:>12.2f}")


if __name__ == "__main__":
    main()
