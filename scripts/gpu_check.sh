#!/usr/bin/env bash
# The GPU check, as one prepared script for a lent GPU machine (torch, transformers and triton
# there; no vLLM, no internet). From the repository root:
#
#   bash scripts/gpu_check.sh            # 1 GPU;   NPROC=8 bash scripts/gpu_check.sh for 8
#
# It runs a short GRPO job under torchrun on nccl: a Qwen2 model of Qwen2-0.5B's shape (24 layers,
# hidden 896, 14 heads / 2 KV heads, MLP 4864) with random weights and the built-in byte-level
# tokenizer (259 tokens, so the body is ~0.36B parameters), bf16 under FSDP2, on the built-in
# addition prompts. Then it prints tokens/s and model FLOPs utilisation (MFU) per stage:
#   gen           2 x params FLOPs per generated token (decode; the prompt prefill is not counted)
#   old_log_prob  2 x params per token of prompt + response (a forward)
#   ref           same
#   update_actor  6 x params per token x ppo_epochs (forward + backward)
# against PEAK_TFLOPS (default 989: H100/H200 dense bf16). Nothing is downloaded or installed.
# It also prints the peak memory the actor's rank logged (perf/max_memory_allocated_gb on a GPU,
# perf/cpu_memory_used_gb, the process's peak RSS). Variants: DTYPE=fp32, EXTRA="key=value ..." (for
# example actor_rollout_ref.model.enable_gradient_checkpointing=true), OUT=folder.
# SMOKE=1 runs the same pipeline on the CPU with a tiny model (to check the script itself).
set -euo pipefail
cd "$(dirname "$0")/.."
NPROC=${NPROC:-1}
STEPS=${STEPS:-6}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
OUT=${OUT:-/tmp/verl-gpu-check}
PY=${PYTHON:-python}
if [[ "${SMOKE:-0}" == 1 ]]; then
  DEVICE=cpu DTYPE=fp32 MODEL="num_layers=2, hidden_size=64, intermediate_size=128" PROMPTS=8 RESPONSE=16 MICRO=8
else
  DEVICE=cuda DTYPE=${DTYPE:-bf16} PROMPTS=64 RESPONSE=256 MICRO=64
  MODEL="num_layers=24, hidden_size=896, intermediate_size=4864, num_heads=14, num_kv_heads=2, max_position_embeddings=4096"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1

"$PY" - <<'EOF'
import importlib, sys
import torch
print(f"torch {torch.__version__}, cuda {torch.version.cuda}, {torch.cuda.device_count()} GPU(s): "
      f"{[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}")
missing = [m for m in ("transformers", "safetensors", "tokenizers", "yaml", "tqdm", "jinja2", "pyarrow", "numpy")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_check: missing Python packages {missing}; install them (pip install -e .) first")
EOF
[[ "$DEVICE" == cpu ]] || "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device visible')"

rm -rf "$OUT" && mkdir -p "$OUT"
"$PY" -c "from verl.models.tiny import make_tiny_model_folder; make_tiny_model_folder('$OUT/model', $MODEL)"

"$PY" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" -m verl.trainer.main_ppo \
  actor_rollout_ref.model.path="$OUT/model" actor_rollout_ref.model.dtype=$DTYPE \
  actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=$DTYPE \
  actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32 \
  actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=$DTYPE \
  data.builtin_task=addition data.train_batch_size=$((PROMPTS * NPROC)) data.max_prompt_length=32 \
  data.max_response_length=$RESPONSE actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.actor.ppo_mini_batch_size=$((PROMPTS / 2 * NPROC)) \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$MICRO \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=$((2 * MICRO)) \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=$((2 * MICRO)) \
  actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.optim.lr=1e-6 \
  algorithm.adv_estimator=grpo trainer.device=$DEVICE trainer.total_training_steps="$STEPS" \
  trainer.val_before_train=false trainer.test_freq=-1 trainer.progress_bar=false \
  trainer.logger=[console] trainer.default_local_dir="$OUT/run" trainer.write_report=false ${EXTRA:-} 2>&1 | grep -v "^step:" || true

"$PY" - "$OUT" "$PEAK_TFLOPS" "$NPROC" <<'EOF'
import json, sys
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM

out, peak, nproc = Path(sys.argv[1]), float(sys.argv[2]) * 1e12, int(sys.argv[3])
with torch.device("meta"):
    params = sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out / "model")).parameters())
rows = [json.loads(l) for l in (out / "run" / "metrics.jsonl").read_text().splitlines()]
steps = [r for r in rows if "timing_s/step" in r][1:]  # the first step pays one-off costs
if not steps:
    sys.exit("gpu_check: the run logged no steps; see its output above")
mean = lambda k: sum(r[k] for r in steps) / len(steps)
tokens = mean("perf/total_num_tokens")                      # prompt + response tokens of a step
gen_tokens = mean("response_length/mean") * tokens / (mean("prompt_length/mean") + mean("response_length/mean"))
flops = {"gen": 2 * params * gen_tokens, "old_log_prob": 2 * params * tokens, "ref": 2 * params * tokens,
         "update_actor": 6 * params * tokens}
print(f"\nmodel {params / 1e6:.0f}M parameters, {nproc} GPU(s), mean of {len(steps)} steps, peak {peak / 1e12:.0f} TFLOP/s per GPU")
print(f"{'stage':<14}{'seconds':>9}{'tokens/s':>12}{'MFU':>8}")
for stage, f in flops.items():
    seconds = mean(f"timing_s/{stage}")
    n = gen_tokens if stage == "gen" else tokens
    print(f"{stage:<14}{seconds:>9.3f}{n / seconds:>12,.0f}{f / seconds / (peak * nproc):>8.1%}")
print(f"{'step':<14}{mean('timing_s/step'):>9.3f}{tokens / mean('timing_s/step'):>12,.0f}")
peak = lambda k: max(r.get(k, 0.0) for r in rows)
memory = ", ".join(f"{k.split('/')[1]} {peak(k):.2f} GiB" for k in
                   ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb")
                   if any(k in r for r in rows))
print(f"peak memory of the actor's rank: {memory}")
EOF
