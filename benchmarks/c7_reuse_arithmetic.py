"""C7 re-read with arithmetic: the prefill share of busy time with and without cross-turn reuse.

    .venv/bin/python benchmarks/c7_reuse_arithmetic.py              # configs/headline_paper.yaml, ~5 s
    .venv/bin/python benchmarks/c7_reuse_arithmetic.py --tasks 1    # 16 trajectories (smoke)

C7 (docs/regime.md): Qwen3-30B-A3B colocated on 16 GPUs, prefill did 96.68% of the tokens in
26.48% of the busy time. Two readings of "prefill tokens": the tokens the simulator computes
today (cross-turn reuse: each turn prefills only what its prefix cache and pinned session do
not hold) or every prompt token of every turn (no reuse: each turn prefills its whole
prompt). This prices both on the same trajectories with the cost model's own functions:

* the trajectories are the config's workload (``swe_paper``, its seed), run once through the
  single-batch simulator exactly as ``benchmarks/regime.py`` runs C7 (``Qwen3-30B-A3B``, 16
  GPUs / TP workers colocated), with cross-turn reuse on (``sim.cross_turn_reuse=prefix``
  before any override: reading (a) is what a run with reuse computes); each turn's computed and cached prompt tokens come from its
  telemetry, and the simulator's own prefill and decode seconds from its iterations;
* a turn's prefill is split into ``chunked_prefill_size`` chunks, each priced alone by
  ``CostModel.iteration_cost([(tokens, prior)], ())``, where ``prior`` is the context the
  chunk attends to (cached prefix plus the turn's earlier chunks), so attention grows with
  the context;
* decode is the simulator's decode seconds for these trajectories (its batches as they ran),
  and, as a check, every decoded token priced by ``CostModel.decode_times`` at the run's
  mean decode batch.

Prints one table (per reading: prompt tokens computed per decoded token, prefill seconds by
part, the prefill share of busy time) and writes JSON (``--out``). Changes nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from pearl.apps.sim_build import build_cost_model, engine_config
from pearl.config.simulate import load_simulate_config
from pearl.control.deployment import Deployment
from pearl.engine.scheduler import SchedulerOutput
from pearl.sim.costmodel import CostModel
from pearl.sim.fixed import simulate_fixed_rollout
from pearl.sim.hardware import get_gpu
from pearl.sim.shapes import load_model_shape
from pearl.workloads.agentic import generate_batch
from pearl.workloads.profiles import get_profile

ROOT = Path(__file__).resolve().parents[1]

C7_MODEL = "Qwen3-30B-A3B"
C7_GPUS = 16
PAPER_PREFILL_TOKEN_SHARE = 0.9668  # C7: prefill's share of the interval's tokens
PAPER_PREFILL_TIME_SHARE = 0.2648  # C7: prefill's share of the interval's time
PAPER_DECODE_TOK_S_PER_GPU = 400.0  # C7: "~400 tok/s per GPU between prefill insertions"


@dataclass(slots=True)
class PrefillSeconds:
    """Prefill seconds of a set of turns by cost-model part, and the tokens computed."""

    tokens: int = 0
    linear_s: float = 0.0
    attention_s: float = 0.0
    communication_s: float = 0.0
    overhead_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.linear_s + self.attention_s + self.communication_s + self.overhead_s

    def add_turn(self, cost: CostModel, tokens: int, prior: int, chunk: int) -> None:
        """Add one turn's prefill of ``tokens`` after ``prior`` cached tokens, in chunks of
        ``chunk`` tokens, each chunk alone in its iteration and attending to all before it."""
        self.tokens += tokens
        done = 0
        while done < tokens:
            n = min(chunk, tokens - done)
            part = cost.iteration_cost([(n, prior + done)], ())
            self.linear_s += part.linear_s
            self.attention_s += part.prefill_attention_s
            self.communication_s += part.communication_s
            self.overhead_s += part.overhead_s
            done += n

    def scaled(self, factor: float) -> PrefillSeconds:
        return PrefillSeconds(
            round(self.tokens * factor),
            self.linear_s * factor,
            self.attention_s * factor,
            self.communication_s * factor,
            self.overhead_s * factor,
        )


@dataclass(slots=True)
class IterationTally:
    """The simulator's own seconds: prefill-only, decode-only and mixed iterations."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    mixed_s: float = 0.0
    decode_iterations: int = 0
    decode_sequence_steps: int = 0

    def __call__(
        self, worker: str, start: float, dt: float, out: SchedulerOutput, iterations: int
    ) -> None:
        if out.prefills and out.decodes:
            self.mixed_s += dt
        elif out.prefills:
            self.prefill_s += dt
        else:
            self.decode_s += dt
            self.decode_iterations += iterations
            self.decode_sequence_steps += len(out.decodes) * iterations

    @property
    def mean_decode_batch(self) -> float:
        return self.decode_sequence_steps / max(1, self.decode_iterations)


