"""The ``pearl`` command."""

from __future__ import annotations

import json
from dataclasses import asdict

import typer

app = typer.Typer(
    help="PEARL: adaptive prefill-decode execution with elasticity for agentic RL.",
    no_args_is_help=True,
)


@app.command()
def demo(
    sessions: int = typer.Option(8, min=1, max=256, help="concurrent agent sessions"),
    turns: int = typer.Option(4, min=1, max=32, help="turns per session"),
    seed: int = typer.Option(0, help="random seed (model weights and workload)"),
    json_out: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Multi-turn generation on a random-weight model: colocated vs disaggregated."""
    from pearl.demo import run_demo

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


@app.command(context_settings={"allow_extra_args": True})
def simulate(
    ctx: typer.Context,
    config: str | None = typer.Option(
        None, "--config", "-c", help="YAML config file (default: built-in)"
    ),
) -> None:
    """One rollout batch on fixed deployments of a simulated cluster; extra args are key=value overrides."""
    from pearl.config import SimulateConfig, load_config
    from pearl.errors import PearlError
    from pearl.sim.simulate import run_simulate

    try:
        cfg = load_config(SimulateConfig, config, list(ctx.args))
        outcome = run_simulate(cfg)
    except (PearlError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    print(f"run folder: {outcome.run_dir}")


@app.command()
def version() -> None:
    """Print PEARL's version."""
    from pearl import __version__

    print(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
