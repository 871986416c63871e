"""Same batches, same numbers: our GRPO update and TRL's on identical prompts and completions.

    python benchmarks/parity_trl_fixed.py                  # the settings of parity_trl.py, 3 steps each
    python benchmarks/parity_trl_fixed.py --steps 5 --settings grpo

The learning curves of benchmarks/parity_trl.py can only agree within the seed-to-seed spread: each side
samples its own prompts and responses. Here sampling is taken out. 16 training prompts of the addition
task and, for each of ``--steps`` steps, 8 completions per prompt are drawn once from the warm-started
model (``transformers`` ``generate``, temperature 1, at most 6 new tokens, EOS included); then both sides
train on exactly those: ours with the 16 rows as ``data.train_files`` (one batch = one epoch) and the
engine's ``generate_responses`` replaced by a lookup of the next completion of the row's prompt, TRL with
the 16 rows as its dataset and ``_generate_single_turn`` replaced by the same lookup (trl_side.py). All
else is parity_trl.py's command line. Step 1 starts from the same weights, so its reward, entropy,
response length and gradient norm (before clipping) must agree to float rounding if the two compute the
same advantages and loss; later steps also test the KL term (the policy has left the reference) and,
through the weights, the optimiser step.

Printed per setting and step: each metric on both sides and the relative difference; the check passes
when every relative difference is below ``--tolerance``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_trl import ADDITION_PY, DEFAULT_TRL_VENV, REPO, child_env, timed_run  # noqa: E402
from parity_trl import (MAX_NEW_TOKENS, METRICS, PROMPTS_PER_STEP, SAMPLES_PER_PROMPT, SETTINGS,  # noqa: E402
                        load_curves, ours_command, trl_command, warm_start_model)
from trl_side import TRL_SCRIPT, ensure_trl  # noqa: E402

# Ours, in-process: the rollout engine's sampling replaced by the fixed completions, then main_ppo as usual.
OURS_SCRIPT = r'''
import json, sys
import torch
from verl.rollout.base import RolloutEngine
from verl.rollout.hf import HFRollout
from verl.rollout.native import NativeRollout

cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
with open(cfg["replay"]) as fh:
    queues = json.load(fh)


def replay(self, input_ids, attention_mask, params, seeds):
    rows = [queues[json.dumps(ids[mask.bool()].tolist())].pop(0) for ids, mask in zip(input_ids, attention_mask)]
    out = torch.full((len(rows), max(len(r) for r in rows)), self.pad_token_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r)
    return out.to(input_ids.device), None


NativeRollout.generate_responses = HFRollout.generate_responses = replay
from verl.trainer.main_ppo import main
sys.exit(main(cfg["keys"]))
'''


def relative_difference(a: float, b: float) -> float:
    """|a - b| / max(|a|, |b|), 0 when both are 0."""
    scale = max(abs(a), abs(b))
    return 0.0 if scale == 0 else abs(a - b) / scale


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--steps", type=int, default=3, help="steps, each on its own fixed completions")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts and of drawing the completions")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--kl-coef", type=float, default=None,
                        help="the KL coefficient of the settings that have a KL term (default: parity_trl.py's); "
                             "a large one makes any difference in the KL gradient stand out")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest relative difference that passes")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=REPO / "outputs" / "parity_trl_fixed")
    parser.add_argument("--trl-venv", type=Path, default=DEFAULT_TRL_VENV)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.threads < 1 or args.tolerance <= 0:
        parser.error("--steps and --threads must be at least 1, --tolerance positive")
    return args


def draw_completions(model_dir: Path, steps: int, seed: int, workdir: Path) -> tuple[Path, Path]:
    """The 16 prompts (rows.jsonl) and ``steps`` x 8 completions of each (replay.json: prompt token ids as
    JSON -> the completions in the order the steps take them)."""
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.spec_from_file_location("addition", ADDITION_PY)
    task = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(task)
    rows = task.make_rows("train", n=PROMPTS_PER_STEP, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"] for r in rows]
    if len({len(p) for p in prompts}) != 1:
        raise SystemExit("the fixed prompts differ in length; pick another --seed")
    torch.manual_seed(seed)
    ids = torch.tensor(prompts).repeat_interleave(SAMPLES_PER_PROMPT * steps, dim=0)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
    queues = {}
    for i, prompt in enumerate(prompts):
        completions = []
        for row in out[i * SAMPLES_PER_PROMPT * steps:(i + 1) * SAMPLES_PER_PROMPT * steps, len(prompt):].tolist():
            end = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
            completions.append(row[:end])
        queues[json.dumps(prompt)] = completions
    rows_path, replay_path = workdir / "rows.jsonl", workdir / "replay.json"
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    replay_path.write_text(json.dumps(queues))
    return rows_path, replay_path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(args.threads)
    trl_python = ensure_trl(args.trl_venv, force=False)
    model = warm_start_model(args.workdir / "model")
    rows, replay = draw_completions(model, args.steps, args.seed, args.workdir)
    (args.workdir / "trl_grpo.py").write_text(TRL_SCRIPT)
    (args.workdir / "ours_replay.py").write_text(OURS_SCRIPT)
    env = child_env(args.threads)
    worst = 0.0
    shape = argparse.Namespace(steps=args.steps, lr=args.lr, threads=args.threads)  # what the commands read
    for setting in args.settings:
        curves = {}
        for side in ("ours", "TRL"):
            out_dir = args.workdir / setting / side.lower()
            shutil.rmtree(out_dir, ignore_errors=True)
            out_dir.mkdir(parents=True)
            if side == "ours":
                keys = ours_command(shape, model, out_dir / "run", setting, args.seed)[3:]
                if args.kl_coef is not None:
                    keys = [k for k in keys if not k.startswith("actor_rollout_ref.actor.kl_loss_coef=")]
                    keys.append(f"actor_rollout_ref.actor.kl_loss_coef={args.kl_coef}")
                keys += [f"data.train_files={rows}", f"trainer.total_epochs={args.steps}"]
                cmd = [str(REPO / ".venv" / "bin" / "python"), str(args.workdir / "ours_replay.py"),
                       json.dumps({"keys": keys, "replay": str(replay), "threads": args.threads})]
                cwd = REPO  # verl from the tree this script is in
            else:
                cmd = trl_command(trl_python, args.workdir / "trl_grpo.py", shape, model, out_dir, setting, args.seed)
                cfg = json.loads(cmd[2])
                cfg.update(rows_jsonl=str(rows), replay=str(replay))
                if args.kl_coef is not None and cfg["beta"] != 0:
                    cfg["beta"] = args.kl_coef
                cmd[2] = json.dumps(cfg)
                cwd = out_dir
            timed_run(cmd, cwd, env, args.timeout, out_dir / "log.txt")
            curves[side] = load_curves(out_dir, side)
        # Steps where some token's k3 passed 10: ours clamps it (no gradient), TRL does not (parity_trl.py's
        # docstring), so from that step's gradient on the two differ by design; shown, not judged.
        clamped = [abs(u - c) > 1e-6 * max(abs(u), 1e-12) for u, c in
                   zip(curves["TRL"].get("kl_unclamped", []), curves["TRL"].get("kl", []))]
        first_clamped = clamped.index(True) + 1 if any(clamped) else None
        kl_note = f", KL coefficient {args.kl_coef:g}" if args.kl_coef is not None and setting == "grpo" else ""
        print(f"\n=== {setting}: {SETTINGS[setting]['title']} "
              f"(the same {args.steps} batches on both sides{kl_note}) ===")
        print(f"  {'metric':<16} {'step':>4} {'ours':>12} {'TRL':>12} {'rel. diff':>10}")
        for metric in METRICS:
            if metric not in curves["ours"] or metric not in curves["TRL"]:
                continue
            for step, (o, t) in enumerate(zip(curves["ours"][metric], curves["TRL"][metric]), start=1):
                diff = relative_difference(o, t)
                # What a step logs before its update is judged up to the first clamped step; its gradient is not.
                judged = first_clamped is None or step < first_clamped or (step == first_clamped
                                                                              and metric != "grad_norm")
                worst = max(worst, diff if judged else 0.0)
                print(f"  {metric:<16} {step:>4} {o:>12.6g} {t:>12.6g} {diff:>10.2e}"
                      + ("" if judged else "  (k3 clamp active: not judged)"))
        if first_clamped is not None:
            u, c = curves["TRL"]["kl_unclamped"][first_clamped - 1], curves["TRL"]["kl"][first_clamped - 1]
            print(f"  from step {first_clamped} some k3 > 10 (TRL's kl {u:.4g}, clamped {c:.4g}): ours clamps, TRL not")
    ok = worst < args.tolerance
    print(f"\nlargest relative difference {worst:.2e}: {'PASS' if ok else 'FAIL'} (tolerance {args.tolerance:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
