"""Deterministic token ids of a workload's contexts: in (seed, task, trajectory, turn);
siblings of a group share the initial prompt token for token, and all tasks of a workload
share the system/tool prefix, so prefix caching behaves as in real runs."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence

from pearl.errors import WorkloadError
from pearl.token_runs import TokenRuns, id_pool, id_walk
from pearl.workloads.batch import Trajectory, _is_int

__all__ = ["id_pool", "id_walk"]  # re-exported: their home is pearl.token_runs

_SHARED, _TASK, _OBSERVATION, _RESPONSE = 0, 1, 2, 3


@functools.lru_cache(maxsize=65536)  # a batch's few task ids, asked twice every turn
def _task_key(task_id: str) -> int:
    # A stable hash (Python's hash() of a str is salted per process).
    return int.from_bytes(hashlib.blake2b(task_id.encode(), digest_size=8).digest(), "little")


def _walk_start(vocab_size: int, first_id: int, entropy: list[int]) -> int:
    if not (_is_int(vocab_size) and _is_int(first_id) and 0 <= first_id < vocab_size):
        raise WorkloadError(
            f"token ids need ints 0 <= first_id < vocab_size, got first_id={first_id!r} "
            f"vocab_size={vocab_size!r}"
        )
    # A keyed walk through one fixed random permutation of the id range: as random-looking
    # as fresh draws, distinct keys give sequences that differ at every position, and a
    # list slice costs ~1/15 of seeding a numpy Generator per call (which was ~10% of a
    # simulated RL run).
    digest = hashlib.blake2b(repr(entropy).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _ids(n: int, vocab_size: int, first_id: int, entropy: list[int]) -> list[int]:
    start = _walk_start(vocab_size, first_id, entropy)
    return id_walk(vocab_size, first_id, start, n) if n else []


def _runs(n: int, vocab_size: int, first_id: int, entropy: list[int]) -> TokenRuns:
    """``_ids`` as one run (``pearl.token_runs``)."""
    return TokenRuns.walk(vocab_size, first_id, _walk_start(vocab_size, first_id, entropy), n)


def shared_prefix_token_ids(
    num_tokens: int, vocab_size: int, seed: int = 0, first_id: int = 0
) -> list[int]:
    """The system/tool prefix shared by every task: ``num_tokens`` ids in [first_id, vocab_size)."""
    return _ids(num_tokens, vocab_size, first_id, [seed, _SHARED])


def _turn_index(trajectory: Trajectory, turn_index: int) -> None:
    if not 0 <= turn_index < trajectory.num_turns:
        raise WorkloadError(
            f"turn_index {turn_index} out of range [0, {trajectory.num_turns}) for trajectory "
            f"{trajectory.task_id}/{trajectory.index_in_group}"
        )


def observation_token_ids(
    trajectory: Trajectory,
    turn_index: int,
    vocab_size: int,
    seed: int = 0,
    first_id: int = 0,
    as_runs: bool = False,
) -> list[int] | TokenRuns:
    """Token ids of turn ``turn_index``'s observation; turn 0 gives the task's initial prompt.

    Deterministic in (seed, task_id, index_in_group, turn); the prompt depends only on
    (seed, task_id), so siblings share it, and its shared prefix only on ``seed``. With
    ``as_runs`` the same ids as ``TokenRuns`` (the simulator's contexts).
    """
    _turn_index(trajectory, turn_index)
    ids = _runs if as_runs else _ids
    n = trajectory.turns[turn_index].observation_tokens
    if turn_index == 0:
        shared = trajectory.shared_prefix_tokens
        task = [seed, _TASK, _task_key(trajectory.task_id)]
        return ids(shared, vocab_size, first_id, [seed, _SHARED]) + ids(
            n - shared, vocab_size, first_id, task
        )
    key = [seed, _OBSERVATION, _task_key(trajectory.task_id), trajectory.index_in_group, turn_index]
    return ids(n, vocab_size, first_id, key)


def response_token_ids(
    trajectory: Trajectory, turn_index: int, vocab_size: int, seed: int = 0, first_id: int = 0
) -> list[int]:
    """Synthetic stand-in ids for turn ``turn_index``'s response (replay without a model)."""
    _turn_index(trajectory, turn_index)
    key = [seed, _RESPONSE, _task_key(trajectory.task_id), trajectory.index_in_group, turn_index]
    return _ids(trajectory.turns[turn_index].response_tokens, vocab_size, first_id, key)


def context_token_ids(
    trajectory: Trajectory,
    turn_index: int,
    vocab_size: int,
    seed: int = 0,
    first_id: int = 0,
    responses: Sequence[Sequence[int]] | None = None,
) -> list[int]:
    """The full prompt of turn ``turn_index``'s generation: observations and kept responses so far.

    ``responses[k]`` are the ids actually generated in turn k (a live run); without them
    :func:`response_token_ids` stand in. Each kept response is its last ``response_tokens_kept`` ids.
    """
    _turn_index(trajectory, turn_index)
    ids: list[int] = []
    for k in range(turn_index + 1):
        if k:
            turn = trajectory.turns[k - 1]
            if responses is not None:
                if len(responses) < k or len(responses[k - 1]) != turn.response_tokens:
                    got = len(responses[k - 1]) if len(responses) >= k else None
                    raise WorkloadError(
                        f"responses[{k - 1}] must hold {turn.response_tokens} ids for trajectory "
                        f"{trajectory.task_id}/{trajectory.index_in_group}, got {got}"
                    )
                previous = list(responses[k - 1])
            else:
                previous = response_token_ids(trajectory, k - 1, vocab_size, seed, first_id)
            ids.extend(previous[len(previous) - turn.response_tokens_kept :])
        observation = observation_token_ids(trajectory, k, vocab_size, seed, first_id)
        ids.extend(observation[: trajectory.observation_shown(k, turn_index)])
    return ids
