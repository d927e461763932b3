"""How an agent function runs: an ``async def`` as a task on the run's event loop, a plain
``def`` in a thread of its own.

A plain agent blocks (the ``openai.OpenAI`` client, ``requests``, ``time.sleep``); on the
loop it would stop every episode, the endpoint it calls included (a deadlock: its own call
could never be answered). In a thread it blocks only itself, and its episode's timeout
holds: the episode ends on time and the thread is left to finish on its own (Python cannot
stop a thread), its later calls refused by the endpoint.

Threads rather than processes: an agent is handed a ``client`` and keyword arguments and
returns a reward, all in memory; a process per episode would need them pickled, the agent
importable by name in a fresh interpreter, and a process start per trajectory. An agent
that computes rather than waits holds the GIL either way it is written; it should start a
process of its own (docs/environments.md). Each thread is a daemon: one stuck for good
never keeps the run from exiting (``asyncio.to_thread``'s pool would be joined at exit).
Threads left running past their episode are counted; past ``MAX_LEFT_THREADS`` a plain
agent's episode fails at its start (``env_error``) instead of piling up more.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Mapping
from typing import Any

MAX_LEFT_THREADS = 256  # plain agents still running after their episodes ended
_left = 0  # how many there are now (changed on the event loop's thread only)


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` gives a coroutine (a function, a partial or a callable object)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        inspect.getattr_static(type(fn), "__call__", None)  # a callable object's async __call__
    )


def start_agent(
    fn: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any], name: str
) -> asyncio.Future:
    """``fn(*args, **kwargs)`` started: a task for an async function, else a future settled
    from a daemon thread named ``name``. Cancelling the future abandons the thread."""
    if is_async(fn):
        return asyncio.ensure_future(fn(*args, **kwargs))
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()
    if _left >= MAX_LEFT_THREADS:
        future.set_exception(
            RuntimeError(
                f"was not started: {_left} plain agents are still running in threads after "
                "their episodes ended (each past its timeout); a plain agent must return"
            )
        )
        return future

    def abandoned(_: asyncio.Future) -> None:
        global _left
        if future.cancelled():
            _left += 1

    def settle(value: Any, error: BaseException | None) -> None:
        global _left
        if future.cancelled():  # the episode ended without it (timeout): nothing waits
            _left -= 1
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def run() -> None:
        value, error = None, None
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                if inspect.iscoroutine(value):
                    value.close()  # never awaited: say so instead of a warning at exit
                raise TypeError(
                    "it is a plain function that returned an awaitable; declare it "
                    "`async def` to run on the event loop"
                )
        except Exception as exc:
            error = exc
        except BaseException as exc:  # SystemExit from an agent must not end the run
            error = RuntimeError(f"{type(exc).__name__}: {exc}")
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:
            pass  # the loop has closed: the run is over

    try:
        threading.Thread(target=run, name=name, daemon=True).start()
    except RuntimeError as exc:  # the system's thread limit
        future.set_exception(RuntimeError(f"could not be started in a thread: {exc}"))
        return future
    future.add_done_callback(abandoned)
    return future
