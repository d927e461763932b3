"""``pearl train``'s records: one ``metrics.jsonl`` row per step, one ``rollouts.jsonl``
row per rollout (what the simulator replays), the roles in use, and the Wilson interval
of a held-out success rate."""

from __future__ import annotations

import math
import os
from collections import Counter
from typing import Any

from pearl.control.state import WorkerStatus


def roles_in_use(plane) -> str:
    """The active rollout roles, e.g. ``2 colocated`` or ``1 prefill + 1 decode``."""
    snap = plane.table.snapshot()
    counts = Counter(
        str(s.role) for s in snap.slots if s.status is WorkerStatus.ACTIVE and not s.is_training
    )
    return " + ".join(f"{n} {role}" for role, n in sorted(counts.items())) or "none"


def step_row(
    rec, version: int, offset: int, elapsed: float, started: float = 0.0
) -> dict[str, Any]:
    """One ``metrics.jsonl`` row for a trained step; ``started``: when the steps began on
    the pipeline's clock (the rollout's start and end are reported from it)."""
    stats = rec.train_stats
    trajectories = rec.result.trajectories
    rollout_s = rec.rollout_finished - rec.rollout_started
    return {
        "step": offset + rec.step,
        "elapsed_s": elapsed,
        "reward_mean": stats.get("reward_mean", math.nan),
        "reward_std": stats.get("reward_std", math.nan),
        "success_rate": stats.get("success_rate", math.nan),
        "trajectories": len(trajectories),
        "turns": sum(len(t.turns) for t in trajectories),
        "rollout_tokens": rec.rollout_tokens,
        "train_tokens": int(stats.get("batch_tokens", 0)),
        "scored_tokens": int(stats.get("trained_tokens", 0)),
        "skipped_trajectories": int(stats.get("skipped_trajectories", 0)),
        "overlong_masked": int(stats.get("overlong_masked", 0)),
        "env_failures": int(stats.get("env_failures", 0)),
        "stop_reasons": dict(Counter(t.stop_reason for t in trajectories)),
        "tool_calls": sum(t.tool_calls for t in trajectories),
        "malformed_tool_calls": sum(t.malformed_calls for t in trajectories),
        "rollout_s": rollout_s,
        "rollout_start_s": rec.rollout_started - started,
        "rollout_end_s": rec.rollout_finished - started,
        "train_s": rec.train_finished - rec.train_started,
        "rollout_tokens_per_s": rec.rollout_tokens / rollout_s if rollout_s > 0 else 0.0,
        **staleness(rec.tokens_by_version, version - 1),
        "weight_version": version,
        "loss": stats.get("loss", math.nan),
        "grad_norm": stats.get("grad_norm", math.nan),  # the step's updates' mean
        "updates": int(stats.get("updates", 0)),  # optimizer steps (ppo_epochs x mini_batches)
        "trainer_memory_mb": stats.get("memory_mb", math.nan),  # rank 0's peak (GPU or RSS)
        "clip_fraction": stats.get("clip_fraction", math.nan),
        "mean_ratio": stats.get("mean_ratio", math.nan),
        "entropy": stats.get("entropy", math.nan),
        "kl": stats.get("kl", math.nan),
        "mismatch_mean": stats.get("mismatch_mean", math.nan),
        "mismatch_max": stats.get("mismatch_max", math.nan),
        "response_length_mean": stats.get("response_length_mean", math.nan),
        "response_length_max": stats.get("response_length_max", math.nan),
        # dynamic sampling (rollout.dynamic_sampling): groups rolled out, tied, trained on
        **(rec.sampling.row() if rec.sampling is not None else {}),
    }


def staleness(tokens_by_version: dict[tuple[int, int], int], trained: int) -> dict[str, Any]:
    """How old the weights behind a batch's tokens were when weights ``trained`` trained on
    it, counting for each token the oldest weights its distribution depended on (the KV it
    attended to included): ``staleness`` the largest, ``staleness_mean`` per token, and
    ``tokens_on_older_kv`` the tokens sampled by newer weights than part of their KV (turns
    and kept sessions that lived through an update)."""
    total = sum(tokens_by_version.values())
    if not total:
        return {"staleness": 0, "staleness_mean": 0.0, "tokens_on_older_kv": 0}
    return {
        "staleness": max(trained - kv for _, kv in tokens_by_version),
        "staleness_mean": sum(n * (trained - kv) for (_, kv), n in tokens_by_version.items())
        / total,
        "tokens_on_older_kv": sum(n for (w, kv), n in tokens_by_version.items() if kv < w),
    }


def rollout_shapes(rec, iterations: list) -> dict[str, Any]:
    """One ``rollouts.jsonl`` row: a step's rollout as token counts and times, enough to
    replay it in the simulator (``benchmarks/train_live_vs_sim.py``): per trajectory, per
    turn ``[appended tokens, generated tokens, tokens of it kept, environment seconds]``;
    the tokens every first prompt shares; the engines' iterations (prefill chunks as
    ``[tokens, cached]``, decode contexts, seconds) since the previous step's rollout
    ended (with ``run.overlap_batches`` they include the next batch's that ran beside it)."""
    trajectories = rec.result.trajectories
    prompts = [
        t.sample.token_ids[: t.appended_tokens[0]]
        for t in trajectories
        if t.sample and t.appended_tokens  # (an episode whose reset failed has no prompt)
    ]
    shared = len(os.path.commonprefix(prompts)) if prompts else 0  # works on lists too
    return {
        "step": rec.step,
        "rollout_s": rec.rollout_finished - rec.rollout_started,
        "shared_prefix_tokens": shared,
        "trajectories": [
            {
                "group": t.sample.group if t.sample else t.session_id,
                "turns": [
                    [
                        t.appended_tokens[k],
                        len(out.token_ids),
                        t.kept_tokens[k + 1] if k + 1 < len(t.kept_tokens) else len(out.token_ids),
                        t.env_s[k] if k < len(t.env_s) else 0.0,
                    ]
                    for k, out in enumerate(t.turns)
                ],
            }
            for t in trajectories
        ],
        "iterations": [[list(map(list, p)), list(d), s] for p, d, s in iterations],
    }


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a success rate (95% by default)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))
