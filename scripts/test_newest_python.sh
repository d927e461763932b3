#!/usr/bin/env bash
# The torch-free suites (simulator, control plane, workloads, the engine's scheduler and block
# accounting, the golden runs and the compiled modules) on the newest Python PEARL supports, in
# a venv of its own (.venv-py3.13; PEARL_NEWEST_PYTHON names the interpreter, else python3.13
# from PATH or pyenv). The torch suites stay on the oldest: PyPI's torch for another Python
# is a CUDA build of several GB. Extra pytest arguments pass through.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION=3.13
VENV="${PEARL_NEWEST_VENV:-$ROOT/.venv-py$VERSION}"
PYTHON="${PEARL_NEWEST_PYTHON:-}"
if [ -z "$PYTHON" ]; then
  if command -v "python$VERSION" >/dev/null && "python$VERSION" -V >/dev/null 2>&1; then
    PYTHON="python$VERSION"
  elif command -v pyenv >/dev/null && [ -n "$(pyenv versions --bare | grep "^$VERSION" | tail -1)" ]; then
    PYTHON="$(pyenv root)/versions/$(pyenv versions --bare | grep "^$VERSION" | tail -1)/bin/python$VERSION"
  else
    echo "[pearl] no Python $VERSION found (set PEARL_NEWEST_PYTHON): newest-Python suites skipped"
    exit 0
  fi
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "[pearl] creating the Python $VERSION environment in $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip 2>&1 | { grep -v "^WARNING: Location" || true; }
fi
STAMP="$VENV/.pearl-$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$0" | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
  echo "[pearl] installing pearl-rollout on Python $VERSION (builds its compiled modules)"
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT" "scipy>=1.11" "pytest>=8" "hypothesis>=6.100" \
    "mypy==2.4.1" "setuptools>=68" 2>&1 | { grep -v "^WARNING: Location" || true; }
  rm -f "$VENV"/.pearl-*
  touch "$STAMP"
fi
"$VENV/bin/python" -m pearl.native >/dev/null || true  # rebuilt after an edit (says why not)
cd "$ROOT"
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "$VENV/bin/python" -m pytest -p no:cacheprovider \
  tests/sim tests/control tests/workloads tests/engine/test_scheduler.py \
  tests/engine/test_block_manager.py tests/engine/test_block_manager_reference.py \
  tests/apps/test_golden.py tests/test_token_runs.py tests/test_native.py "$@"
