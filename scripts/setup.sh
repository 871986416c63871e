#!/usr/bin/env bash
# Set up a virtual environment in .venv with verl installed (editable).
#   bash scripts/setup.sh           # verl + runtime dependencies
#   bash scripts/setup.sh --test    # ... + test tools
# Torch: on a machine without an NVIDIA GPU this installs the CPU build, never a multi-GB CUDA
# build: from a local wheel when pip can find one, else from PyTorch's CPU index.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
extras=""
[[ "${1:-}" == "--test" ]] && extras="[test]"

if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1

if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    $PIP install -q "torch>=2.6"
  elif tmp=$(mktemp -d) && $PIP download -q --no-deps --no-index -d "$tmp" "torch==2.13.0+cpu" >/dev/null 2>&1; then
    $PIP install -q "torch==2.13.0+cpu"          # the CPU wheel pip finds locally
  else
    $PIP install -q torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi
$PIP install -q -e ".${extras}"
.venv/bin/python -c "import torch, verl; print(f'verl {verl.__version__} ready (torch {torch.__version__}, cuda={torch.cuda.is_available()})')"
