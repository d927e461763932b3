"""The trainer's peak memory and step time: full fine-tuning, + a KL reference, LoRA, LoRA + KL.

    .venv/bin/python benchmarks/trainer_memory.py            # SmolLM2-135M, ~3 min
    .venv/bin/python benchmarks/trainer_memory.py --steps 3 --rank 8

Each variant runs in a fresh process (peak memory is a process's high-water mark): a
``GRPOTrainer`` on SmolLM2-135M-Instruct takes ``--steps`` steps on the same synthetic
batch (8 groups of 4 single-turn trajectories: a 150-token prompt per group, 24-48-token
replies, rewards that differ within each group so every trajectory is scored, behaviour
log-probabilities moved off the model's own). Reported per variant: the training state's
bytes (weights, gradients, AdamW moments, the KL reference's weights: exact, from the
tensors), the process's peak resident set after the model is built and after the steps
(what the operating system saw; the allocator reuses freed pages, so a copy made after a
larger transient may not raise it), and the median step time. The KL reference is a frozen copy of the weights for full fine-tuning,
the base model with the adapters switched off for LoRA. Writes
``results/trainer_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import time
from pathlib import Path

VARIANTS = {
    "full": {},
    "full + KL": {"kl_coef": 0.04},
    "LoRA": {"lora": True},
    "LoRA + KL": {"lora": True, "kl_coef": 0.04},
}


def synthetic_batch(vocab: int):
    from pearl.control.interfaces import TrainBatch, TrainSample

    rng = random.Random(0)
    samples = []
    for g in range(8):
        prompt = [rng.randrange(vocab) for _ in range(150)]
        for k in range(4):
            reply = [rng.randrange(vocab) for _ in range(24 + 8 * k)]
            ids = tuple(prompt + reply)
            mask = (0,) * len(prompt) + (1,) * len(reply)
            logprobs = tuple(-5.0 + rng.uniform(-0.3, 0.3) if m else 0.0 for m in mask)
            samples.append(TrainSample(ids, mask, logprobs, float(k % 2), f"g{g}"))
    return TrainBatch(0, len(samples), 0, 0, samples=tuple(samples))


def measure(name: str, steps: int, rank: int, queue) -> None:
    import resource

    import torch

    from pearl.live.lora import LoRAConfig
    from pearl.live.server import ModelSpec
    from pearl.live.trainer import GRPOTrainer
    from pearl.live.trainer_config import TrainerConfig
    from pearl.models.catalog import resolve_model

    torch.set_num_threads(2)
    fields = dict(VARIANTS[name])
    lora = LoRAConfig(rank) if fields.pop("lora", False) else None
    config = TrainerConfig(learning_rate=1e-5, lora=lora, micro_batch_tokens=1024, **fields)
    trainer = GRPOTrainer(ModelSpec(folder=str(resolve_model("smollm2-135m"))), config, 2)
    built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    batch = synthetic_batch(trainer.model.config.vocab_size)
    seconds = []
    for _ in range(steps):
        t0 = time.perf_counter()
        stats = trainer.train_step(batch)
        seconds.append(time.perf_counter() - t0)
    state = trainer.state_bytes()
    queue.put(
        {
            "variant": name,
            "state_gib": {k: v / 2**30 for k, v in state.items()},
            "peak_after_build_gib": built,
            "peak_gib": stats["memory_mb"] / 1024,
            "step_s_median": statistics.median(seconds),
            "step_s": seconds,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--out", default="results/trainer_memory.json")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    results = []
    for name in VARIANTS:
        queue = ctx.Queue()
        proc = ctx.Process(target=measure, args=(name, args.steps, args.rank, queue))
        proc.start()
        results.append(queue.get())
        proc.join()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(
        "| variant | weights | gradients | optimizer | KL reference | peak RSS after build | "
        "peak RSS after steps | step s (median) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        st = r["state_gib"]
        print(
            f"| {r['variant']} | {st['weights']:.2f} GiB | {st['gradients']:.3f} GiB | "
            f"{st['optimizer']:.3f} GiB | {st['reference']:.2f} GiB | "
            f"{r['peak_after_build_gib']:.2f} GiB | {r['peak_gib']:.2f} GiB | "
            f"{r['step_s_median']:.1f} |"
        )


if __name__ == "__main__":
    main()
