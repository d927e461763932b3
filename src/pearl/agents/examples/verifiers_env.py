"""Environments of verifiers (Prime Intellect's library, ``verifiers==0.4.0``), unmodified,
trained through the endpoint; by default its TextArena Hangman game::

    bash scripts/verifiers_env.sh   # .venv-verifiers: verifiers[ta], uv, nltk's word lists
    pearl train env.name=agent env.options.agent=pearl.agents.examples.verifiers_env:solve

verifiers pins ``openai<3`` and ``mcp==2.0.0``; PEARL's venv has openai 3 (the Agents SDK
example needs it), so verifiers runs in a venv of its own and each episode is a process:
this file, run by that venv's Python, loads the environment (``verifiers.v1``'s
``load_environment``), runs one episode of task ``seed`` with PEARL's endpoint as the model
(``EvalClientConfig``: the harness's requests are forwarded as they are) and prints its
result; ``solve`` starts it and returns that result. The file imports only the standard
library at the top, so both venvs load it.

The player is verifiers' ``null`` harness (a plain chat loop, no tools and no context
compaction) in a ``subprocess`` runtime (not Prime's remote sandbox): it resends the whole
conversation on every call, so the endpoint sees one conversation and trains its exact
tokens. A harness that rewrites its history (``bash`` compacts by default) still trains,
as several segments. The harness is a PEP 723 script that verifiers sets up with ``uv`` on
first use (from PyPI, then uv's cache).

Tasks: the episode plays the task at position ``task_index(seed)`` of the taskset's
``load()``. Training seeds use the first ``train_tasks`` positions, held-out seeds
(``HELDOUT_START`` and up) those after them, so no held-out task is a training one. The
reward is the sum of the episode's weighted rewards (TextArena: 1 for a won game, else the
share of the word uncovered); success is a reward of at least ``success_reward``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

VENV = ".venv-verifiers"  # made by scripts/verifiers_env.sh, at the repository root
DEFAULT_ENV: dict[str, Any] = {"taskset": {"id": "textarena", "game": "Hangman-v0"}}
# The player PEARL needs: a harness that resends its history as it is, run on this machine.
PLAYER: dict[str, Any] = {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}
INFINITE_TRAIN_TASKS = 1000  # training positions of an endless taskset (TextArena's games)
STOP_GRACE_S = 3.0  # how long a stopped episode process may take to clean up
API_KEY_VAR = "PEARL_API_KEY"  # the variable verifiers' client reads the key from
RESULT_PREFIX = "pearl-verifiers-result "


class VerifiersEpisodeError(RuntimeError):
    """The episode process failed: the environment raised, or it found no result."""


def task_index(seed: int, heldout_start: int, train_tasks: int, size: int | None) -> int:
    """The position in the taskset of PEARL's task ``seed``: training seeds (below
    ``heldout_start``, and the extra rounds from ``2 * heldout_start``) cycle over the first
    ``train_tasks`` positions, held-out seeds over the rest (``size`` tasks in all; None: no
    end)."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if size is not None and not 0 < train_tasks < size:
        raise ValueError(
            f"train_tasks must be between 1 and {size - 1} (the taskset has {size} tasks, "
            f"some held out), got {train_tasks}"
        )
    if heldout_start <= seed < 2 * heldout_start:
        k = seed - heldout_start
        return train_tasks + (k if size is None else k % (size - train_tasks))
    return seed % heldout_start % train_tasks


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merged(out[key], value)
            if isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
            else value
        )
    return out


