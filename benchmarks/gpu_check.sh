#!/usr/bin/env bash
# GPU readiness check (< 10 minutes on one GPU): the vLLM backend on CUDA, a bf16 ACoT training step of
# GPT-2 124M, a bf16 ADLM diffusion step and sampler call, and GRPO's vLLM generation path when
# train/grpo.py is there. Writes one JSON (default benchmarks/results/gpu_check.json).
#
#   bash benchmarks/gpu_check.sh                  # on the GPU machine
#   bash benchmarks/gpu_check.sh --dry-run        # here: toy sizes on the CPU, CUDA parts skipped
#   bash benchmarks/gpu_check.sh --out "$OUT/gpu_check.json" --parts acot_step,diffusion_step
#
# Runs from a bare checkout too (the package need not be installed: `python -m benchmarks.gpu_check` from the
# checkout's root finds anchored_reasoning there). Parts whose packages are missing are skipped with the names to carry; see docs/serving.md.
set -uo pipefail
cd "$(dirname "$0")/.."
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
PY="${PYTHON:-$(command -v python3 || command -v python)}"
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "gpu_check: $PY cannot import torch; set PYTHON to the interpreter that has it" >&2
  exit 2
fi
"$PY" -c "import torch; print('gpu_check: torch', torch.__version__, '| CUDA:', torch.cuda.is_available() and torch.cuda.get_device_name(0) or 'none (CUDA parts will be skipped)')"
exec timeout "${GPU_CHECK_TIMEOUT:-570}" "$PY" -m benchmarks.gpu_check "$@"
