import json

import pytest

from pearl.errors import PearlError, TraceFormatError
from pearl.workloads.agentic import generate_batch
from pearl.workloads.profiles import get_profile
from pearl.workloads.traces import (
    dumps_rollout_trace,
    load_rollout_trace,
    loads_rollout_trace,
    save_rollout_trace,
)


@pytest.fixture(scope="module")
def batch():
    return generate_batch(get_profile("swe_thinking"), num_tasks=2, group_size=3, seed=4)


def test_batch_round_trips_through_a_file(tmp_path, batch):
    path = tmp_path / "rollout.jsonl"
    save_rollout_trace(batch, path)
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + batch.num_trajectories
    header = json.loads(lines[0])
    assert header["format"] == "pearl.rollout" and header["version"] == 1
    assert load_rollout_trace(path) == batch


def test_loose_trajectories_round_trip_with_their_peak_as_cap(batch):
    trajs = batch.groups[1].trajectories
    loaded = loads_rollout_trace(dumps_rollout_trace(trajs))
    assert loaded.trajectories == trajs
    assert loaded.max_context_tokens == max(t.peak_context_tokens for t in trajs)
    assert loaded.profile_name == "" and loaded.seed is None


def test_blank_lines_are_skipped_and_groups_follow_first_appearance(batch):
    header, *rows = dumps_rollout_trace(batch).splitlines()
    text = "\n".join([header, "", *reversed(rows), "  "])
    loaded = loads_rollout_trace(text)
    # Groups come in order of first appearance; within a group, by index_in_group.
    assert loaded.groups == tuple(reversed(batch.groups))


def _corrupt(text, line_index, change):
    lines = text.splitlines()
    record = json.loads(lines[line_index])
    change(record)
    lines[line_index] = json.dumps(record)
    return "\n".join(lines)


def _set_turn(turn, field, value):
    def change(record):
        record["turns"][turn][field] = value

    return change


