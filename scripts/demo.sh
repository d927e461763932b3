#!/usr/bin/env bash
# The main job on its embedded default: set up the environment if needed, then train
# SmolLM2-135M-Instruct live on the calculator task (pearl train; ~4 min on 2 CPU cores).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh" live
exec pearl train "$@"
