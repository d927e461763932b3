"""Independent runs in fresh processes, a few at a time, robust to a process that dies.

``multiprocessing.Pool`` hangs for good when one of its workers is killed (the out-of-memory
killer, ``kill -9``): the task it held never returns. ``concurrent.futures`` fails every
pending task instead. Here each job runs in its own spawned process (its memory goes back
to the system when it ends); a process that exits without an answer is reported with the
job it was running, and the others go on. An exception raised by a job ends the whole
batch, as it would in one process: the other processes are terminated and the job's
exception is raised here, with the process's traceback as a note. Ctrl-C and SIGTERM are
the parent's to handle (the children ignore SIGINT); leaving the call by any exception
terminates every process still running.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import traceback
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any


@dataclass(slots=True)
class _Running:
    key: Hashable
    process: Any  # multiprocessing.context.SpawnProcess
    answer: Connection


def died_reason(exitcode: int | None) -> str:
    """Why a process ended without an answer, in words."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (out of memory, or killed)" if -exitcode == signal.SIGKILL else ""
        return f"its process was killed by {name}{hint}"
    return f"its process exited with code {exitcode} before answering"


def _child(fn: Callable[..., Any], args: tuple, answer: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    try:
        message: tuple = ("ok", fn(*args))
    except BaseException as exc:  # noqa: BLE001 - sent to the parent, which raises it
        message = ("error", exc, traceback.format_exc())
    try:
        answer.send(message)
    except Exception as exc:  # noqa: BLE001 - e.g. an exception that does not pickle
        answer.send(("error", RuntimeError(f"{message[:2]!r} could not be sent: {exc!r}"), ""))
    answer.close()


@contextmanager
def _environment(extra: Mapping[str, str]) -> Iterator[None]:
    """This process's environment plus ``extra`` while a process is spawned (it inherits
    the environment as it starts), the earlier values back after."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def run_in_processes(
    fn: Callable[..., Any],
    jobs: Sequence[tuple[Hashable, tuple]],
    processes: int,
    on_result: Callable[[Hashable, Any], None],
    on_died: Callable[[Hashable, str], None],
    env: Mapping[str, str] | None = None,
) -> None:
    """``fn(*args)`` for every ``(key, args)`` of ``jobs``, in order, at most ``processes``
    at once, each in a fresh spawned process (``fn`` must be importable by name) whose
    environment is this one's plus ``env``. ``on_result(key, value)`` gets each answer as it
    arrives; ``on_died(key, reason)`` each job whose process ended without one."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    ctx = multiprocessing.get_context("spawn")
    pending = deque(jobs)
    running: list[_Running] = []
    try:
        while pending or running:
            while pending and len(running) < processes:
                key, args = pending.popleft()
                receive, send = ctx.Pipe(duplex=False)
                process = ctx.Process(target=_child, args=(fn, args, send), daemon=True)
                with _environment(env or {}):
                    process.start()
                send.close()  # the child holds the only writer: EOF here if it dies
                running.append(_Running(key, process, receive))
            wait([r.answer for r in running] + [r.process.sentinel for r in running])
            for job in list(running):
                if not job.answer.poll() and job.process.is_alive():
                    continue
                try:
                    message = job.answer.recv()
                except EOFError:  # ended without answering
                    message = None
                job.process.join()
                job.answer.close()
                running.remove(job)
                if message is None:
                    on_died(job.key, died_reason(job.process.exitcode))
                elif message[0] == "ok":
                    on_result(job.key, message[1])
                else:
                    error: BaseException = message[1]
                    if message[2]:
                        error.add_note(f"raised by the process running {job.key}:\n{message[2]}")
                    raise error
    finally:
        for job in running:
            job.process.terminate()
        for job in running:
            job.process.join(5)
            if job.process.is_alive():
                job.process.kill()
                job.process.join()
            job.answer.close()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within it SIGTERM raises KeyboardInterrupt, as Ctrl-C does: ``run_in_processes``
    then terminates its processes and the caller keeps what finished, instead of this
    process dying and orphaning them."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
