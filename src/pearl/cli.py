"""The ``pearl`` command.

Each command imports its program when it runs (the imports inside the functions below):
``pearl --help`` and ``pearl config show`` start in ~0.5 s instead of loading torch, Ray
and the simulator for every command."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from pearl.apps.calibrate import FitReport

app = typer.Typer(
    help="PEARL: adaptive prefill-decode execution with elasticity for agentic RL. "
    "Every config default, with what it means: pearl config show rollout, rl or train.",
    no_args_is_help=True,
)


@app.callback()
def _options(
    ctx: typer.Context,
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="also debug lines, with times and module names"
    ),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="only warnings, errors and results (no progress)"
    ),
) -> None:
    """Progress and log lines go to stderr; results (tables, the run folder) to stdout."""
    from pearl.report.progress import NORMAL, QUIET, VERBOSE, reset_logging, setup_logging

    if verbose and quiet:
        raise typer.BadParameter("--verbose and --quiet exclude each other")
    setup_logging(VERBOSE if verbose else QUIET if quiet else NORMAL)
    ctx.call_on_close(reset_logging)  # the streams it wrote to may close with the command


@app.command()
def demo(
    sessions: int = typer.Option(8, min=1, max=256, help="concurrent agent sessions"),
    turns: int = typer.Option(4, min=1, max=32, help="turns per session"),
    seed: int = typer.Option(0, help="random seed (model weights and workload)"),
    json_out: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Multi-turn generation on a random-weight model: colocated vs disaggregated."""
    from pearl.apps.demo import run_demo

    report = run_demo(
        sessions=sessions, turns=turns, seed=seed, log=(lambda *_: None) if json_out else print
    )
    if json_out:
        print(json.dumps(asdict(report), indent=2))
        return
    print()
    print(f"generated tokens        {report.generated_tokens}")
    print(
        f"colocated throughput    {report.generated_tokens / report.colocated_seconds:8.1f} tok/s"
    )
    print(
        f"disaggregated (P->D)    {report.generated_tokens / report.disaggregated_seconds:8.1f} tok/s  (in-process, one core)"
    )
    print(f"KV moved P->D           {report.kv_bytes_moved / 2**20:.1f} MiB")
    print(
        f"prefix/session cache    {100 * report.prefix_cache_hit_rate:.1f}% of prompt tokens served from cache"
    )
    print(
        f"paths agree             {report.turns_identical}/{report.turns_total} turns token-identical"
    )
    if report.turns_identical != report.turns_total:
        raise typer.Exit(code=1)


def _config_keys(fields: dict) -> str:
    """``section.key`` names of a config model's ``model_fields``, for --help."""
    from pydantic import BaseModel

    keys = []
    for name, field in fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            keys += [f"{name}.{sub}" for sub in kind.model_fields]
        else:
            keys.append(name)
    return ", ".join(keys)


def _simulate_help() -> str:
    from pearl.config.simulate import RLExperimentConfig, SimulateConfig

    rollout = SimulateConfig.model_fields
    rl_only = {k: v for k, v in RLExperimentConfig.model_fields.items() if k not in rollout}
    return (
        "Simulate a cluster; extra args are key=value overrides. Every key with its default "
        "and meaning: pearl config show rollout (or rl).\n\n"
        "kind: rollout (default): one rollout batch on fixed deployments. "
        "kind: rl (e.g. configs/headline.yaml): whole RL runs of every policy on every "
        "availability segment, with a throughput table.\n\n"
        f"Keys (kind: rollout): {_config_keys(rollout)}.\n\n"
        f"Also with kind=rl: {_config_keys(rl_only)}."
    )


