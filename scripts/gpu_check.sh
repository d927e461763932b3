#!/usr/bin/env bash
# The first GPU session in one command: bash scripts/gpu_check.sh [out folder]
# 1. torch sees the GPU; 2. the engine on the GPU against transformers on the same GPU
# (float32 and bfloat16 logits, greedy tokens, decode rate: scripts/gpu_check.py);
# 3. a short `pearl train` with engines and trainer on the GPU in bfloat16;
# 4. with two or more GPUs, the same with two trainer processes (FSDP2 over nccl);
# 5. the vLLM backend on the GPU (its tests, then short runs of `roll` and `pearl`), from
#    its own venv.
# Builds its own venv (.venv-gpu) with the registry's default torch build (CUDA on Linux
# x86), so the CPU install is untouched; PEARL_TORCH_SPEC overrides it. Everything it
# prints is also written under the out folder (default gpu_check/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/gpu_check}"
mkdir -p "$OUT"
export PEARL_VENV="${PEARL_GPU_VENV:-$ROOT/.venv-gpu}"
export PEARL_TORCH_SPEC="${PEARL_TORCH_SPEC:-torch==2.13.0}"
source "$ROOT/scripts/env.sh" live
PY="$PEARL_VENV/bin/python"
exec > >(tee "$OUT/gpu_check.log") 2>&1

echo "== 1. torch and the GPU"
"$PY" - <<'PY'
import torch
assert torch.cuda.is_available(), f"torch {torch.__version__} sees no GPU (CPU build?)"
n = torch.cuda.device_count()
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {n} GPU(s):",
      ", ".join(torch.cuda.get_device_name(i) for i in range(n)))
PY
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")

echo "== 2. the engine on the GPU against transformers"
"$PY" "$ROOT/scripts/gpu_check.py" --device cuda --out "$OUT/engine.json"

echo "== 3. pearl train on the GPU, bfloat16 (3 steps)"
"$PEARL_VENV/bin/pearl" train rollout.device=cuda rollout.dtype=bfloat16 \
  trainer.device=cuda trainer.dtype=bfloat16 \
  "cluster.worker_resources={GPU: 0.4}" "cluster.trainer_resources={GPU: 0.4}" \
  run.steps=3 run.eval_tasks=16 "run.run_dir=$OUT" run.run_name=train-gpu

if [ "$GPUS" -ge 2 ]; then
  echo "== 4. two trainer processes (FSDP2 over nccl), one GPU each"
  "$PEARL_VENV/bin/pearl" train rollout.device=cuda rollout.dtype=bfloat16 \
    trainer.device=cuda trainer.dtype=bfloat16 trainer.processes=2 \
    "cluster.worker_resources={GPU: 0.2}" "cluster.trainer_resources={GPU: 0.8}" \
    run.steps=3 run.eval_tasks=16 "run.run_dir=$OUT" run.run_name=train-gpu-fsdp2
else
  echo "== 4. skipped: one GPU (two trainer processes need two)"
fi
echo "== 5. the vLLM backend on the GPU (its own venv with vLLM's CUDA build)"
PEARL_VLLM_VENV="$ROOT/.venv-gpu-vllm" PEARL_VLLM_SPEC=vllm PEARL_VLLM_TORCH= \
  bash "$ROOT/scripts/vllm_env.sh"
# Its tests (PD through PEARL's KV connector on CUDA's KV layout, sleep level 1 with
# enable_sleep_mode freeing memory, weights with turns in flight), up to three vLLM
# engines at once outside Ray: a quarter of the GPU each.
PEARL_VLLM_GPU_MEMORY=0.25 "$ROOT/.venv-gpu-vllm/bin/python" -m pytest -q \
  "$ROOT/tests/live/test_vllm_backend.py"
"$ROOT/.venv-gpu-vllm/bin/pearl" train rollout.backend=vllm rollout.dtype=bfloat16 \
  trainer.device=cuda trainer.dtype=bfloat16 \
  "cluster.worker_resources={GPU: 0.4}" "cluster.trainer_resources={GPU: 0.4}" \
  run.steps=3 run.eval_tasks=16 "run.run_dir=$OUT" run.run_name=train-gpu-vllm
# PEARL itself on vLLM: adaptive PD between two vLLM workers, borrowing the trainer's share
"$ROOT/.venv-gpu-vllm/bin/pearl" train rollout.backend=vllm rollout.dtype=bfloat16 \
  trainer.device=cuda trainer.dtype=bfloat16 cluster.policy=pearl rollout.workers=2 \
  "cluster.worker_resources={GPU: 0.25}" "cluster.trainer_resources={GPU: 0.25}" \
  run.steps=3 run.eval_tasks=16 "run.run_dir=$OUT" run.run_name=train-gpu-vllm-pearl
echo "gpu_check: all checks passed; results in $OUT"
