#!/usr/bin/env bash
# The first GPU session in one command: bash scripts/gpu_check.sh [out folder]
# 1. torch sees the GPU; 2. the engine on the GPU against transformers on the same GPU
# (float32 and bfloat16 logits, greedy tokens, decode tokens/s at batch 1-64 beside
# `generate`: scripts/gpu_check.py); 3. the batched sampler on the GPU against the per-row
# one (benchmarks/sampler.py); 4. the cost model's prices against kernels timed on the GPU
# (scripts/gpu_costmodel.py); 5. `pearl train` for 3 steps with engines and trainer on the
# GPU in bfloat16 (with two or more GPUs, also two trainer processes over nccl); 6. the vLLM
# backend on the GPU: its tests (PD through PEARL's KV connector, sleep and wake freeing
# memory, weights with turns in flight) and `pearl train` with `roll` and `pearl`.
# One JSON of everything measured: <out>/results.json; everything printed: <out>/gpu_check.log.
#
# Two ways to get its Python:
# - online (the default): builds .venv-gpu with the registry's default torch build (CUDA on
#   Linux x86) and, for step 6, .venv-gpu-vllm with vLLM's CUDA build;
# - offline (PEARL_GPU_PYTHON=/path/to/python, e.g. a GPU machine's own image with torch and
#   transformers and no network): PEARL runs from this checkout's src/ on that Python, and a
#   step whose packages it lacks (ray and pydantic for 5, vllm for 6) is skipped, said so.
# A failed step is reported and the next runs; the exit status says whether all passed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/gpu_check}"
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
if [ -n "${PEARL_GPU_PYTHON:-}" ]; then
  PY="$PEARL_GPU_PYTHON"
  export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
  PEARL=("$PY" -m pearl.cli)
  VLLM_PY="$PY"
  # No weights reach an offline machine: SmolLM2-135M's architecture with random weights
  # for the engine checks, the tests' tiny chat model (its tokenizer built here) for training.
  ENGINE_MODEL=(--random-model smollm2-135m)
  "$PY" -c "import sys; sys.path.insert(0, '$ROOT/tests'); from pathlib import Path; \
from tiny_model import tiny_chat_model; tiny_chat_model(Path('$OUT/tiny-chat'))" || exit 1
  TRAIN_MODEL=("model.name=$OUT/tiny-chat")
else
  export PEARL_VENV="${PEARL_GPU_VENV:-$ROOT/.venv-gpu}"
  export PEARL_TORCH_SPEC="${PEARL_TORCH_SPEC:-torch==2.13.0}"
  source "$ROOT/scripts/env.sh" live || exit 1
  PY="$PEARL_VENV/bin/python"
  PEARL=("$PEARL_VENV/bin/pearl")
  VLLM_PY=""
  ENGINE_MODEL=(--model smollm2-135m)
  TRAIN_MODEL=()
fi
FAILED=()
step() { # step NAME COMMAND...: run it, remember a failure, go on
  local name="$1"
  shift
  echo "== $name"
  if ! "$@"; then
    echo "== $name: FAILED"
    FAILED+=("$name")
  fi
}
has() { "$PY" -c "import $1" 2>/dev/null; }

echo "== 1. torch and the GPU"
"$PY" - <<'PY' || exit 1
import torch
assert torch.cuda.is_available(), f"torch {torch.__version__} sees no GPU (CPU build?)"
n = torch.cuda.device_count()
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {n} GPU(s):",
      ", ".join(torch.cuda.get_device_name(i) for i in range(n)))
PY
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")

step "2. the engine against transformers" \
  "$PY" "$ROOT/scripts/gpu_check.py" --device cuda "${ENGINE_MODEL[@]}" --out "$OUT/engine.json"
step "3. the batched sampler" \
  "$PY" "$ROOT/benchmarks/sampler.py" --device cuda --out "$OUT/sampler.json"
step "4. the cost model against kernels" \
  "$PY" "$ROOT/scripts/gpu_costmodel.py" --out "$OUT/gpu_costmodel.json"

TRAIN=("${TRAIN_MODEL[@]}" rollout.device=cuda rollout.dtype=bfloat16 trainer.device=cuda trainer.dtype=bfloat16
  run.steps=3 run.eval_tasks=16 "run.run_dir=$OUT")
if has ray && has pydantic; then
  step "5. pearl train on the GPU, bfloat16 (3 steps)" "${PEARL[@]}" train "${TRAIN[@]}" \
    "cluster.worker_resources={GPU: 0.4}" "cluster.trainer_resources={GPU: 0.4}" \
    run.run_name=train-gpu
  if [ "$GPUS" -ge 2 ]; then
    step "5b. two trainer processes (FSDP2 over nccl)" "${PEARL[@]}" train "${TRAIN[@]}" \
      trainer.processes=2 "cluster.worker_resources={GPU: 0.2}" \
      "cluster.trainer_resources={GPU: 0.8}" run.run_name=train-gpu-fsdp2
  fi
else
  echo "== 5. skipped: $PY lacks ray or pydantic (pearl train's actors and config)"
fi

if [ -z "$VLLM_PY" ]; then # online: vLLM's CUDA build in a venv of its own
  PEARL_VLLM_VENV="$ROOT/.venv-gpu-vllm" PEARL_VLLM_SPEC=vllm PEARL_VLLM_TORCH= \
    bash "$ROOT/scripts/vllm_env.sh" && VLLM_PY="$ROOT/.venv-gpu-vllm/bin/python"
fi
if [ -n "$VLLM_PY" ] && "$VLLM_PY" -c "import vllm, ray" 2>/dev/null; then
  # Up to three vLLM engines at once outside Ray: a quarter of the GPU each.
  step "6. the vLLM backend's tests on the GPU" env PEARL_VLLM_GPU_MEMORY=0.25 \
    "$VLLM_PY" -m pytest -q "$ROOT/tests/live/test_vllm_backend.py"
  step "6b. pearl train on vLLM (roll)" "$VLLM_PY" -m pearl.cli train "${TRAIN[@]}" \
    rollout.backend=vllm "cluster.worker_resources={GPU: 0.4}" \
    "cluster.trainer_resources={GPU: 0.4}" run.run_name=train-gpu-vllm
  # PEARL itself on vLLM: adaptive PD between two vLLM workers, borrowing the trainer's share
  step "6c. pearl train on vLLM (pearl)" "$VLLM_PY" -m pearl.cli train "${TRAIN[@]}" \
    rollout.backend=vllm cluster.policy=pearl rollout.workers=2 \
    "cluster.worker_resources={GPU: 0.25}" "cluster.trainer_resources={GPU: 0.25}" \
    run.run_name=train-gpu-vllm-pearl
else
  echo "== 6. skipped: no Python with vllm and ray"
fi

# One JSON: each step's file as it wrote it, each run's summary, and what failed.
"$PY" - "$OUT" "${FAILED[@]}" <<'PY'
import json, sys
from pathlib import Path
out, failed = Path(sys.argv[1]), sys.argv[2:]
results = {"failed": failed}
for name in ("engine", "sampler", "gpu_costmodel"):
    path = out / f"{name}.json"
    results[name] = json.loads(path.read_text()) if path.is_file() else None
results["train"] = {
    p.parent.name: json.loads(p.read_text()) for p in sorted(out.glob("train-*/summary.json"))
}
(out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
print(f"gpu_check: {out / 'results.json'}; failed: {', '.join(failed) or 'none'}")
PY
[ ${#FAILED[@]} -eq 0 ]
