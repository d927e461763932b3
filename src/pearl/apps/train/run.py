"""``pearl train``: asynchronous multi-turn GRPO on a real model, live.

Composition: a GRPO trainer actor and engine actors (Ray, one torch thread each) under
the control plane (``pearl.control.driver.RunDriver`` over a ``LiveWorld``): rollout
batch i + 1 runs while the trainer trains on batch i (staleness 1), every batch is a
group of episodes per task of a text environment, and new weights reach every rollout
worker through Ray's object store after each step. Before the first and after the last
step the policy is evaluated on held-out tasks. The run folder gets the config,
``metrics.jsonl`` (one row per step), ``events.jsonl``, checkpoints, plots and a report.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import random
import signal
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pearl.agents.endpoint import AgentEndpoint
from pearl.agents.episode import AgentEpisode
from pearl.agents.plugin import AGENT_ENV, API_KEY_ENV, AgentOptions
from pearl.apps.train.metrics import roles_in_use, rollout_shapes, step_row, wilson_interval
from pearl.apps.train.report import write_train_report
from pearl.config.loading import dump_config
from pearl.config.train import TrainConfig
from pearl.control.agent_loop import AgentLoopConfig
from pearl.control.driver import Availability, ClusterSize, RunDriver
from pearl.control.episode import EpisodeBatch, run_episode_batch
from pearl.control.pipeline import PipelineConfig
from pearl.control.policies import Borrowing, PDMode, Pool, get_policy
from pearl.control.state import Zone
from pearl.durable_files import disk_full_error, disk_full_message, recover_folder
from pearl.engine.config import EngineConfig
from pearl.envs import split_seed
from pearl.envs.registry import env_factory
from pearl.envs.tools import check_tools
from pearl.errors import ConfigError, RunInterrupted, RunStopped
from pearl.live import vllm_setup
from pearl.live.cluster import Placement, cpu_slots, ensure_ray
from pearl.live.episodes import TextEpisode
from pearl.live.lora import LoRAConfig
from pearl.live.server import ModelSpec
from pearl.live.trainer_config import TrainerConfig
from pearl.live.trainer_handle import LiveTrainer, TrainerProcessDied
from pearl.live.world import IterationFeed, LiveWorld, cpu_prior
from pearl.models.catalog import resolve_model
from pearl.models.chat import ChatFormat, turn_stop_ids
from pearl.models.config import ModelConfig
from pearl.redaction import redact_secrets, redacted_keys
from pearl.report.plots import plot_training
from pearl.report.progress import Progress
from pearl.report.run_folder import RunFolder, default_run_name
from pearl.report.tensorboard import ScalarLog
from pearl.report.wandb_log import WandbLog


class TrainRun:
    """A live GRPO run: the model and environment checked up front; ``run()`` starts the
    actors and trains (``_LiveRun``)."""

    def __init__(self, cfg: TrainConfig, log: Callable[[str], None] | None = None) -> None:

        self.cfg = cfg
        self.log = log or logging.getLogger(__name__).info
        # Resolved and tried once now: a bad name or option fails before any actor starts.
        self.agent = self.endpoint = None
        if cfg.env.name == AGENT_ENV:
            self.agent = AgentOptions.parse(cfg.env.options)
            self.agent_fn = self.agent.load()
        else:
            self.make_env = env_factory(cfg.env.name, cfg.env.options)
        if cfg.logger.wandb and importlib.util.find_spec("wandb") is None:
            raise ConfigError(
                "logger.wandb: true needs the wandb package (pip install 'pearl-rollout[wandb]'"
                " or pip install wandb)"
            )
        self.folder = resolve_model(cfg.model.name, log=self.log)
        self.model_config = ModelConfig.from_folder(self.folder)
        self.chat = ChatFormat.from_folder(self.folder)  # refuses a model without ChatML's end
        stops = turn_stop_ids(self.folder, self.chat, self.model_config.eos_token_id)
        bad = [t for t in stops if t >= self.model_config.vocab_size]
        if bad:
            raise ConfigError(
                f"model {cfg.model.name}: end-of-turn ids {bad} are outside its vocabulary of "
                f"{self.model_config.vocab_size} (config.json / generation_config.json)"
            )
        self.stop_token_ids = stops
        self._check_tools_prompt()

    def _check_tools_prompt(self) -> None:
        """An environment with tools gets its prompts from the model's chat template (where
        it lays out tools): rendered once now, so that a template that cannot fails here,
        before any actor starts, instead of at the first rollout."""

        if self.agent is not None:
            return  # an agent's calls bring their own tools, checked per call
        env = self.make_env()
        tools = getattr(env, "tools", None)
        if tools:
            demonstration = tuple(getattr(env, "demonstration", ()))
            tools = check_tools(tools, "tools")
            self.chat.prompt(env.system_prompt, "a task", demonstration, tools)

    def episodes(self, split: str, first: int, tasks: int, group: int, log: Callable[[dict], None]):
        """``tasks`` x ``group`` episodes of the tasks ``first``.. of ``split``; environment
        failures go to ``log``."""

        timeout = self.cfg.env.step_timeout_s
        out: list = []
        for t in range(first, first + tasks):
            seed = split_seed(split, t)
            for g in range(group):
                if self.agent is not None:
                    episode = self._agent_episode(seed, f"{split}{t}", log)
                else:
                    episode = TextEpisode(
                        self.make_env(), seed, self.chat, f"{split}{t}", timeout, log
                    )
                out.append((f"{split}{t}/{g}", episode))
        return out

    def _agent_episode(self, seed: int, group: str, log: Callable[[dict], None]):

        options = self.agent
        assert options is not None and self.endpoint is not None  # started by run()
        return AgentEpisode(
            self.agent_fn,
            seed,
            group,
            self.chat,
            self.endpoint,
            options.episode_timeout_s,
            options.kwargs,
            options.success_reward,
            log,
        )

    def run(self, resume: str | None = None) -> dict[str, Any]:
        return asyncio.run(self._main(resume))

    async def _main(self, resume: str | None) -> dict[str, Any]:
        if self.agent is not None:
            options = self.agent
            self.endpoint = AgentEndpoint(
                options.served_model,
                options.host,
                options.port,
                options.api_key,
                options.max_request_bytes,
            )
            await self.endpoint.start()
            self.log(f"agent endpoint: {self.endpoint.url} (one base URL per episode)")
        try:
            return await self._train(resume)
        finally:
            if self.endpoint is not None:
                await self.endpoint.stop()

    async def _train(self, resume: str | None) -> dict[str, Any]:
        live = _LiveRun(self, resume)
        stop = _StopOnSignals()
        failed = False
        try:
            await live.start()
            return await live.train(stop)
        except TrainerProcessDied as exc:  # at start or in a step (rollout workers are replaced)
            failed = True
            raise live.stopped(f"the trainer's process died ({exc})", RunInterrupted) from None
        except asyncio.CancelledError:  # Ctrl-C or SIGTERM: asyncio cancels this task
            failed = True
            await live.flush_checkpoint()  # the last checkpoint is the resume point
            raise live.stopped("interrupted (Ctrl-C or SIGTERM)", RunStopped) from None
        except Exception as exc:
            failed = True
            full = disk_full_error(exc)
            if full is None:
                raise
            # The run folder's disk (or quota) is full: one line, where, and how to go on.
            await live.flush_checkpoint()
            why = f"the disk is full: {disk_full_message(full, live.folder.path)}"
            raise live.stopped(why, RunInterrupted) from None
        finally:
            stop.remove()  # a second Ctrl-C during the clean-up interrupts it
            await live.flush_checkpoint()  # whatever ended the run, a started write lands
            try:
                live.close()
            except Exception as exc:
                if not failed:
                    raise
                # The error that ended the run is the one raised; this one is only told.
                self.log(f"closing the run also failed: {type(exc).__name__}: {exc}")


class _LiveRun:
    """One ``pearl train`` run's actors, control plane and run folder."""

    def __init__(self, run: TrainRun, resume: str | None) -> None:
        self.run, self.cfg, self.resume = run, run.cfg, resume
        self.saved_in_background = False  # a checkpoint was handed to the trainer to write
        cfg = self.cfg
        policy = self.policy = get_policy(cfg.cluster.policy)
        preemptible = cfg.cluster.preemptible_workers if policy.pool is Pool.ELASTIC else 0
        borrows = policy.borrowing is not Borrowing.OFF
        trainers = cfg.trainer.processes
        engine = EngineConfig(
            block_size=16,
            num_kv_blocks=cfg.rollout.kv_blocks,
            max_num_seqs=cfg.rollout.max_num_seqs,
            max_model_len=cfg.rollout.max_context_tokens,
            device=cfg.rollout.device,
            dtype=cfg.rollout.dtype,
        )
        self._start_ray(
            engine, cfg.rollout.workers + preemptible + trainers + (1 if borrows else 0)
        )
        placement = Placement(
            cfg.cluster.worker_resources, cfg.cluster.trainer_resources, cfg.cluster.spread_workers
        )
        self.nodes: dict[str, dict[str, Any]] = {}  # node id -> its address and actors
        self._open_folder()
        spec = ModelSpec(folder=str(run.folder))
        t = cfg.trainer
        self.trainer = LiveTrainer(
            spec,
            trainer_config(cfg),
            t.threads,
            placement,
            trainers,
        )
        batch_size = cfg.rollout.tasks_per_step * cfg.rollout.group_size
        prior = cpu_prior(run.model_config, batch_size, cfg.rollout.max_context_tokens)
        self.world = LiveWorld(
            spec,
            engine,
            self.trainer,
            prior,
            placement=placement,
            on_placed=self.placed,
            backend=cfg.rollout.backend,
        )
        self.started = time.monotonic()
        # One TP-1 "GPU" per process: rollout workers first, then the trainer's slot.
        cluster = ClusterSize(1, cfg.rollout.workers, preemptible, 1)
        availability = Availability.from_changes(cfg.cluster.availability)
        self.driver = RunDriver(self.world, policy, cluster, availability, log=self.log_event)
        self.plane = self.driver.plane
        self._say_when_pd_cannot_split()
        self.rows: list[dict[str, Any]] = []
        self.first_step = 0

    def _start_ray(self, engine: Any, actors: int) -> None:
        """Ray up (or joined) with ``actors`` CPU slots, and for vLLM its release and its
        checks of the model and arguments; ``ConfigError`` if the cluster is too small."""

        backend = self.cfg.rollout.backend
        if backend == "vllm":
            vllm_setup.check_vllm_version()  # installed, and the release whose hooks it uses
        ensure_ray(actors, self.cfg.cluster.ray_address)  # before ray is imported (loopback)
        if backend == "vllm":  # (vLLM imports ray): its checks of model and args
            vllm_setup.preflight(str(self.run.folder), engine)
        slots = cpu_slots()
        if slots < actors:
            raise ConfigError(
                f"this run needs {actors} Ray CPU slots (rollout workers, trainer processes, "
                f"borrowed slot); the running Ray instance has {slots}"
            )

    def _open_folder(self) -> None:
        """The run folder (its config written) and the boards that log into it."""

        cfg = self.cfg
        name = cfg.run.run_name or default_run_name("train-")
        self.folder = RunFolder(cfg.run.run_dir, name)
        self.folder.write_config(dump_config(cfg))
        self.run.log(f"run folder: {self.folder.path}")
        self.boards: list[Any] = [ScalarLog(self.folder.path)]
        if cfg.logger.wandb:
            config = cfg.model_dump(mode="json")
            self.boards.append(WandbLog(self.folder.path, cfg.logger.wandb_project, name, config))

    def _say_when_pd_cannot_split(self) -> None:
        """A PD policy on a pool too small to split prefill and decode runs colocated: say
        so (the config refuses a static split that could never happen)."""

        if self.policy.pd is PDMode.COLOCATED:
            return
        fewest, most = self.cfg.pool_sizes()
        if fewest >= 2:
            return
        if most >= 2:
            why = (
                f"{self.policy.name} runs colocated while the pool has 1 rollout worker, and "
                f"splits prefill and decode once it has 2 (up to {most}: preemptible workers "
                "or the trainer's borrowed slot)"
            )
        else:  # adaptive PD on one worker for good: colocated is the only choice
            why = (
                f"{self.policy.name} runs colocated: a pool of 1 rollout worker cannot split "
                "prefill and decode (rollout.workers=2 or more lets it)"
            )
        self.run.log(why)
        self.log_event({"kind": "pd_colocated", "workers": fewest, "most": most, "why": why})

    def scalars(self, prefix: str, row: dict[str, Any], step: int) -> None:
        """A row's numbers to TensorBoard (and W&B when on)."""
        for board in self.boards:
            board.scalars(prefix, row, step)

    def log_event(self, event: dict) -> None:
        self.folder.event({**event, "t": round(time.monotonic() - self.started, 3)})

    def placed(self, event: dict) -> None:
        """An actor runs on a node: the event, and the run's node table."""
        self.log_event(event)
        node = self.nodes.setdefault(event["node_id"], {"ip": event["node_ip"], "actors": []})
        rank = f"-{event['rank']}" if event.get("rank") else ""  # trainer processes past 0
        node["actors"].append(event.get("worker", event["actor"] + rank))

    async def start(self) -> None:
        """The trainer (from a checkpoint on resume), then the initial rollout workers with
        the trainer's weights; iteration logging on."""
        await self.trainer.start(self.resume)
        for rank, location in enumerate(self.trainer.locations):
            self.placed({"kind": "placed", "actor": "trainer", "rank": rank} | location)
        self.first_step = self.trainer.weight_version
        await self.driver.start()
        await asyncio.gather(*(w.ready() for w in self.world.workers.values()))
        if self.first_step:
            workers = self.plane.active_workers()
            await asyncio.gather(*(w.sync_weights(self.first_step) for w in workers))
            self.run.log(f"resumed from {self.resume} at weights v{self.first_step}")
        await self.world.start_logging()

    def _batch(self, split: str, first: int, tasks: int, group: int):

        rollout = self.cfg.rollout
        episodes = self.run.episodes(split, first, tasks, group, self.log_event)
        return EpisodeBatch(
            episodes, rollout.max_new_tokens, rollout.max_context_tokens, rollout.max_turns
        )

    def _loop_config(self, temperature: float):

        rollout = self.cfg.rollout
        return AgentLoopConfig(
            vocab_size=self.run.model_config.vocab_size,
            temperature=temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            seed=self.cfg.run.seed,
            stop_token_ids=self.run.stop_token_ids,
        )

    async def evaluate(self, tag: str) -> dict[str, Any]:
        """Held-out success of the current weights (one episode per held-out task)."""

        cfg = self.cfg
        if not cfg.run.eval_tasks:
            return {}
        temperature = cfg.run.eval_temperature
        loop = self._loop_config(cfg.rollout.temperature if temperature is None else temperature)
        t0 = time.monotonic()
        batch = self._batch("heldout", 0, cfg.run.eval_tasks, 1)
        result = await run_episode_batch(batch, self.plane.router, self.plane.clock, loop)
        wins = [t.sample.success for t in result.trajectories]
        row = {
            "when": tag,
            "weight_version": self.trainer.weight_version,
            "tasks": len(wins),
            "successes": sum(wins),
            "success_rate": sum(wins) / len(wins),
            "ci95": wilson_interval(sum(wins), len(wins)),
            "mean_reward": statistics.fmean(t.reward for t in result.trajectories),
            "seconds": time.monotonic() - t0,
        }
        # Per task, in held-out order (task i is seed split_seed("heldout", i)): breakdowns
        # by task kind (benchmarks/swe_agent.py's tiers) are read from these.
        per_task = {
            "task_successes": wins,
            "task_rewards": [round(t.reward, 6) for t in result.trajectories],
        }
        self.folder.event({"kind": "eval", **row, **per_task})
        self.scalars(f"eval_{tag}", row, self.trainer.weight_version)
        self.run.log(
            f"eval ({tag}, v{row['weight_version']}): success {row['successes']}/"
            f"{row['tasks']} = {100 * row['success_rate']:.1f}% "
            f"(95% CI {100 * row['ci95'][0]:.1f}-{100 * row['ci95'][1]:.1f}%)"
        )
        return row

    async def train(self, stop: _StopOnSignals) -> dict[str, Any]:
        """Evaluate, run the RL steps, save, evaluate again; the run's summary."""

        cfg = self.cfg
        before = await self.evaluate("before")
        if cfg.run.steps == 0:  # evaluation only: no step, no checkpoint
            return await self._finish(0, 0.0, before)
        await self.world.drain_logs()  # the evaluation's iterations are not step 0's
        offset = self.first_step  # task indices continue after a resume
        tasks, group = cfg.rollout.tasks_per_step, cfg.rollout.group_size
        steps = Progress(cfg.run.steps, "RL steps", logger=__name__)
        recorder = _StepRecorder(self, offset, steps, stop)
        listener = recorder.feed
        chaos = None
        if cfg.run.chaos_kill_every_s > 0:
            chaos = asyncio.ensure_future(
                _chaos(self.plane, cfg.run.chaos_kill_every_s, cfg.run.seed, self.log_event)
            )
        try:
            with steps:
                rounds = cfg.rollout.max_extra_rounds
                records = await self.driver.run(
                    lambda i: self._batch("train", (offset + i) * tasks, tasks, group),
                    self._loop_config(cfg.rollout.temperature),
                    PipelineConfig(
                        cfg.run.steps,
                        max_staleness=cfg.run.max_staleness,
                        overlap_batches=cfg.run.overlap_batches,
                        dynamic_sampling=cfg.rollout.dynamic_sampling,
                        max_extra_rounds=rounds,
                    ),
                    listener,
                    # dynamic sampling's rounds: fresh tasks, (step, round) apart
                    lambda i, r, n: self._batch(
                        "train-more", ((offset + i) * rounds + r) * tasks, n, group
                    ),
                )
        finally:
            if chaos is not None:
                chaos.cancel()
        return await self._finish(len(records), time.monotonic() - recorder.started, before)

    async def _finish(self, steps: int, train_s: float, before: dict) -> dict[str, Any]:
        """Plots, the final checkpoint, the held-out evaluation after, summary and report."""
        if self.rows:
            plot_training(self.rows, self.folder.path)
        checkpoint: Path | None = None
        after = before  # evaluation only: the same weights
        if steps:
            checkpoint = self.folder.path / "checkpoints" / f"v{self.trainer.weight_version}"
            await self.trainer.save(str(checkpoint))
            after = await self.evaluate("after")
        summary = {
            "complete": True,
            "steps": steps,
            "train_seconds": train_s,
            "before": before,
            "after": after,
            "checkpoint": str(checkpoint) if checkpoint else None,
            "weight_version": self.trainer.weight_version,
            "policy": self.policy.name,
            "counters": self.driver.counters(),
            "nodes": self.nodes,
        }
        endpoint = self.run.endpoint
        if endpoint is not None:  # env.name: agent: calls answered, and refused with an error
            summary["agent_endpoint"] = {"calls": endpoint.calls, "errors": endpoint.refused}
        self.folder.summary(summary)
        write_train_report(self.folder.path, self.rows, before, after, summary)
        if checkpoint:
            self.run.log(f"checkpoint: {checkpoint}")
        return {"run_dir": str(self.folder.path), **summary}

    async def flush_checkpoint(self) -> None:
        """Wait for a checkpoint the trainer is writing in the background, if it can."""
        if not self.saved_in_background:  # none was started (a dead trainer has nothing to say)
            return
        try:
            await asyncio.wait_for(self.trainer.flush(), timeout=120)
        except Exception as exc:  # a dead trainer or a failed write: the folder says
            full = disk_full_error(exc)
            cause = getattr(exc, "cause", None) or exc  # a Ray task error: the trainer's own
            what = disk_full_message(full, self.folder.path) if full else f"{cause}"
            self.run.log(f"the last checkpoint could not be completed ({what})")

    def stopped(self, why: str, stop: type[RunInterrupted]) -> RunInterrupted:
        """Mark the run folder incomplete and say how to continue from the last checkpoint
        (the message, even when the mark cannot be written: a full disk)."""
        folder, rows = self.folder, self.rows
        last = _last_checkpoint(folder.path)
        try:
            folder.summary(
                {
                    "complete": False,
                    "error": why,
                    "steps": len(rows),
                    "last_checkpoint": str(last[1]) if last else None,
                }
            )
        except OSError as exc:
            self.run.log(f"summary.json could not be written ({exc})")
        where = f"metrics and checkpoints are in {folder.path}"
        if last is None:
            return stop(
                f"{why} after {len(rows)} steps, before any checkpoint "
                f"(run.checkpoint_every); {where}"
            )
        version, path = last
        remaining = self.first_step + self.cfg.run.steps - version
        command = resume_command(self.cfg, folder.path, path, remaining)
        return stop(f"{why} after {len(rows)} steps; {where}; continue from v{version}{command}")

    def close(self) -> None:
        """Stop the actors and close the run's files: every step is tried, whatever fails
        before it (a full disk must not leave the workers and trainer running); the first
        failure is raised once all ran."""
        steps: list[tuple[str, Callable[[], object]]] = [
            ("kill the rollout workers", self.world.kill_all),
            ("kill the trainer", self.trainer.kill),
            ("close the run folder", self.folder.close),
        ]
        steps += [(f"close {type(b).__name__}", b.close) for b in self.boards]
        run_every_step(steps, self.run.log)