# -- PEARL's side ---------------------------------------------------------------------------
def _venv_python(python: str | None) -> str:
    if python is not None:
        return python
    if (env := os.environ.get("PEARL_VERIFIERS_PYTHON")) is not None:
        return env
    root = Path(__file__).resolve().parents[4]  # src/pearl/agents/examples/ -> the repository
    candidate = root / VENV / "bin" / "python"
    if not candidate.exists():
        raise VerifiersEpisodeError(
            f"no verifiers environment at {candidate.parent.parent}: run "
            "`bash scripts/verifiers_env.sh`, or set env.options.kwargs.python (or "
            "PEARL_VERIFIERS_PYTHON) to a Python with verifiers==0.4.0"
        )
    return str(candidate)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the episode process (it cancels its episode, which stops the harness), then
    SIGKILL its process group if it is still there after ``STOP_GRACE_S``."""
    if proc.returncode is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
    except (TimeoutError, ProcessLookupError):
        pass
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # start_new_session: its group id is its pid
        except ProcessLookupError:
            pass
        await proc.wait()


async def solve(
    seed: int,
    client: Any,
    env: Mapping[str, Any] | None = None,
    train_tasks: int | None = None,
    success_reward: float = 1.0,
    python: str | None = None,
    timeout_s: float = 900.0,
) -> dict:
    """One verifiers episode on task ``seed``: ``{"reward", "success"}``, with the task's
    name, the turns and the traces' ``info`` (TextArena: ``game_outcome``). ``env``: verifiers'
    environment config, merged over Hangman's (``{"taskset": {"id": ..., ...}}``; the player
    is the ``null`` harness in a ``subprocess`` runtime unless set); ``train_tasks``: the
    training positions (default: 1000 of an endless taskset, 90% of a finite one);
    ``python``: the verifiers venv's interpreter; ``timeout_s``: a bound of its own on the
    process, which PEARL's episode timeout usually ends first."""
    from pearl.envs.base import HELDOUT_START  # PEARL's venv only

    config = _merged({**DEFAULT_ENV, "player": PLAYER}, env or {})
    argv = [
        _venv_python(python),
        str(Path(__file__).resolve()),
        f"--seed={seed}",
        f"--heldout-start={HELDOUT_START}",
        f"--base-url={client.base_url}",
        f"--model={client.model}",
        f"--env={json.dumps(config)}",
        f"--success-reward={success_reward}",
    ]
    if train_tasks is not None:
        argv.append(f"--train-tasks={train_tasks}")
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
        start_new_session=True,  # its own group: stopped with whatever it started
        env={**os.environ, API_KEY_VAR: client.api_key},
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        raise VerifiersEpisodeError(
            f"the verifiers episode took more than {timeout_s:g} s"
        ) from None
    finally:
        await _stop(proc)  # a cancelled episode (PEARL's timeout or budget) lands here too
    lines = [line for line in out.decode().splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        tail = err.decode(errors="replace").strip()[-2000:]
        raise VerifiersEpisodeError(
            f"the verifiers episode process exited with {proc.returncode}: {tail or '(no output)'}"
        )
    result = json.loads(lines[-1].removeprefix(RESULT_PREFIX))
    if result["errors"]:
        raise VerifiersEpisodeError(
            f"verifiers episode on {result['task']} failed: {'; '.join(result['errors'])}"
        )
    return {key: result[key] for key in ("reward", "success", "task", "turns", "info")}


# -- the episode process (verifiers' venv) --------------------------------------------------
def _offline_nltk() -> None:
    """nltk.download returns at once for data already present (TextArena's games call it at
    import and on load; offline it would try GitHub each time and print its failure)."""
    import nltk  # verifiers' venv only

    download = nltk.download

    def download_unless_present(info_or_id: Any = None, *args: Any, **kwargs: Any) -> Any:
        for kind in ("corpora", "taggers", "tokenizers"):
            try:
                nltk.data.find(f"{kind}/{info_or_id}")
                return True
            except (LookupError, TypeError):
                continue
        return download(info_or_id, *args, **kwargs)

    nltk.download = download_unless_present


async def run_episode(args: argparse.Namespace) -> dict:
    """One episode of ``args.env`` on the task of ``args.seed``; its result as JSON-able."""
    import verifiers.v1 as vf  # verifiers' venv only
    from verifiers.v1.utils.loaders import (
        load_environment,
        resolve_env_config,
    )  # verifiers' venv only

    environment = load_environment(resolve_env_config(json.loads(args.env)))
    taskset = environment.taskset
    size = None if taskset.bounded is False else sum(1 for _ in taskset)
    train_tasks = args.train_tasks or (
        INFINITE_TRAIN_TASKS if size is None else max(1, size - max(1, size // 10))
    )
    index = task_index(args.seed, args.heldout_start, train_tasks, size)
    select = vf.SelectConfig(include=vf.TaskMatchConfig(idx=[index]))
    task = next(iter(taskset.select(select)))
    model = vf.ModelContext(
        model=args.model,
        client=vf.EvalClientConfig(base_url=args.base_url, api_key_var=API_KEY_VAR),
    )
    async with environment.serving():
        episode = await environment.run_episode(task, model)
    reward = sum(trace.reward for trace in episode.traces)
    errors = [f"{e.type}: {e.message}" for e in episode.errors]
    if not episode.ok and not errors:
        errors = ["the episode did not complete (no error recorded)"]
    return {
        "reward": reward,
        "success": episode.ok and reward >= args.success_reward,
        "task": task.data.name or f"#{index}",
        "index": index,
        "turns": episode.num_turns,
        "errors": errors,
        "info": [json.loads(json.dumps(dict(trace.info), default=str)) for trace in episode.traces],
    }


async def _main_async(args: argparse.Namespace) -> dict:
    # SIGTERM (solve stopping it) cancels the episode, so verifiers stops its harness.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await run_episode(args)


def main() -> None:
    parser = argparse.ArgumentParser(description="one verifiers episode against PEARL's endpoint")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--heldout-start", type=int, required=True)
    parser.add_argument("--train-tasks", type=int, default=None)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--env", default=json.dumps({**DEFAULT_ENV, "player": PLAYER}))
    parser.add_argument("--success-reward", type=float, default=1.0)
    args = parser.parse_args()
    # The venv's bin holds uv, which verifiers runs to set up the harness; its nltk_data the
    # word lists scripts/verifiers_env.sh built.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    os.environ.setdefault("NLTK_DATA", os.path.join(sys.prefix, "nltk_data"))
    _offline_nltk()
    result = asyncio.run(_main_async(args))
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
