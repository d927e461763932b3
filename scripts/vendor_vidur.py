"""Extract the small slice of Vidur's H100 operator profiles that PEARL's cost-model check uses.

    python scripts/vendor_vidur.py /path/to/vidur   # a checkout of github.com/microsoft/vidur

Writes ``src/pearl/sim/data/vidur_h100_linear.csv``: per model, tensor-parallel degree and
token count, the median time of one layer's four linear operators (QKV projection, output
projection, MLP up(+gate) projection, MLP down projection) summed, with the model's
dimensions; and ``vidur_h100_allreduce.csv``: NCCL all-reduce median time on a DGX H100
by number of GPUs and message bytes. Token counts and sizes are thinned to geometric grids
to keep the files small. Source and licence: see ``src/pearl/sim/data/README.md``.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

MODELS = (
    "meta-llama/Llama-2-7b-hf",
    "meta-llama/Llama-2-70b-hf",
    "codellama/CodeLlama-34b-Instruct-hf",
    "internlm/internlm-20b",
    "Qwen/Qwen-72B",
    "microsoft/phi-2",
)
OPERATORS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
TOKENS = (
    1,
    2,
    4,
    8,
    16,
    24,
    32,
    48,
    64,
    96,
    128,
    192,
    256,
    384,
    512,
    768,
    1024,
    1536,
    2048,
    3072,
    4096,
)
DATA = Path(__file__).resolve().parents[1] / "src" / "pearl" / "sim" / "data"
OUT = DATA / "vidur_h100_linear.csv"
ALLREDUCE_OUT = DATA / "vidur_h100_allreduce.csv"


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = Path(sys.argv[1]) / "data" / "profiling" / "compute" / "h100"
    rows, seen = [], set()
    for model in MODELS:
        path = root / model / "mlp.csv"
        if not path.is_file():
            sys.exit(f"{path}: not found (is {sys.argv[1]} a checkout of microsoft/vidur?)")
        for r in csv.DictReader(path.open()):
            tokens, tp = int(r["num_tokens"]), int(r["num_tensor_parallel_workers"])
            if tokens not in TOKENS or (model, tp, tokens) in seen:
                continue  # a few token counts were profiled twice: the first run is kept
            seen.add((model, tp, tokens))
            seconds = sum(float(r[f"time_stats.{op}.median"]) for op in OPERATORS) * 1e-3
            rows.append(
                {
                    "model": model.split("/")[1],
                    "tp": tp,
                    "tokens": tokens,
                    "seconds": f"{seconds:.4e}",
                    "hidden": int(r["n_embd"]),
                    "heads": int(r["n_head"]),
                    "kv_heads": int(r["n_kv_head"]),
                    "intermediate": int(r["n_expanded_embd"]),
                    "gated_mlp": r["use_gated_mlp"] == "True",
                }
            )
    rows.sort(key=lambda r: (r["model"], r["tp"], r["tokens"]))
    with OUT.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {OUT}")
    allreduce(Path(sys.argv[1]) / "data" / "profiling" / "network" / "h100_dgx" / "all_reduce.csv")


def allreduce(path: Path) -> None:
    """Rank 0's median per (GPUs, size nearest each power of two from 2 KiB to 64 MiB)."""
    by_gpus: dict[int, dict[int, float]] = {}
    for r in csv.DictReader(path.open()):
        if r["rank"] == "0":
            by_gpus.setdefault(int(r["num_workers"]), {}).setdefault(
                int(r["size"]), float(r["time_stats.all_reduce.median"]) * 1e-3
            )
    rows = []
    for gpus, times in sorted(by_gpus.items()):
        sizes = sorted(times)
        chosen = sorted({min(sizes, key=lambda s, t=2**k: abs(s - t)) for k in range(11, 27)})
        for size in chosen:
            rows.append({"gpus": gpus, "bytes": size, "seconds": f"{times[size]:.4e}"})
    with ALLREDUCE_OUT.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {ALLREDUCE_OUT}")


if __name__ == "__main__":
    main()