class _StepRecorder:
    """After each trained step: the metrics row, the rollout's shapes, progress, and a
    checkpoint when one is due. ``feed`` is the pipeline's listener: it hands the engines'
    iterations to the tracker and calls ``on_step``."""

    def __init__(self, live: _LiveRun, offset: int, progress: Progress, stop) -> None:

        self.live, self.offset, self.progress, self.stop = live, offset, progress, stop
        self.started = time.monotonic()
        self.feed = IterationFeed(live.world, live.plane, self.on_step)

    async def on_step(self, step: int, version: int) -> None:
        if self.stop.requested:  # in case a cancellation was swallowed on the way
            raise asyncio.CancelledError
        live = self.live
        rec = live.plane.pipeline.records[step]
        # The pipeline's clock is the event loop's: time.monotonic() (asyncio's default).
        row = step_row(rec, version, self.offset, time.monotonic() - self.started, self.started)
        row["roles"] = roles_in_use(live.plane)
        row["borrowed"] = bool(live.plane.toggle and live.plane.toggle.borrowed)
        live.rows.append(row)
        live.folder.metric(row)
        live.scalars("train", row, row["step"])
        iterations = self.feed.iterations.pop(rec.step, [])
        live.folder.append("rollouts.jsonl", rollout_shapes(rec, iterations))
        self.progress.advance(
            f"step {row['step']:3d}  reward {row['reward_mean']:.3f}  success "
            f"{100 * row['success_rate']:5.1f}%  rollout {row['rollout_s']:5.1f}s  "
            f"train {row['train_s']:5.1f}s  gen {row['rollout_tokens_per_s']:6.1f} tok/s  "
            f"staleness {row['staleness']}  v{version}  roles {row['roles']}"
        )
        every = live.cfg.run.checkpoint_every
        if every and (step + 1) % every == 0:
            # Written while the next step trains; the final checkpoint waits for it.
            path = live.folder.path / "checkpoints" / f"v{version}"
            live.saved_in_background = True
            await live.trainer.save(str(path), background=True)


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


