"""The GRPO step on one trainer process against two (FSDP2 over gloo), same batch, same run.

    .venv/bin/python benchmarks/trainer_processes.py            # SmolLM2-135M, ~3 min
    .venv/bin/python benchmarks/trainer_processes.py --steps 2 --model /path/to/folder

A batch shaped like the default job's single-turn steps (8 groups of 4 trajectories, an
83-token prompt per group, 8-20-token replies, rewards that differ within each group, the
behaviour log-probabilities scored by the starting weights) is trained ``--steps`` times
from the same weights by: one process with 2 torch threads (the default
``trainer.threads``), one process with 1 thread, and two Ray processes with 1 thread each
(``trainer.processes=2``). Prints the median step time of each (after one warm-up step),
and how far the two-process losses and final weights are from the one-process ones; writes
``results/trainer_processes.json``. On this 2-core machine the two processes share the
cores the one process uses, and they exchange every layer's weights and gradients over
loopback TCP per micro-batch: the point is the equality and the overhead, not a speed-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a private loopback runtime

import numpy as np
import torch

from pearl.control.interfaces import TrainBatch, TrainSample
from pearl.live.server import ModelSpec
from pearl.live.trainer import GRPOTrainer
from pearl.live.trainer_config import TrainerConfig
from pearl.live.trainer_handle import LiveTrainer
from pearl.models.catalog import resolve_model


def make_batch(vocab: int, groups: int = 8, tries: int = 4, seed: int = 0) -> list[TrainSample]:
    """Single-turn trajectories: a shared prompt per group, a reply each (loss-masked)."""
    rng = random.Random(seed)
    samples = []
    for g in range(groups):
        prompt = [rng.randrange(3, vocab) for _ in range(83)]
        for t in range(tries):
            reply = [rng.randrange(3, vocab) for _ in range(rng.randint(8, 20))]
            ids = prompt + reply
            mask = [0] * len(prompt) + [1] * len(reply)
            reward = float((g + t) % 2) * 0.5 + 0.1 * t
            samples.append(TrainSample(tuple(ids), tuple(mask), (0.0,) * len(ids), reward, f"g{g}"))
    return samples


def with_behaviour(samples: list[TrainSample], trainer: GRPOTrainer) -> list[TrainSample]:
    """The batch with behaviour log-probabilities from ``trainer``'s current weights."""
    scored = trainer.score(samples)
    return [
        TrainSample(s.token_ids, s.loss_mask, tuple(lp), s.reward, s.group)
        for s, lp in zip(samples, scored, strict=True)
    ]


def one_process(folder: str, config: TrainerConfig, batches, threads: int):
    trainer = GRPOTrainer(ModelSpec(folder=folder), config, threads)
    times, losses = [], []
    for batch in batches:
        t0 = time.perf_counter()
        stats = trainer.train_step(batch)
        times.append(time.perf_counter() - t0)
        losses.append(stats["loss"])
    weights = {n: p.detach().numpy().copy() for n, p in trainer.model.named_parameters()}
    return times, losses, weights


async def two_processes(folder: str, config: TrainerConfig, batches):
    trainer = LiveTrainer(ModelSpec(folder=folder), config, 1, processes=2)
    try:
        await trainer.start()
        times, losses = [], []
        for batch in batches:
            t0 = time.perf_counter()
            metrics = await trainer.train_step(batch)
            times.append(time.perf_counter() - t0)
            losses.append(metrics.stats["loss"])
        _, weights = await trainer.weights_ref
        return times, losses, weights
    finally:
        trainer.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="catalog name or model folder")
    parser.add_argument("--steps", type=int, default=4, help="steps per trainer (first: warm-up)")
    parser.add_argument("--out", default="results/trainer_processes.json")
    args = parser.parse_args()
    import ray

    from pearl.live.cluster import ensure_ray

    torch.set_num_threads(1)
    folder = str(resolve_model(args.model))
    config = TrainerConfig(learning_rate=1e-5, micro_batch_tokens=1024)  # the job's defaults
    scorer = GRPOTrainer(ModelSpec(folder=folder), config, 2)
    samples = with_behaviour(make_batch(scorer.model.config.vocab_size), scorer)
    del scorer
    batches = [TrainBatch(i, len(samples), 0, 0, samples=tuple(samples)) for i in range(args.steps)]

    ensure_ray(num_cpus=2)
    results = {}
    try:
        for name, run in (
            ("1 process, 2 threads", lambda: one_process(folder, config, batches, 2)),
            ("1 process, 1 thread", lambda: one_process(folder, config, batches, 1)),
            (
                "2 processes, 1 thread each",
                lambda: asyncio.run(two_processes(folder, config, batches)),
            ),
        ):
            times, losses, weights = run()
            results[name] = {"step_s": times, "losses": losses, "weights": weights}
    finally:
        ray.shutdown()

    base = results["1 process, 2 threads"]
    print(f"{args.steps} GRPO steps on {len(samples)} trajectories ({args.model})")
    print(
        "| trainer | median step s (after warm-up) | steps s | max |loss diff| | max |weight diff| |"
    )
    print("|---|---:|---|---:|---:|")
    out = {"model": args.model, "trajectories": len(samples), "trainers": {}}
    for name, r in results.items():
        loss_diff = max(abs(a - b) for a, b in zip(r["losses"], base["losses"], strict=True))
        weight_diff = max(
            float(np.max(np.abs(r["weights"][n] - w))) for n, w in base["weights"].items()
        )
        median = statistics.median(r["step_s"][1:] or r["step_s"])
        steps = ", ".join(f"{t:.2f}" for t in r["step_s"])
        print(f"| {name} | {median:.2f} | {steps} | {loss_diff:.2e} | {weight_diff:.2e} |")
        out["trainers"][name] = {
            "median_step_s": median,
            "step_s": r["step_s"],
            "losses": r["losses"],
            "max_loss_diff": loss_diff,
            "max_weight_diff": weight_diff,
        }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