CASES = {
    "missing field": (lambda r: r.pop("task_id"), "task_id", "missing"),
    "negative tokens": (
        _set_turn(2, "observation_tokens", -4),
        "turns.2.observation_tokens",
        "greater than",
    ),
    "zero response": (
        _set_turn(0, "response_tokens", 0),
        "turns.0.response_tokens",
        "greater than",
    ),
    "string for int": (_set_turn(1, "response_tokens", "12"), "turns.1.response_tokens", "integer"),
    "float for int": (
        _set_turn(1, "observation_tokens", 7.5),
        "turns.1.observation_tokens",
        "integer",
    ),
    "kept over response": (
        _set_turn(1, "response_tokens_kept", 10**6),
        "turns.1.response_tokens_kept",
        "<= response_tokens",
    ),
    "negative latency": (
        _set_turn(1, "env_latency_s", -1.0),
        "turns.1.env_latency_s",
        "greater than",
    ),
    "bad stop": (lambda r: r.update(stop="crashed"), "stop", "'done'"),
    "unknown field": (lambda r: r.update(tokens=3), "tokens", "Extra inputs"),
    "no turns": (lambda r: r.update(turns=[]), "turns", "at least 1"),
    "turns not a list": (lambda r: r.update(turns={}), "turns", "array"),
    "prefix over prompt": (
        lambda r: r.update(shared_prefix_tokens=10**6),
        "turns",
        "shared_prefix",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_malformed_trajectory_lines_name_file_line_and_field(tmp_path, batch, case):
    change, field, message = CASES[case]
    path = tmp_path / "bad.jsonl"
    path.write_text(_corrupt(dumps_rollout_trace(batch), 3, change))
    with pytest.raises(TraceFormatError) as info:
        load_rollout_trace(path)
    text = str(info.value)
    assert text.startswith(f"{path}:4: field {field}:"), text
    assert message in text
    assert isinstance(info.value, PearlError) and isinstance(info.value, ValueError)


def test_invalid_json_names_the_line(batch):
    lines = dumps_rollout_trace(batch).splitlines()
    lines[2] = lines[2][:-5]
    with pytest.raises(TraceFormatError, match=r"^t\.jsonl:3: field \(line\): Invalid JSON"):
        loads_rollout_trace("\n".join(lines), "t.jsonl")


@pytest.mark.parametrize(
    "header, field",
    [
        ({"format": "other", "version": 1, "max_context_tokens": 10}, "format"),
        ({"format": "pearl.rollout", "version": 2, "max_context_tokens": 10}, "version"),
        ({"format": "pearl.rollout", "version": 1}, "max_context_tokens"),
    ],
)
def test_bad_headers_are_reported_on_line_1(header, field):
    with pytest.raises(TraceFormatError, match=rf"^h\.jsonl:1: field {field}:"):
        loads_rollout_trace(json.dumps(header) + "\n", "h.jsonl")


def test_empty_and_header_only_traces_are_rejected(batch):
    with pytest.raises(TraceFormatError, match=r"^e\.jsonl:1: field format: empty trace"):
        loads_rollout_trace("\n\n", "e.jsonl")
    header = dumps_rollout_trace(batch).splitlines()[0]
    with pytest.raises(TraceFormatError, match="no trajectories"):
        loads_rollout_trace(header, "e.jsonl")


def test_group_consistency_is_checked(batch):
    text = dumps_rollout_trace(batch)
    # Line 3 is task 0's second trajectory: give it a different prompt than its sibling.
    bad = _corrupt(text, 2, lambda r: r["turns"][0].update(observation_tokens=3_000))
    with pytest.raises(
        TraceFormatError, match=r"^g:3: field turns\.0\.observation_tokens: siblings"
    ):
        loads_rollout_trace(bad, "g")
    dup = _corrupt(text, 2, lambda r: r.update(index_in_group=0))
    with pytest.raises(TraceFormatError, match=r"^g:\d+: field index_in_group: task"):
        loads_rollout_trace(dup, "g")
    small = _corrupt(text, 0, lambda r: r.update(max_context_tokens=100))
    with pytest.raises(TraceFormatError, match=r"^g:2: field turns: .*over the header's"):
        loads_rollout_trace(small, "g")


def test_non_utf8_file_is_a_trace_format_error(tmp_path):
    path = tmp_path / "binary.jsonl"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceFormatError, match="not UTF-8"):
        load_rollout_trace(path)


def test_a_missing_or_directory_trace_is_one_clear_error(tmp_path):
    for path, why in [(tmp_path / "nope.jsonl", "No such file"), (tmp_path, "directory")]:
        with pytest.raises(TraceFormatError, match=f"cannot read the trace.*{why}"):
            load_rollout_trace(path)


def test_observation_window_round_trips_through_a_trace():
    import dataclasses

    from pearl.workloads.agentic import generate_batch
    from pearl.workloads.profiles import get_profile
    from pearl.workloads.traces import dumps_rollout_trace, loads_rollout_trace

    profile = dataclasses.replace(
        get_profile("tiny"), observation_window=2, collapsed_observation_tokens=4
    )
    batch = generate_batch(profile, 1, 2, seed=0)
    again = loads_rollout_trace(dumps_rollout_trace(batch))
    assert again.trajectories == batch.trajectories


def test_a_trajectory_beyond_the_engines_length_is_rejected_with_its_line(tmp_path, batch):
    path = tmp_path / "long.jsonl"
    save_rollout_trace(batch, path)
    peaks = [t.peak_context_tokens for t in batch.trajectories]
    limit = sorted(peaks)[-1] - 1  # the longest trajectory is over it: rejected, the rest fit
    with pytest.raises(
        TraceFormatError, match=r"long\.jsonl:\d+: field turns: .*max_model_len of"
    ) as exc:
        load_rollout_trace(path, max_model_len=limit)
    line = int(str(exc.value).split(".jsonl:", 1)[1].split(":", 1)[0])
    record = json.loads(path.read_text().splitlines()[line - 1])
    assert "turns" in record  # the line of the offending trajectory, not the header
    # Exactly max_model_len tokens is valid (truncated at the cap: the common RL case).
    assert load_rollout_trace(path, max_model_len=limit + 1).num_trajectories == len(peaks)
