"""The environment of the processes PEARL starts for simulations (the local pool's, Ray's
tasks, the benchmarks'): Python's objects on huge pages (``pearl.processes.huge_pages``) and the
engine's compiled modules where a build exists (``pearl.native``). Both are read as the
interpreter starts, so they apply to those processes, not to the one that starts them."""

from __future__ import annotations

from collections.abc import Mapping

from pearl.native import native_env
from pearl.processes.huge_pages import huge_page_env


def simulation_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables to add to ``environ`` (default: this process's) for a simulation process."""
    native = native_env(environ)
    return {**huge_page_env(environ, arenas=bool(native)), **native}
