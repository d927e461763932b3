#!/usr/bin/env bash
# The main job on its embedded default: set up the environment if needed, then run the demo.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh" live
exec pearl demo "$@"
