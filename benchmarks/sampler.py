"""The engine's sampler against the one it replaced, on the same logits, ABBA.

    .venv/bin/python benchmarks/sampler.py                  # CPU, one thread, ~1 min
    .venv/bin/python benchmarks/sampler.py --device cuda    # on a GPU

``pearl.engine.sampler.sample`` draws every row at once on the logits' device (inverse CDF;
a seeded row's draw hashed from seed and position). The baseline is the sampler it
replaced (2026-12-07), kept here: logits copied to the CPU, then per row a seeded
``torch.Generator`` (for seeded rows) and ``torch.multinomial``. Both return the same
log-probabilities; their seeded tokens differ (different random streams). Per case:
milliseconds per call, median of the B/A ratios over ``--pairs`` ABBA pairs of
``--calls`` calls each. Writes ``results/sampler.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from pearl.engine.sampler import sample, truncated_log_softmax
from pearl.engine.sequence import SamplingParams

VOCAB = 49_152  # SmolLM2's


def per_row_multinomial(logits, params, positions, generator):
    """The sampler before 2026-12-07: on the CPU, one row at a time."""
    logits = logits.cpu()
    temps = [p.temperature if p.temperature > 0 else 1.0 for p in params]
    scale = torch.tensor(temps, dtype=logits.dtype).unsqueeze(1)
    logprobs_all = torch.log_softmax(logits / scale, dim=-1)
    tokens, logprobs = [], []
    for i, p in enumerate(params):
        row = logprobs_all[i]
        if p.greedy:
            token = int(torch.argmax(logits[i]))
        else:
            if p.top_k or p.top_p < 1.0:
                row = truncated_log_softmax(row.unsqueeze(0), p.top_k, p.top_p)[0]
            gen = generator
            if p.seed is not None:
                gen = torch.Generator().manual_seed(
                    (p.seed * 1_000_003 + positions[i]) & 0x7FFF_FFFF_FFFF_FFFF
                )
            probs = row.exp()
            token = int(torch.multinomial(probs / probs.sum(), 1, generator=gen))
        tokens.append(token)
        logprobs.append(float(row[token]))
    return tokens, logprobs


CASES = {
    "seeded, temperature 0.7": lambda i: SamplingParams(temperature=0.7, seed=i),
    "unseeded, temperature 1": lambda i: SamplingParams(temperature=1.0),
    "seeded, top-k 50": lambda i: SamplingParams(temperature=0.7, top_k=50, seed=i),
}


def timed(fn, logits, params, positions, calls: int) -> float:
    generator = torch.Generator().manual_seed(0)
    if logits.is_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(logits, params, positions, generator)
    if logits.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("results/sampler.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    print("| batch | rows | per-row multinomial ms | batched ms | speed-up (median, [min-max]) |")
    print("|---:|---|---:|---:|---|")
    for n in args.batches:
        logits = torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(n)) * 3
        logits = logits.to(args.device)
        positions = list(range(100, 100 + n))
        for name, make in CASES.items():
            params = [make(i) for i in range(n)]
            # the same log-probabilities of the tokens each draws
            got, got_lp = sample(logits, params, positions, torch.Generator())
            _, base_lp = per_row_multinomial(logits, params, positions, torch.Generator())
            dist = truncated_log_softmax(
                logits.cpu() / params[0].temperature, params[0].top_k, params[0].top_p
            )
            assert all(abs(float(dist[i, t]) - got_lp[i]) < 1e-5 for i, t in enumerate(got))
            assert all(lp <= 0 for lp in base_lp)
            base, new, ratios = [], [], []
            for _ in range(args.pairs):  # A B B A
                a1 = timed(per_row_multinomial, logits, params, positions, args.calls)
                b1 = timed(sample, logits, params, positions, args.calls)
                b2 = timed(sample, logits, params, positions, args.calls)
                a2 = timed(per_row_multinomial, logits, params, positions, args.calls)
                base += [a1, a2]
                new += [b1, b2]
                ratios.append((a1 + a2) / (b1 + b2))
            row = {
                "batch": n,
                "rows": name,
                "baseline_ms": statistics.median(base),
                "batched_ms": statistics.median(new),
                "speedup": statistics.median(ratios),
                "speedup_range": [min(ratios), max(ratios)],
            }
            rows.append(row)
            print(
                f"| {n} | {name} | {row['baseline_ms']:.2f} | {row['batched_ms']:.2f} | "
                f"{row['speedup']:.2f}x [{min(ratios):.2f}-{max(ratios):.2f}] |",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"device": args.device, "vocab": VOCAB, "threads": 1, "rows": rows}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