def trainer_config(cfg: TrainConfig) -> TrainerConfig:
    """What the trainer processes are given: the trainer section, and the rollout's
    sampling (the behaviour log-probabilities' distribution)."""

    t = cfg.trainer
    return TrainerConfig(
        learning_rate=t.learning_rate,
        clip_eps=t.clip_eps,
        clip_eps_high=t.clip_eps_high,
        advantage_estimator=t.advantage_estimator,
        scale_rewards=t.scale_rewards,
        loss_agg_mode=t.loss_agg_mode,
        loss_norm_tokens=cfg.loss_norm_tokens,
        kl_coef=t.kl_coef,
        kl_estimator=t.kl_estimator,
        kl_ratio_correction=t.kl_ratio_correction,
        mask_overlong=t.mask_overlong,
        recompute_logprobs=t.recompute_logprobs,
        tis_cap=t.tis_cap,
        lora=LoRAConfig(t.lora.rank, t.lora.alpha, tuple(t.lora.target_modules))
        if t.lora.rank
        else None,
        ppo_epochs=t.ppo_epochs,
        mini_batches=t.mini_batches,
        max_grad_norm=t.max_grad_norm,
        micro_batch_tokens=t.micro_batch_tokens,
        temperature=cfg.rollout.temperature,
        top_k=cfg.rollout.top_k,
        top_p=cfg.rollout.top_p,
        device=t.device,
        dtype=t.dtype,
    )


