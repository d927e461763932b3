#!/usr/bin/env bash
# The test suite: set up the environment if needed, then run pytest (fast tests by default).
# `--vllm` runs the vLLM backend's tests instead, on the real package (scripts/test_vllm.sh).
set -euo pipefail
if [ "${1:-}" = "--vllm" ]; then
  shift
  exec bash "$(dirname "${BASH_SOURCE[0]}")/test_vllm.sh" "$@"
fi
source "$(dirname "${BASH_SOURCE[0]}")/env.sh" live,dev
# verifiers lives in a venv of its own (its pins clash with PEARL's); its tests need it.
bash "$ROOT/scripts/verifiers_env.sh" >/dev/null
cd "$ROOT"
set +e
python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "[pearl] no tests were collected"
  exit 0
fi
exit "$rc"
