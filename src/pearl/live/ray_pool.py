"""Independent runs as Ray tasks on a cluster: ``run_in_processes``'s contract, across nodes.

Each job is one task (one CPU slot, no retries): Ray places it on any node with a free
slot, so a cluster of N cores runs N at once. A task whose worker process or node dies
(``ray stop`` on a node, the out-of-memory killer, a preempted VM) is reported with its job
through ``on_died`` and the others go on, as a dead process is in the local pool; the
caller keeps every finished run, so a resume re-runs only the lost ones. An exception a
job raises ends the batch, as it would in one process: the other tasks are cancelled and
the job's own exception is raised here with the task's traceback as a note. Leaving the
call by any exception (Ctrl-C included) cancels every task still running.

Every node must run this PEARL (the same package version, importable by the workers'
Python), as ``pearl train`` on a cluster requires, and see the availability traces a run
reads at the same path: the shipped segments need nothing; CSV traces (``elastic.segments``
files, ``plan.spot``'s in the run folder) need a filesystem every node shares.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from pearl.errors import ConfigError
from pearl.live.cluster import token_refusal, token_refused_message


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` (``"auto"``, or ``"host:port"`` of its head) as a
    driver, unless this process already is; a clear error if nothing answers there."""
    import ray  # after ensure_ray's environment

    if ray.is_initialized():
        return
    try:
        if address != "auto":  # Ray itself would retry an unreachable head for minutes
            host, _, port = address.rpartition(":")
            socket.create_connection((host, int(port)), timeout=10).close()
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    except Exception as exc:
        reason = token_refusal(exc)
        if reason is not None:
            raise ConfigError(token_refused_message("plan.ray_address", address, reason)) from None
        if not isinstance(exc, (OSError, RuntimeError, ValueError)):
            raise
        raise ConfigError(
            f"plan.ray_address={address!r}: no Ray cluster could be joined there ({exc}); "
            "start one with `ray start --head` (then `auto` or its host:port), or leave "
            "plan.ray_address unset to run the grid in local processes"
        ) from None


def _lost(exc: BaseException) -> str | None:
    """Why a task ended without an answer when its process or node died; None for an
    exception the job itself raised."""
    import ray.exceptions as rex  # after ensure_ray's environment

    if isinstance(exc, rex.RayTaskError):
        return None
    died = (
        rex.WorkerCrashedError,
        rex.NodeDiedError,
        rex.LocalRayletDiedError,
        rex.OutOfMemoryError,
    )
    if isinstance(exc, died):  # OutOfMemoryError: Ray's memory monitor killed the worker
        first = (str(exc).splitlines() or [""])[0]
        return f"its Ray worker died ({type(exc).__name__}: {first})"
    if isinstance(exc, (rex.ObjectLostError, rex.OwnerDiedError, rex.TaskCancelledError)):
        return f"its result was lost ({type(exc).__name__})"
    return None


def run_on_ray(
    fn: Callable[..., Any],
    jobs: Sequence[tuple[Hashable, tuple]],
    on_result: Callable[[Hashable, Any], None],
    on_died: Callable[[Hashable, str], None],
    env: Mapping[str, str] | None = None,
) -> None:
    """``fn(*args)`` for every ``(key, args)`` of ``jobs`` as Ray tasks on the cluster this
    process has joined (``connect``), submitted in order, in worker processes started with
    ``env`` added to their environment (Ray's ``runtime_env``); ``on_result(key, value)`` as
    each answer arrives, ``on_died(key, reason)`` for each whose worker or node died."""
    import ray  # after ensure_ray's environment

    options: dict[str, Any] = {"num_cpus": 1, "max_retries": 0}
    if env:
        options["runtime_env"] = {"env_vars": dict(env)}
    task = ray.remote(**options)(fn)
    pending = {task.remote(*args): key for key, args in jobs}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            ref = ready[0]
            key = pending.pop(ref)
            try:
                value = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - sorted below: lost, or the job's own
                why = _lost(exc)
                if why is None:
                    raise _job_error(exc, key) from None
                on_died(key, why)
                continue
            on_result(key, value)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)


def _job_error(exc: BaseException, key: Hashable) -> BaseException:
    """The exception the job raised (not Ray's wrapper), with the task's traceback."""
    import ray.exceptions as rex  # after ensure_ray's environment

    if isinstance(exc, rex.RayTaskError):
        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
        cause.add_note(f"raised by the Ray task running {key}:\n{exc}")
        return cause
    return exc
