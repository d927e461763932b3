"""Rollout traces as JSONL: a header line, then one trajectory per line.

Line 1 is ``{"format": "pearl.rollout", "version": 1, "max_context_tokens": N,
"profile": "...", "seed": S}`` (profile and seed optional). Every other non-blank
line is one trajectory::

    {"task_id": "swe-s0-t0000", "index_in_group": 0, "shared_prefix_tokens": 2048,
     "env_setup_s": 3.2, "reward_latency_s": 28.0, "stop": "done",
     "observation_window": 5, "collapsed_observation_tokens": 16,    (optional)
     "turns": [{"observation_tokens": 2512, "response_tokens": 143,
                "response_tokens_kept": 143, "env_latency_s": 0.61}, ...]}

Trajectories of a task form its group, in ``index_in_group`` order (0..G-1). Files are
parsed as JSON and validated with pydantic, never executed or unpickled; any problem
raises :class:`~pearl.errors.TraceFormatError` naming the file, line and field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from pearl.errors import TraceFormatError, WorkloadError
from pearl.workloads.batch import RolloutBatch, StopReason, TaskGroup, Trajectory, Turn
from pearl.workloads.text_files import read_trace_text

__all__ = [
    "TRACE_FORMAT",
    "TRACE_VERSION",
    "dumps_rollout_trace",
    "load_rollout_trace",
    "loads_rollout_trace",
    "save_rollout_trace",
]

TRACE_FORMAT = "pearl.rollout"
TRACE_VERSION = 1

_NonNegInt = Annotated[int, Field(ge=0)]
_NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Record(BaseModel):
    # strict: "5" or 5.0 is not a token count; forbid: a misspelt field is an error, not ignored.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class _Header(_Record):
    format: Literal["pearl.rollout"]
    version: Literal[1]
    max_context_tokens: Annotated[int, Field(ge=2)]
    profile: str = ""
    seed: _NonNegInt | None = None


class _TurnRecord(_Record):
    observation_tokens: _NonNegInt
    response_tokens: Annotated[int, Field(ge=1)]
    response_tokens_kept: _NonNegInt
    env_latency_s: _NonNegFloat = 0.0

    @pydantic.field_validator("response_tokens_kept")
    @classmethod
    def _kept_within_response(cls, kept: int, info: pydantic.ValidationInfo) -> int:
        # response_tokens is declared first, so it is in info.data when it was valid.
        response = info.data.get("response_tokens")
        if response is not None and kept > response:
            raise ValueError(f"must be <= response_tokens ({response})")
        return kept


class _TrajectoryRecord(_Record):
    task_id: Annotated[str, Field(min_length=1)]
    index_in_group: _NonNegInt
    shared_prefix_tokens: _NonNegInt = 0
    env_setup_s: _NonNegFloat = 0.0
    reward_latency_s: _NonNegFloat = 0.0
    stop: StopReason = StopReason.DONE
    observation_window: Annotated[int, Field(ge=1)] | None = None
    collapsed_observation_tokens: _NonNegInt = 0
    turns: Annotated[list[_TurnRecord], Field(min_length=1)]


def _fail(source: str, line: int, field: str, message: str) -> TraceFormatError:
    return TraceFormatError(f"{source}:{line}: field {field}: {message}")


def _from_validation(source: str, line: int, exc: pydantic.ValidationError) -> TraceFormatError:
    first = exc.errors(include_url=False)[0]
    field = ".".join(str(p) for p in first["loc"]) or "(line)"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "missing":
        message = "required field is missing"
    elif first["type"] != "json_invalid" and "input" in first:
        message += f" (got {first['input']!r})"
    return _fail(source, line, field, message)


def _trajectory_dict(traj: Trajectory) -> dict[str, object]:
    return {
        "task_id": traj.task_id,
        "index_in_group": traj.index_in_group,
        "shared_prefix_tokens": traj.shared_prefix_tokens,
        "env_setup_s": traj.env_setup_s,
        "reward_latency_s": traj.reward_latency_s,
        "stop": traj.stop.value,
        **(
            {
                "observation_window": traj.observation_window,
                "collapsed_observation_tokens": traj.collapsed_observation_tokens,
            }
            if traj.observation_window is not None
            else {}
        ),
        "turns": [
            {
                "observation_tokens": t.observation_tokens,
                "response_tokens": t.response_tokens,
                "response_tokens_kept": t.response_tokens_kept,
                "env_latency_s": t.env_latency_s,
            }
            for t in traj.turns
        ],
    }


def dumps_rollout_trace(
    batch: RolloutBatch | Sequence[Trajectory], max_context_tokens: int | None = None
) -> str:
    """The JSONL text of a batch or of loose trajectories (whose header cap defaults to their peak)."""
    if isinstance(batch, RolloutBatch):
        header: dict[str, object] = {
            "format": TRACE_FORMAT,
            "version": TRACE_VERSION,
            "max_context_tokens": max_context_tokens or batch.max_context_tokens,
            "profile": batch.profile_name,
            "seed": batch.seed,
        }
        trajectories: Iterable[Trajectory] = batch.trajectories
    else:
        if not batch:
            raise WorkloadError("dumps_rollout_trace() needs at least one trajectory")
        header = {
            "format": TRACE_FORMAT,
            "version": TRACE_VERSION,
            "max_context_tokens": max_context_tokens or max(t.peak_context_tokens for t in batch),
        }
        trajectories = batch
    lines = [json.dumps(header, separators=(",", ":"))]
    lines += [json.dumps(_trajectory_dict(t), separators=(",", ":")) for t in trajectories]
    return "\n".join(lines) + "\n"


def save_rollout_trace(
    batch: RolloutBatch | Sequence[Trajectory],
    path: str | Path,
    max_context_tokens: int | None = None,
) -> None:
    """Write a batch (or trajectories) to ``path`` as JSONL; :func:`load_rollout_trace` reads it back equal."""
    Path(path).write_text(dumps_rollout_trace(batch, max_context_tokens), encoding="utf-8")


def load_rollout_trace(path: str | Path, max_model_len: int | None = None) -> RolloutBatch:
    """Read and validate a JSONL rollout trace; raises TraceFormatError with file:line: field
    (also for a trajectory longer than ``max_model_len`` tokens, which no engine runs)."""
    path = Path(path)
    text = read_trace_text(path, "workload.trace must name a JSONL rollout trace file")
    return loads_rollout_trace(text, source=str(path), max_model_len=max_model_len)


def loads_rollout_trace(
    text: str, source: str = "<string>", max_model_len: int | None = None
) -> RolloutBatch:
    """Parse JSONL text into a RolloutBatch; ``source`` names the file in error messages."""
    header: _Header | None = None
    header_line = 0
    # task_id -> [(line, trajectory)], in order of first appearance
    by_task: dict[str, list[tuple[int, Trajectory]]] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if header is None:
            try:
                header = _Header.model_validate_json(raw)
            except pydantic.ValidationError as exc:
                raise _from_validation(source, number, exc) from None
            header_line = number
            continue
        traj = _parse_trajectory(source, number, raw)
        _check_context(source, number, traj, header, header_line, max_model_len)
        by_task.setdefault(traj.task_id, []).append((number, traj))
    if header is None:
        raise _fail(source, 1, "format", f"empty trace; expected a {TRACE_FORMAT!r} header line")
    if not by_task:
        raise _fail(source, header_line, "(file)", "the trace holds no trajectories")
    groups = [_task_group(source, task_id, members) for task_id, members in by_task.items()]
    return RolloutBatch(tuple(groups), header.max_context_tokens, header.profile, header.seed)


def _parse_trajectory(source: str, number: int, raw: str) -> Trajectory:
    """Validate trajectory line ``number`` (text ``raw``) and build its Trajectory;
    raises TraceFormatError naming the line and field."""
    try:
        record = _TrajectoryRecord.model_validate_json(raw)
    except pydantic.ValidationError as exc:
        raise _from_validation(source, number, exc) from None
    try:
        return Trajectory(
            task_id=record.task_id,
            index_in_group=record.index_in_group,
            turns=tuple(
                Turn(
                    t.observation_tokens,
                    t.response_tokens,
                    t.response_tokens_kept,
                    t.env_latency_s,
                )
                for t in record.turns
            ),
            shared_prefix_tokens=record.shared_prefix_tokens,
            env_setup_s=record.env_setup_s,
            reward_latency_s=record.reward_latency_s,
            stop=record.stop,
            observation_window=record.observation_window,
            collapsed_observation_tokens=record.collapsed_observation_tokens,
        )
    except WorkloadError as exc:
        raise _fail(source, number, "turns", str(exc)) from None


def _check_context(
    source: str,
    number: int,
    traj: Trajectory,
    header: _Header,
    header_line: int,
    max_model_len: int | None,
) -> None:
    """Raise TraceFormatError if ``traj`` (on line ``number``) peaks over the header's
    max_context_tokens or over ``max_model_len`` (a sequence of exactly max_model_len tokens
    is valid: the last sampled token's KV is never computed, as in vLLM)."""
    if traj.peak_context_tokens > header.max_context_tokens:
        raise _fail(
            source,
            number,
            "turns",
            f"the trajectory reaches {traj.peak_context_tokens} tokens, over the header's "
            f"max_context_tokens {header.max_context_tokens} (line {header_line})",
        )
    if max_model_len is not None and traj.peak_context_tokens > max_model_len:
        raise _fail(
            source,
            number,
            "turns",
            f"the trajectory reaches {traj.peak_context_tokens} tokens, over the engine's "
            f"max_model_len of {max_model_len} (sim.max_model_len): raise it or shorten the turn",
        )


def _task_group(source: str, task_id: str, members: list[tuple[int, Trajectory]]) -> TaskGroup:
    """Sort a task's ``(line, trajectory)`` members by index_in_group (in place) and check they
    form a group (indices 0..G-1, one prompt and prefix); raises TraceFormatError otherwise."""
    members.sort(key=lambda m: m[1].index_in_group)
    first_line, first = members[0]
    for position, (number, traj) in enumerate(members):
        if traj.index_in_group != position:
            raise _fail(
                source,
                number,
                "index_in_group",
                f"task {task_id!r} needs indices 0..{len(members) - 1} once each; "
                f"got {traj.index_in_group} at position {position}",
            )
        if traj.prompt_tokens != first.prompt_tokens:
            raise _fail(
                source,
                number,
                "turns.0.observation_tokens",
                f"siblings share the initial prompt: {traj.prompt_tokens} here, "
                f"{first.prompt_tokens} on line {first_line}",
            )
        if traj.shared_prefix_tokens != first.shared_prefix_tokens:
            raise _fail(
                source,
                number,
                "shared_prefix_tokens",
                f"siblings share the prefix: {traj.shared_prefix_tokens} here, "
                f"{first.shared_prefix_tokens} on line {first_line}",
            )
    return TaskGroup(task_id, tuple(t for _, t in members))