def run_every_step(
    steps: list[tuple[str, Callable[[], object]]], log: Callable[[str], None]
) -> None:
    """Call every step in order, even past one that fails (each failure is logged with
    its step's name); then raise the first failure, if any."""
    first: Exception | None = None
    for name, step in steps:
        try:
            step()
        except Exception as exc:
            log(f"{name} failed: {type(exc).__name__}: {exc}")
            first = first or exc
    if first is not None:
        raise first


def resume_command(cfg: TrainConfig, folder: Path, checkpoint: Path, remaining: int) -> str:
    """``with: pearl train ...``: what continues the run in ``folder`` from ``checkpoint``
    for its ``remaining`` steps. Its secrets, which the run folder does not keep, are asked
    for again: the agent endpoint's key in ``$PEARL_AGENT_API_KEY`` (an override would put
    it on the command line, which every local user can read), others as overrides."""

    secrets = redacted_keys(redact_secrets(cfg.model_dump(mode="json")))
    overrides = [f"run.steps={remaining}", f"run.run_name={folder.name}-resumed"]
    note = ""
    if cfg.env.name == AGENT_ENV and "env.options.api_key" in secrets:
        secrets.remove("env.options.api_key")
        overrides.append("env.options.api_key=null")
        note = (
            f", the agent endpoint key exported as ${API_KEY_ENV} (an override would show "
            "it to every local user),"
        )
    elif cfg.env.name == AGENT_ENV and os.environ.get(API_KEY_ENV):
        note = f", ${API_KEY_ENV} set as in this run,"
    overrides += [f"{key}=..." for key in secrets]
    return (
        f"{note} with: pearl train --config {folder / 'config.yaml'} --resume {checkpoint} "
        + " ".join(overrides)
    )


def _last_checkpoint(folder: Path) -> tuple[int, Path] | None:
    """The newest ``checkpoints/v<N>`` of a run folder that holds a saved optimizer. A
    ``v<N>.old`` alone (a crash cut the swap that was replacing ``v<N>``) is renamed back
    first (``recover_folder``), or, if that fails, is the checkpoint where it lies."""
    found: dict[int, Path] = {}
    for path in sorted((folder / "checkpoints").glob("v*")):
        name = path.name.removesuffix(".old")
        if not name[1:].isdigit():
            continue
        if path.name != name:
            try:
                if not recover_folder(path.with_name(name)):
                    continue
                path = path.with_name(name)
            except OSError:  # read it where it lies (the message must still be given)
                if path.with_name(name).exists():
                    continue
        if (path / "optimizer" / "trainer.json").is_file():
            found[int(name[1:])] = path
    return max(found.items()) if found else None


async def _chaos(plane, every_s: float, seed: int, log) -> None:
    """Kill a random active dedicated rollout worker's actor every ``every_s`` seconds, as a
    crash would (the control plane is not told: it must notice)."""

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
            worker.crash()
