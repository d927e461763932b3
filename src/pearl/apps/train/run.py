"""``pearl train``: asynchronous multi-turn GRPO on a real model, live.

Composition: a GRPO trainer actor and engine actors (Ray, one torch thread each) under
the control plane's router and pipeline scheduler: rollout batch i + 1 runs while the
trainer trains on batch i (staleness 1), every batch is a group of episodes per task of a
text environment, and new weights reach every rollout worker through Ray's object store
after each step. Before the first and after the last step the policy is evaluated on
held-out tasks. The run folder gets the config, ``metrics.jsonl`` (one row per step),
``events.jsonl``, ``eval.json``, checkpoints and plots.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from pearl.config import _Section, dump_config, load_config, plain_run_name
from pearl.errors import ConfigError, RunInterrupted, RunStopped
from pearl.report.progress import Progress
from pearl.report.tensorboard import ScalarLog


class TrainModelSection(_Section):
    name: str = Field("smollm2-135m", description="catalog model or a Hugging Face folder")


class TrainEnvSection(_Section):
    name: str = Field("calculator", description="calculator or guess")
    options: dict[str, Any] = Field(
        default_factory=dict, description="the environment's arguments, e.g. {level: easy}"
    )


class TrainRolloutSection(_Section):
    workers: int = Field(1, ge=1, le=16, description="colocated rollout workers (processes)")
    tasks_per_step: int = Field(8, ge=1, le=1024)
    group_size: int = Field(4, ge=2, le=64, description="trajectories per task (GRPO group)")
    max_new_tokens: int = Field(64, ge=1, le=4096, description="per turn")
    max_context_tokens: int = Field(768, ge=16, le=32768)
    temperature: float = Field(
        0.7, gt=0, le=2.0, description="sampling temperature (the trainer's ratio uses it too)"
    )
    kv_blocks: int = Field(
        512, ge=16, le=1_000_000, description="KV blocks of 16 tokens per worker"
    )
    max_num_seqs: int = Field(64, ge=1, le=1024)


class TrainTrainerSection(_Section):
    learning_rate: float = Field(1e-5, gt=0, le=1e-2)
    clip_eps: float = Field(0.2, gt=0, lt=1)
    max_grad_norm: float = Field(1.0, gt=0)
    micro_batch_tokens: int = Field(
        1024, ge=16, le=1_000_000, description="padded tokens per backward pass (memory)"
    )
    threads: int = Field(
        2, ge=1, le=64, description="torch threads of the trainer (it is the bottleneck here)"
    )


class TrainRunSection(_Section):
    steps: int = Field(10, ge=1, le=100_000)
    max_staleness: int = Field(1, ge=0, le=8)
    seed: int = Field(0, ge=0)
    eval_tasks: int = Field(32, ge=0, le=100_000, description="held-out tasks before and after")
    eval_temperature: float | None = Field(
        None, ge=0, le=2.0, description="held-out sampling temperature: 0 greedy, default rollout's"
    )
    checkpoint_every: int = Field(0, ge=0, description="steps between checkpoints (0: end only)")
    chaos_kill_every_s: float = Field(
        0.0,
        ge=0,
        description="fault injection: kill a random dedicated rollout worker's process "
        "(ray.kill) this often, to exercise recovery (0: never)",
    )
    run_dir: str = Field("runs", description="parent folder of run folders")
    run_name: str | None = Field(
        None, description="run folder name (default: train- plus a timestamp and a suffix)"
    )

    _plain_name = field_validator("run_name")(plain_run_name)


class TrainClusterSection(_Section):
    policy: str = Field(
        "roll",
        description="rollout policy (pearl.control.policies): roll, rlboost, static-pd, "
        "pearl-pd, pearl-ungated, pearl, ...",
    )
    preemptible_workers: int = Field(
        0, ge=0, le=16, description="elastic policies: at most this many extra rollout workers"
    )
    availability: list[tuple[float, int]] = Field(
        default_factory=list,
        description="elastic policies: (seconds from the start, preemptible workers) changes",
    )

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        from pearl.control.policies import get_policy

        get_policy(value)  # raises with the valid names
        return value

    @field_validator("availability")
    @classmethod
    def _sane_changes(cls, value: list[tuple[float, int]]) -> list[tuple[float, int]]:
        for t, n in value:
            if not (t >= 0 and math.isfinite(t)) or n < 0:
                raise ValueError(
                    f"availability changes need times >= 0 and counts >= 0, got {(t, n)}"
                )
        return value


class TrainConfig(_Section):
    model: TrainModelSection = Field(default_factory=TrainModelSection)
    cluster: TrainClusterSection = Field(default_factory=TrainClusterSection)
    env: TrainEnvSection = Field(default_factory=TrainEnvSection)
    rollout: TrainRolloutSection = Field(default_factory=TrainRolloutSection)
    trainer: TrainTrainerSection = Field(default_factory=TrainTrainerSection)
    run: TrainRunSection = Field(default_factory=TrainRunSection)


def load_train_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    return load_config(TrainConfig, path, overrides)


class TrainRun:
    """A live GRPO run: actors, router, pipeline, run folder."""

    def __init__(self, cfg: TrainConfig, log: Callable[[str], None] | None = None) -> None:
        from pearl.envs import make_env
        from pearl.models.catalog import resolve_model
        from pearl.models.chat import ChatFormat
        from pearl.models.config import ModelConfig
        from pearl.models.tokenizer import Tokenizer

        self.cfg = cfg
        self.log = log or logging.getLogger(__name__).info
        make_env(cfg.env.name, **cfg.env.options)  # fail on bad options before starting actors
        self.folder = resolve_model(cfg.model.name, log=self.log)
        self.model_config = ModelConfig.from_folder(self.folder)
        self.chat = ChatFormat(Tokenizer(self.folder))

    def episodes(self, split: str, first: int, tasks: int, group: int):
        """``tasks`` x ``group`` episodes of the tasks ``first``.. of ``split``."""
        from pearl.envs import make_env, split_seed
        from pearl.live.episodes import TextEpisode

        out = []
        for t in range(first, first + tasks):
            seed = split_seed(split, t)
            for g in range(group):
                env = make_env(self.cfg.env.name, **self.cfg.env.options)
                out.append((f"{split}{t}/{g}", TextEpisode(env, seed, self.chat, f"{split}{t}")))
        return out

    def run(self, resume: str | None = None) -> dict[str, Any]:
        return asyncio.run(self._main(resume))

    def _stopped(
        self, folder, rows: list, first_step: int, why: str, stop: type[RunInterrupted]
    ) -> RunInterrupted:
        """Mark the run folder incomplete and say how to continue from the last checkpoint."""
        last = _last_checkpoint(folder.path)
        folder.summary(
            {
                "complete": False,
                "error": why,
                "steps": len(rows),
                "last_checkpoint": str(last[1]) if last else None,
            }
        )
        where = f"metrics and checkpoints are in {folder.path}"
        if last is None:
            return stop(
                f"{why} after {len(rows)} steps, before any checkpoint "
                f"(run.checkpoint_every); {where}"
            )
        version, path = last
        remaining = first_step + self.cfg.run.steps - version
        return stop(
            f"{why} after {len(rows)} steps; {where}; continue from "
            f"v{version} with: pearl train --config {folder.path / 'config.yaml'} --resume "
            f"{path} run.steps={remaining} run.run_name={folder.path.name}-resumed"
        )

    async def _main(self, resume: str | None) -> dict[str, Any]:
        import ray

        from pearl.control.agent_loop import AgentLoopConfig
        from pearl.control.composition import ClusterLayout, ControlPlane
        from pearl.control.episode import EpisodeBatch, run_episode_batch
        from pearl.control.pipeline import PipelineConfig
        from pearl.control.policies import Borrowing, Pool, get_policy
        from pearl.live.server import ModelSpec
        from pearl.live.trainer import LiveTrainer, TrainerConfig
        from pearl.live.worker import ensure_ray
        from pearl.live.world import IterationFeed, LiveWorld, cpu_prior
        from pearl.report.run_folder import RunFolder, default_run_name

        cfg = self.cfg
        policy = get_policy(cfg.cluster.policy)
        elastic = policy.pool is Pool.ELASTIC
        preemptible = cfg.cluster.preemptible_workers if elastic else 0
        borrows = policy.borrowing is not Borrowing.OFF
        actors = cfg.rollout.workers + preemptible + 1 + (1 if borrows else 0)
        ensure_ray(actors)
        if ray.cluster_resources().get("CPU", 0) < actors:
            raise ConfigError(
                f"this run needs {actors} Ray CPU slots (rollout workers, trainer, borrowed "
                f"slot); the running Ray instance has {ray.cluster_resources().get('CPU', 0)}"
            )
        name = cfg.run.run_name or default_run_name("train-")
        folder = RunFolder(cfg.run.run_dir, name)
        folder.write_config(dump_config(cfg))
        self.log(f"run folder: {folder.path}")
        board = ScalarLog(folder.path)
        spec = ModelSpec(folder=str(self.folder))
        trainer = LiveTrainer(
            spec,
            TrainerConfig(
                learning_rate=cfg.trainer.learning_rate,
                clip_eps=cfg.trainer.clip_eps,
                max_grad_norm=cfg.trainer.max_grad_norm,
                micro_batch_tokens=cfg.trainer.micro_batch_tokens,
                temperature=cfg.rollout.temperature,
            ),
            cfg.trainer.threads,
        )
        engine = dict(
            block_size=16,
            num_kv_blocks=cfg.rollout.kv_blocks,
            max_num_seqs=cfg.rollout.max_num_seqs,
            max_model_len=cfg.rollout.max_context_tokens,
        )
        batch_size = cfg.rollout.tasks_per_step * cfg.rollout.group_size
        world = LiveWorld(
            spec,
            engine,
            trainer,
            cpu_prior(self.model_config, batch_size, cfg.rollout.max_context_tokens),
        )
        started = time.monotonic()

        def log_event(event: dict) -> None:
            folder.event({**event, "t": round(time.monotonic() - started, 3)})

        # One TP-1 "GPU" per process: rollout workers first, then the trainer's slot.
        layout = ClusterLayout(
            1, cfg.rollout.workers, preemptible, 1, cfg.rollout.workers + preemptible
        )
        plane = ControlPlane(world, policy, layout, log=log_event)
        rows: list[dict[str, Any]] = []
        first_step = 0
        stop = _StopOnSignals()
        try:
            await trainer.start(resume)
            first_step = trainer.weight_version
            initial = _workers_at(cfg.cluster.availability, 0.0) if elastic else 0
            await plane.start(min(initial, preemptible))
            await asyncio.gather(*(w.ready() for w in world.workers.values()))
            if first_step:
                await asyncio.gather(*(w.sync_weights(first_step) for w in plane.active_workers()))
                self.log(f"resumed from {resume} at weights v{first_step}")
            await world.start_logging()
            router, clock = plane.router, plane.clock
            loop = AgentLoopConfig(
                vocab_size=self.model_config.vocab_size,
                temperature=cfg.rollout.temperature,
                seed=cfg.run.seed,
            )

            async def evaluate(tag: str) -> dict[str, Any]:
                if not cfg.run.eval_tasks:
                    return {}
                eval_loop = AgentLoopConfig(
                    vocab_size=self.model_config.vocab_size,
                    temperature=cfg.rollout.temperature
                    if cfg.run.eval_temperature is None
                    else cfg.run.eval_temperature,
                    seed=cfg.run.seed,
                )
                batch = EpisodeBatch(
                    self.episodes("heldout", 0, cfg.run.eval_tasks, 1),
                    cfg.rollout.max_new_tokens,
                    cfg.rollout.max_context_tokens,
                )
                t0 = time.monotonic()
                result = await run_episode_batch(batch, router, clock, eval_loop)
                wins = [t.sample.success for t in result.trajectories]
                row = {
                    "when": tag,
                    "weight_version": trainer.weight_version,
                    "tasks": len(wins),
                    "successes": sum(wins),
                    "success_rate": sum(wins) / len(wins),
                    "ci95": wilson_interval(sum(wins), len(wins)),
                    "mean_reward": statistics.fmean(t.reward for t in result.trajectories),
                    "seconds": time.monotonic() - t0,
                }
                folder.event({"kind": "eval", **row})
                board.scalars(f"eval_{tag}", row, trainer.weight_version)
                self.log(
                    f"eval ({tag}, v{row['weight_version']}): success {row['successes']}/"
                    f"{row['tasks']} = {100 * row['success_rate']:.1f}% "
                    f"(95% CI {100 * row['ci95'][0]:.1f}-{100 * row['ci95'][1]:.1f}%)"
                )
                return row

            before = await evaluate("before")
            await world.drain_logs()  # the evaluation's iterations are not step 0's
            offset = first_step  # task indices continue after a resume

            def batch_of(i: int) -> EpisodeBatch:
                first = (offset + i) * cfg.rollout.tasks_per_step
                return EpisodeBatch(
                    self.episodes(
                        "train", first, cfg.rollout.tasks_per_step, cfg.rollout.group_size
                    ),
                    cfg.rollout.max_new_tokens,
                    cfg.rollout.max_context_tokens,
                )

            run_started = time.monotonic()
            steps = Progress(cfg.run.steps, "RL steps", logger=__name__)

            async def on_step(step: int, version: int) -> None:
                if stop.requested:  # in case a cancellation was swallowed on the way
                    raise asyncio.CancelledError
                rec = plane.pipeline.records[step]
                row = step_row(rec, version, offset, time.monotonic() - run_started)
                row["roles"] = _roles(plane)
                row["borrowed"] = bool(plane.toggle and plane.toggle.borrowed)
                rows.append(row)
                folder.metric(row)
                board.scalars("train", row, row["step"])
                folder.append(
                    "rollouts.jsonl", rollout_shapes(rec, feed.iterations.pop(rec.step, []))
                )
                steps.advance(
                    f"step {row['step']:3d}  reward {row['reward_mean']:.3f}  success "
                    f"{100 * row['success_rate']:5.1f}%  rollout {row['rollout_s']:5.1f}s  "
                    f"train {row['train_s']:5.1f}s  gen {row['rollout_tokens_per_s']:6.1f} tok/s  "
                    f"staleness {row['staleness']}  v{version}  roles {row['roles']}"
                )
                every = cfg.run.checkpoint_every
                if every and (step + 1) % every == 0:
                    await trainer.save(str(folder.path / "checkpoints" / f"v{version}"))

            feed = IterationFeed(world, plane, on_step)
            plane.make_pipeline(
                batch_of,
                loop,
                PipelineConfig(cfg.run.steps, max_staleness=cfg.run.max_staleness),
                feed,
            )
            changes = [(t, min(n, preemptible)) for t, n in cfg.cluster.availability if t > 0]
            chaos = None
            if cfg.run.chaos_kill_every_s > 0:
                chaos = asyncio.ensure_future(
                    _chaos(plane, cfg.run.chaos_kill_every_s, cfg.run.seed, log_event)
                )
            try:
                with steps:
                    records = await plane.run(changes if elastic else ())
            except ray.exceptions.RayActorError as exc:
                # Rollout workers that die are replaced (LiveWorker maps their deaths);
                # what reaches here is the trainer's process dying.
                why = f"the trainer's process died ({type(exc).__name__})"
                raise self._stopped(folder, rows, first_step, why, RunInterrupted) from None
            finally:
                if chaos is not None:
                    chaos.cancel()
            train_s = time.monotonic() - run_started
            if rows:
                from pearl.report.plots import plot_training

                plot_training(rows, folder.path)
            checkpoint = folder.path / "checkpoints" / f"v{trainer.weight_version}"
            await trainer.save(str(checkpoint))
            after = await evaluate("after")
            summary = {
                "complete": True,
                "steps": len(records),
                "train_seconds": train_s,
                "before": before,
                "after": after,
                "checkpoint": str(checkpoint),
                "weight_version": trainer.weight_version,
                "policy": policy.name,
                "counters": plane.counters(),
            }
            folder.summary(summary)
            write_train_report(folder.path, rows, before, after, summary)
            self.log(f"checkpoint: {checkpoint}")
            return {"run_dir": str(folder.path), **summary}
        except asyncio.CancelledError:  # Ctrl-C or SIGTERM: asyncio cancels this task
            why = "interrupted (Ctrl-C or SIGTERM)"
            raise self._stopped(folder, rows, first_step, why, RunStopped) from None
        finally:
            stop.remove()  # a second Ctrl-C during the clean-up interrupts it
            folder.close()
            board.close()
            world.kill_all()
            ray.kill(trainer.actor)


def write_train_report(
    folder: Path, rows: list[dict], before: dict, after: dict, summary: dict
) -> Path:
    """``report.html``: held-out success before and after, the per-step table, the plots."""
    from pearl.report.html import Section, write_report

    lines = [
        "| step | reward | success | rollout s | train s | gen tok/s | staleness | roles |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['step']} | {r['reward_mean']:.3f} | {100 * r['success_rate']:.1f}% | "
            f"{r['rollout_s']:.2f} | {r['train_s']:.2f} | {r['rollout_tokens_per_s']:.1f} | "
            f"{r['staleness']} | {r['roles']} |"
        )
    evals = [
        "| when | weights | success | 95% interval | mean reward |",
        "|---|---:|---:|---|---:|",
    ]
    for e in (before, after):
        if e:
            evals.append(
                f"| {e['when']} | v{e['weight_version']} | {e['successes']}/{e['tasks']} = "
                f"{100 * e['success_rate']:.1f}% | {100 * e['ci95'][0]:.1f}-"
                f"{100 * e['ci95'][1]:.1f}% | {e['mean_reward']:.3f} |"
            )
    figures = [
        (folder / f"{name}.png", caption)
        for name, caption in (
            ("reward", "training reward and success per step"),
            ("throughput", "rollout throughput; rollout and training seconds per step"),
        )
        if (folder / f"{name}.png").exists()
    ]
    return write_report(
        folder,
        f"PEARL live training: {folder.name}",
        f"{len(rows)} steps in {summary['train_seconds']:.0f} s under policy "
        f"{summary['policy']}; weights v{summary['weight_version']}.",
        [
            Section("Held-out evaluation", tables=[evals[0] + "\n" + "\n".join(evals[1:])])
            if len(evals) > 2
            else Section("Held-out evaluation", "none (run.eval_tasks=0)"),
            Section("Steps", figures=figures, tables=["\n".join(lines)]),
        ],
    )


class _StopOnSignals:
    """Ctrl-C (SIGINT) and SIGTERM cancel the run's main task, through the event loop (Ray
    defers SIGINT around its calls and asyncio's own SIGINT cancellation could be lost), and
    raise a flag the run also checks after every step. A second signal acts as usual
    (KeyboardInterrupt, or termination), for a stop that hangs."""

    def __init__(self) -> None:
        self.requested = False
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._signals: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._loop.add_signal_handler(sig, self._stop)
                self._signals.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                pass

    def _stop(self) -> None:
        self.requested = True
        self.remove()
        if self._task is not None:
            self._task.cancel()

    def remove(self) -> None:
        for sig in self._signals:
            self._loop.remove_signal_handler(sig)
        self._signals.clear()


def _last_checkpoint(folder: Path) -> tuple[int, Path] | None:
    """The newest ``checkpoints/v<N>`` of a run folder that holds a saved optimizer."""
    found = []
    for path in (folder / "checkpoints").glob("v*"):
        if path.name[1:].isdigit() and (path / "optimizer" / "trainer.json").is_file():
            found.append((int(path.name[1:]), path))
    return max(found) if found else None


async def _chaos(plane, every_s: float, seed: int, log) -> None:
    """Kill a random active dedicated rollout worker's actor every ``every_s`` seconds, as a
    crash would (the control plane is not told: it must notice)."""
    import random

    import ray

    from pearl.control.state import Zone

    rng = random.Random(seed)
    killed: set[int] = set()  # handles already killed (their death may not be noticed yet)
    while True:
        await asyncio.sleep(every_s)
        snap = plane.table.snapshot()
        alive = [
            s
            for s, w in plane.rebuilder.workers.items()
            if snap.slot(s).zone is Zone.DEDICATED and id(w) not in killed
        ]
        if alive:
            slot = rng.choice(sorted(alive))
            worker = plane.rebuilder.workers[slot]
            killed.add(id(worker))
            log({"kind": "chaos_kill", "slot": slot, "worker": worker.worker_id})
            ray.kill(worker.actor)


def _workers_at(changes: list[tuple[float, int]], t: float) -> int:
    """Preemptible workers available at ``t`` seconds under a list of (time, count) changes."""
    count = 0
    for at, n in sorted(changes):
        if at <= t:
            count = n
    return count


def _roles(plane) -> str:
    """The active rollout roles, e.g. ``2 colocated`` or ``1 prefill + 1 decode``."""
    from collections import Counter

    from pearl.control.state import WorkerStatus

    snap = plane.table.snapshot()
    counts = Counter(
        str(s.role) for s in snap.slots if s.status is WorkerStatus.ACTIVE and not s.is_training
    )
    return " + ".join(f"{n} {role}" for role, n in sorted(counts.items())) or "none"


def step_row(rec, version: int, offset: int, elapsed: float) -> dict[str, Any]:
    """One ``metrics.jsonl`` row for a trained step."""
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
        "rollout_s": rollout_s,
        "train_s": rec.train_finished - rec.train_started,
        "rollout_tokens_per_s": rec.rollout_tokens / rollout_s if rollout_s > 0 else 0.0,
        "staleness": version - 1 - rec.weight_versions[0],
        "weight_version": version,
        "loss": stats.get("loss", math.nan),
        "grad_norm": stats.get("grad_norm", math.nan),
        "clip_fraction": stats.get("clip_fraction", math.nan),
    }


def rollout_shapes(rec, iterations: list) -> dict[str, Any]:
    """One ``rollouts.jsonl`` row: a step's rollout as token counts and times, enough to
    replay it in the simulator (``benchmarks/train_live_vs_sim.py``): per trajectory, per
    turn ``[appended tokens, generated tokens, tokens of it kept, environment seconds]``;
    the tokens every first prompt shares; the engines' iterations (prefill chunks as
    ``[tokens, cached]``, decode contexts, seconds)."""
    trajectories = rec.result.trajectories
    prompts = [t.sample.token_ids[: t.appended_tokens[0]] for t in trajectories if t.sample]
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