@contextmanager
def _simulated_run_exits() -> Iterator[None]:
    """How a simulated run ends on the command line: runs lost with their process (exit 1,
    the rest kept), stopped by Ctrl-C or SIGTERM (130, where the results are), bad input (2)."""
    from pearl.errors import PearlError, RunInterrupted, RunsLost

    try:
        yield
    except RunsLost as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from None
    except RunInterrupted as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(code=130) from None
    except (PearlError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None


@app.command(context_settings={"allow_extra_args": True}, help=_simulate_help())
def simulate(
    ctx: typer.Context,
    config: str | None = typer.Option(
        None, "--config", "-c", help="YAML config file (default: built-in)"
    ),
) -> None:
    """Simulate a cluster; extra args are key=value overrides.

    ``kind: rollout`` (default): one rollout batch on fixed deployments.
    ``kind: rl`` (e.g. configs/headline.yaml): whole RL runs of every policy on every
    availability segment, with a throughput table.
    """
    from pearl.config.simulate import load_simulate_config

    with _simulated_run_exits():
        cfg = load_simulate_config(config, list(ctx.args))
        if cfg.kind == "rl":
            from pearl.apps.experiment import run_experiment

            outcome = run_experiment(cfg)
            print(f"{outcome.table}\n\n{outcome.time_table}\n")
        else:
            from pearl.apps.simulate import run_simulate

            outcome = run_simulate(cfg)
    print(f"run folder: {outcome.run_dir}")


@app.command(context_settings={"allow_extra_args": True})
def train(
    ctx: typer.Context,
    config: str | None = typer.Option(
        None, "--config", "-c", help="YAML config (default: SmolLM2-135M on the calculator task)"
    ),
    resume: str | None = typer.Option(
        None, help="a checkpoint folder of an earlier run (runs/<run>/checkpoints/v<N>)"
    ),
) -> None:
    """Asynchronous multi-turn GRPO on a real model, live; extra args are key=value overrides
    (e.g. run.steps=5 rollout.workers=2 env.name=guess); every key: pearl config show train."""
    from pearl.apps.train.run import TrainRun
    from pearl.config.train import load_train_config
    from pearl.durable_files import disk_full_error, disk_full_message, recover_folder
    from pearl.errors import PearlError, RunStopped

    try:
        cfg = load_train_config(config, list(ctx.args))
        if resume is not None:
            recover_folder(resume)  # a checkpoint whose replacement a crash cut short
        if resume is not None and not (Path(resume) / "optimizer" / "trainer.json").is_file():
            raise PearlError(
                f"--resume {resume}: not a checkpoint folder (no optimizer/trainer.json)"
            )
        outcome = TrainRun(cfg).run(resume)
    except RunStopped as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(code=130) from None
    except KeyboardInterrupt:  # before the run folder existed: nothing to keep
        typer.echo("interrupted before the run started", err=True)
        raise typer.Exit(code=130) from None
    except (PearlError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    except OSError as exc:  # a full disk before the run had a folder to resume from
        full = disk_full_error(exc)
        if full is None:
            raise
        typer.echo(f"error: the disk is full: {disk_full_message(full, Path.cwd())}", err=True)
        raise typer.Exit(code=2) from None
    print(f"run folder: {outcome['run_dir']}")


@app.command(context_settings={"allow_extra_args": True})
def plan(
    ctx: typer.Context,
    config: str | None = typer.Option(
        None,
        "--config",
        "-c",
        help="YAML config (kind: plan, or an RL config such as configs/headline_paper.yaml)",
    ),
    resume: str | None = typer.Option(
        None, "--resume", help="a plan folder to finish (its config; only missing runs run)"
    ),
) -> None:
    """Which reserved pool, TP and policy to run, and what a trained token costs: every
    policy over a grid of reserved pool sizes and TP degrees on the availability traces,
    priced; prints the frontier and the recommendation (every key: pearl config show plan)."""
    from pearl.apps.plan import load_plan_config, run_plan

    with _simulated_run_exits():
        try:
            cfg = load_plan_config(config, list(ctx.args))
            outcome = run_plan(cfg, resume)
        except KeyboardInterrupt:  # before any run started: nothing to keep
            typer.echo("interrupted before the plan's runs started", err=True)
            raise typer.Exit(code=130) from None
    print(f"{outcome.table}\n\n{outcome.recommendation}\nrun folder: {outcome.run_dir}")


@app.command()
def report(
    run_dir: str = typer.Argument(..., help="a simulated RL run folder (runs/<run>)"),
) -> None:
    """Redraw the figures, table.md and report.html of a simulated RL experiment from its
    kept runs (runs/<policy>@<segment>.json): after Ctrl-C, or with a newer PEARL."""
    from pearl.apps.experiment import rebuild_report
    from pearl.errors import PearlError

    try:
        print(f"report: {rebuild_report(run_dir)}")
    except (PearlError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None


config_app = typer.Typer(help="Run configurations.", no_args_is_help=True)
app.add_typer(config_app, name="config")

CONFIG_KINDS = {
    "rollout": "pearl simulate (kind: rollout): one rollout batch on fixed deployments",
    "rl": "pearl simulate kind=rl: whole RL runs of every policy on availability segments",
    "train": "pearl train: live asynchronous GRPO on a real model",
    "plan": "pearl plan: the policies over reserved pool sizes and TP degrees, priced",
}


@config_app.command("show")
def config_show(
    kind: str = typer.Argument("rollout", help=f"which config: {', '.join(CONFIG_KINDS)}"),
) -> None:
    """Print a command's defaults as YAML, each key with what it means and its bounds
    (save it, edit it, pass it with --config)."""
    from pearl.config.loading import annotated_defaults
    from pearl.config.plan import PlanConfig
    from pearl.config.simulate import RLExperimentConfig, SimulateConfig

    if kind not in CONFIG_KINDS:
        typer.echo(f"error: unknown config {kind!r}; valid: {', '.join(CONFIG_KINDS)}", err=True)
        raise typer.Exit(code=2)
    if kind == "train":
        from pearl.config.train import TrainConfig

        model: type = TrainConfig
    else:
        model = {"rl": RLExperimentConfig, "plan": PlanConfig}.get(kind, SimulateConfig)
    print(annotated_defaults(model, f"defaults of {CONFIG_KINDS[kind]}"), end="")


models_app = typer.Typer(
    help="Pretrained models shipped in registry packages.", no_args_is_help=True
)
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list() -> None:
    """The catalog: name, package, licence."""
    from pearl.models.catalog import CATALOG

    for entry in CATALOG.values():
        print(f"{entry.name:16s} {entry.distribution:14s} {entry.licence:12s} {entry.description}")


@models_app.command("get")
def models_get(name: str = typer.Argument(..., help="catalog name, e.g. smollm2-135m")) -> None:
    """Convert a catalog model to a local Hugging Face folder (once) and print its path."""
    from pearl.errors import PearlError
    from pearl.models.catalog import model_folder

    try:
        print(model_folder(name))
    except PearlError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None


def _calibrate_case_indices(
    calibration: str, fidelity: bool, model: str, cases: str, backend: str = "pearl"
) -> list[int]:
    """Check ``pearl calibrate``'s options before any work; return the chosen fidelity case
    indices, or echo the error and exit with code 2."""
    from pearl.apps import fidelity as fid

    problem = None
    if backend not in fid.BACKENDS:
        problem = f"--backend {backend!r} is not one of {', '.join(fid.BACKENDS)}"
    elif backend == "vllm" and not fidelity:
        problem = "--backend vllm fits the cost model during the fidelity run: drop --no-fidelity"
    elif backend == "vllm" and calibration != "in-situ":
        problem = (
            "--backend vllm fits in situ only (--calibration in-situ): the grid is timed in "
            "our engine's worker"
        )
    elif backend == "vllm":
        from pearl.errors import ConfigError

        try:
            fid.check_backend(backend)
        except ConfigError as exc:
            problem = str(exc)
    if problem is not None:
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(code=2)
    if calibration not in fid.CALIBRATIONS:
        typer.echo(
            f"error: --calibration {calibration!r} is not one of {', '.join(fid.CALIBRATIONS)}",
            err=True,
        )
        raise typer.Exit(code=2)
    if fidelity and model != "qwen3-16m":
        typer.echo(
            "fidelity runs use the built-in qwen3-16m model; calibrate that model for them "
            "(or pass --no-fidelity)",
            err=True,
        )
        raise typer.Exit(code=2)
    n = len(fid.DEFAULT_CASES)  # checked before the calibration spends minutes
    try:
        indices = list(range(n)) if cases == "all" else [int(i) for i in cases.split(",")]
        if not indices or any(not 0 <= i < n for i in indices):
            raise ValueError
    except ValueError:
        typer.echo(
            f"error: --cases {cases!r}: use all, or a comma list of indices 0-{n - 1}", err=True
        )
        raise typer.Exit(code=2) from None
    return indices


def _run_fidelity(
    indices: list[int],
    calibration: str,
    live_repeats: int,
    out: str | None,
    report: FitReport | None,
    results: str,
    backend: str = "pearl",
) -> None:
    """Run the fidelity cases ``indices``, print the median makespan error and write the
    table (with the profile path ``out`` and its fit ``report``) to ``results``."""
    import json
    import statistics
    from pathlib import Path

    from pearl.apps import fidelity as fid

    chosen = [fid.DEFAULT_CASES[i] for i in indices]
    # Fidelity refits inside a live worker process (wall clock, as deployed) and measures the
    # per-turn overhead outside the engine; the in-process profile above is for users' runs.
    rows = [
        r.row()
        for r in fid.compare(
            None, chosen, calibration=calibration, live_repeats=live_repeats, backend=backend
        )
    ]
    errors = [abs(r["makespan_error"]) for r in rows]
    print(
        f"median |makespan error| over {len(rows)} cases: {100 * statistics.median(errors):.1f}% (target 10%)"
    )
    Path(results).parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "backend": backend,
        "profile": out,
        "fit": report.to_dict() if report is not None else None,
        "calibration": calibration,
        "cases": rows,
        "live_repeats": live_repeats,
        "median_abs_makespan_error": statistics.median(errors),
        "median_abs_turn_error": statistics.median(r["median_abs_turn_error"] for r in rows),
    }
    Path(results).write_text(json.dumps(payload, indent=2))
    print(f"wrote {results}")


@app.command()
def calibrate(
    model: str = typer.Option(
        "qwen3-16m", help="model folder, config.json, or a random model: qwen3-16m, qwen3-tiny"
    ),
    out: str = typer.Option("profiles/cpu.yaml", help="where to write the fitted profile"),
    grid: str = typer.Option("default", help="batch-shape grid: default or quick"),
    repeats: int = typer.Option(5, min=1, max=50, help="timed repeats per shape"),
    fidelity: bool = typer.Option(
        True, help="then run live (Ray) vs simulated workloads and report the error"
    ),
    cases: str = typer.Option(
        "all",
        help="fidelity cases: all, or a comma list of indices (0-7; 6-7 reconfigure mid-batch)",
    ),
    results: str = typer.Option("results/fidelity.json", help="where to write the fidelity table"),
    live_repeats: int = typer.Option(
        3, min=1, max=20, help="live runs per fidelity case (the error is against their mean)"
    ),
    calibration: str = typer.Option(
        "in-situ",
        help="fidelity fit: in-situ (iterations of held-out live runs per deployment size), "
        "grid (the grid in one worker) or grid-load (the grid in n workers at once)",
    ),
    backend: str = typer.Option(
        "pearl",
        help="live engine of the fidelity runs: pearl (ours) or vllm (from .venv-vllm; the "
        "cost model is then fitted to vLLM's own iterations, in situ)",
    ),
) -> None:
    """Fit the cost model to this machine's engine; measure the simulator against live runs."""
    indices = _calibrate_case_indices(calibration, fidelity, model, cases, backend)
    if backend == "vllm":  # our engine's grid profile says nothing about vLLM's
        _run_fidelity(indices, calibration, live_repeats, None, None, results, backend)
        return
    from pearl.apps.calibrate import run_calibrate
    from pearl.errors import PearlError

    log = logging.getLogger("pearl.calibrate").info
    log(f"calibrate: profile {model} on the {grid!r} grid, then fit the cost model")
    try:
        report = run_calibrate(model, out, grid, repeats=repeats, echo=log)
    except (PearlError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    if not fidelity:
        return
    _run_fidelity(indices, calibration, live_repeats, out, report, results, backend)


@app.command()
def version() -> None:
    """Print PEARL's version."""
    from pearl import __version__

    print(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