def decode_seconds_at_batch(cost: CostModel, turns: list[tuple[int, int]], batch: float) -> float:
    """Decode seconds of ``turns`` ((prompt tokens, decoded tokens) each) with every token
    decoded in a batch of ``batch`` sequences of its own context (``CostModel.decode_times``
    per step, divided by the batch); a fractional batch interpolates its two neighbours."""

    def at(b: int) -> float:
        total = 0.0
        for prompt, decoded in turns:
            # Step j decodes token prompt + j + 1 (it attends to itself): context prompt + j + 1.
            total += sum(cost.decode_times(b, b * (prompt + 1), decoded)) / b
        return total

    low = max(1, math.floor(batch))
    high = low + 1
    if batch <= low:
        return at(low)
    return at(low) + (batch - low) * (at(high) - at(low))


def share(prefill_s: float, decode_s: float) -> float:
    """Prefill's share of busy time (prefill + decode)."""
    return prefill_s / (prefill_s + decode_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "headline_paper.yaml"))
    parser.add_argument("--out", default="results/c7_reuse_arithmetic.json")
    parser.add_argument("--seed", type=int, default=None, help="workload seed (config's)")
    parser.add_argument("--tasks", type=int, default=None, help="tasks per batch (config's)")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args()
    start = time.perf_counter()
    # Reading (a) needs a run with reuse; the shipped paper regime has none (issue 60).
    cfg = load_simulate_config(args.config, ["sim.cross_turn_reuse=prefix", *args.overrides])
    constants = build_cost_model(cfg).constants  # the config's cost profile
    # As pearl.apps.paper.regime prices C7: the catalog GPU, the profile's constants.
    cost = CostModel(
        get_gpu(cfg.cluster.gpu), load_model_shape(C7_MODEL), tp=cfg.cluster.tp, constants=constants
    )
    engine = engine_config(cfg.sim)
    seed = cfg.workload.seed if args.seed is None else args.seed
    profile = get_profile(cfg.workload.profile)
    batch = generate_batch(profile, num_tasks=args.tasks or cfg.workload.num_tasks, seed=seed)
    tally = IterationTally()
    report = simulate_fixed_rollout(
        batch,
        cost,
        Deployment(colocated=C7_GPUS // cfg.cluster.tp),
        engine,
        vocab_size=cost.model.vocab_size,
        on_iteration=tally,
    )
    chunk = engine.chunked_prefill_size
    reuse, no_reuse = PrefillSeconds(), PrefillSeconds()
    decode_turns: list[tuple[int, int]] = []
    for result in report.result.trajectories:
        prompts = result.trajectory.context_lengths()
        for k, out in enumerate(result.turns):
            computed = out.telemetry.prefill_tokens_computed
            cached = out.telemetry.prefill_tokens_cached
            if computed + cached != prompts[k]:
                raise RuntimeError(
                    f"{result.trajectory.task_id}/{result.trajectory.index_in_group} turn {k}: "
                    f"{computed} computed + {cached} cached != prompt {prompts[k]}"
                )
            reuse.add_turn(cost, computed, cached, chunk)
            no_reuse.add_turn(cost, prompts[k], 0, chunk)
            decode_turns.append((prompts[k], result.trajectory.turns[k].response_tokens))
    decoded = report.generated_tokens
    if sum(d for _, d in decode_turns) != decoded:
        raise RuntimeError("the turns' decoded tokens do not add up to the batch's")
    decode_sim_s = tally.decode_s
    decode_priced_s = decode_seconds_at_batch(cost, decode_turns, tally.mean_decode_batch)
    # The issue's first estimate: the reuse reading's seconds per computed token, all prompts.
    naive = reuse.scaled(no_reuse.tokens / reuse.tokens)
    tp = cfg.cluster.tp
    decode_paper_s = decoded / (PAPER_DECODE_TOK_S_PER_GPU * tp)  # C7's decode rate

    rows = []

    def row(name: str, tokens: int, p: PrefillSeconds | None, prefill_s: float, decode_s: float):
        """One reading; ``p`` holds its seconds by part (None: the simulator's own total)."""
        rows.append(
            {
                "reading": name,
                "prefill_tokens_per_decoded": tokens / decoded,
                "prefill_s": prefill_s,
                "linear_s": None if p is None else p.linear_s,
                "attention_s": None if p is None else p.attention_s,
                "communication_and_overhead_s": (
                    None if p is None else p.communication_s + p.overhead_s
                ),
                "us_per_token_per_worker": prefill_s / tokens * 1e6,
                "decode_s": decode_s,
                "prefill_share": share(prefill_s, decode_s),
                "vs_paper": share(prefill_s, decode_s) / PAPER_PREFILL_TIME_SHARE,
            }
        )

    computed_total, _ = report.result.prefill_tokens()
    sim_prefill_s = tally.prefill_s + tally.mixed_s  # as regime.py counts C7's share
    row("simulator as run (reuse)", computed_total, None, sim_prefill_s, decode_sim_s)
    row("(a) reuse, priced per turn", reuse.tokens, reuse, reuse.total_s, decode_sim_s)
    row(
        "(b) zero reuse, priced per turn", no_reuse.tokens, no_reuse, no_reuse.total_s, decode_sim_s
    )
    row("naive: (a) per token x (b) tokens", naive.tokens, naive, naive.total_s, decode_sim_s)
    row("(a), decode priced at mean batch", reuse.tokens, reuse, reuse.total_s, decode_priced_s)
    row(
        "(b), decode priced at mean batch",
        no_reuse.tokens,
        no_reuse,
        no_reuse.total_s,
        decode_priced_s,
    )
    row(
        "(b), decode at C7's 400 tok/s/GPU",
        no_reuse.tokens,
        no_reuse,
        no_reuse.total_s,
        decode_paper_s,
    )
    paper_tokens = PAPER_PREFILL_TOKEN_SHARE / (1 - PAPER_PREFILL_TOKEN_SHARE)
    # C7's implied prefill rate: tokens ratio x decode rate / (prefill time : decode time).
    time_ratio = PAPER_PREFILL_TIME_SHARE / (1 - PAPER_PREFILL_TIME_SHARE)
    paper_prefill_rate = paper_tokens * PAPER_DECODE_TOK_S_PER_GPU / time_ratio
    rates = {
        "decode_tok_s_per_gpu": {
            "paper": PAPER_DECODE_TOK_S_PER_GPU,
            "sim": decoded / decode_sim_s / tp,
        },
        "prefill_tok_s_per_gpu": {
            "paper_implied": paper_prefill_rate,
            "reuse_computed": reuse.tokens / reuse.total_s / tp,
            "zero_reuse": no_reuse.tokens / no_reuse.total_s / tp,
        },
    }
    wall = time.perf_counter() - start

    workers = C7_GPUS // tp
    print(
        f"C7 re-read: {profile.name} seed {seed}, {batch.num_trajectories} trajectories, "
        f"{report.turns} turns, {decoded:,} decoded tokens; {C7_MODEL} on {workers} x TP{tp} "
        f"{cfg.cluster.gpu}, {cfg.sim.scheduling} engine, chunks of {chunk}"
    )
    print()
    print(
        "| reading | prefill tok / decoded | prefill s | linear | attention | comm + overhead "
        "| us / token / worker | decode s | prefill share | / 26.48% |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| paper (C7) | {paper_tokens:.1f} | | | | | | | {PAPER_PREFILL_TIME_SHARE:.1%} | 1.00 |"
    )

    def fmt(value, spec):
        return "" if value is None else format(value, spec)

    for r in rows:
        print(
            f"| {r['reading']} | {fmt(r['prefill_tokens_per_decoded'], '.1f')} "
            f"| {r['prefill_s']:.1f} | {fmt(r['linear_s'], '.1f')} | {fmt(r['attention_s'], '.1f')} "
            f"| {fmt(r['communication_and_overhead_s'], '.1f')} "
            f"| {fmt(r['us_per_token_per_worker'], '.1f')} | {r['decode_s']:.1f} "
            f"| {r['prefill_share']:.1%} | {r['vs_paper']:.2f} |"
        )
    p = rates["prefill_tok_s_per_gpu"]
    print(f"mean decode batch {tally.mean_decode_batch:.2f} sequences per worker")
    print(
        f"rates per GPU: decode {rates['decode_tok_s_per_gpu']['sim']:.0f} tok/s (C7 ~400); "
        f"prefill {p['zero_reuse']:,.0f} tok/s at zero reuse, {p['reuse_computed']:,.0f} "
        f"computed tok/s with reuse (C7 implies {p['paper_implied']:,.0f}); {wall:.1f} s"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "config": args.config,
                "overrides": args.overrides,
                "workload": profile.name,
                "seed": seed,
                "trajectories": batch.num_trajectories,
                "turns": report.turns,
                "decoded_tokens": decoded,
                "prompt_tokens": no_reuse.tokens,
                "computed_tokens_with_reuse": reuse.tokens,
                "mean_decode_batch": tally.mean_decode_batch,
                "chunked_prefill_size": chunk,
                "paper": {
                    "prefill_tokens_per_decoded": paper_tokens,
                    "prefill_share": PAPER_PREFILL_TIME_SHARE,
                },
                "rows": rows,
                "rates": rates,
                "wall_s": wall,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
