import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.errors import ConfigError, PearlError, TraceFormatError, WorkloadError
from pearl.workloads.availability import (
    SEGMENTS,
    AvailabilityTrace,
    ChangeModel,
    SyntheticAvailability,
    TimeUnit,
    dumps_availability,
    load_availability,
    load_segment,
    load_shipped,
    parse_availability,
    save_availability,
    shipped_files,
    synthetic_availability,
)

BAMBOO_STYLE = "0,2\n100,2\n100,5\n250,5\n250,1\n400,1\n"


def test_bamboo_pairs_form_a_right_continuous_step_function():
    trace = parse_availability(BAMBOO_STYLE, "b.csv")
    assert trace.times_s == (0.0, 100.0, 250.0) and trace.values == (2, 5, 1)
    assert trace.end_s == 400.0 and trace.duration_s == 400.0
    assert trace.value_at(0) == 2
    assert trace.value_at(99.999) == 2
    assert trace.value_at(100) == 5  # at a jump, the new value
    assert trace.value_at(250) == 1
    assert trace.value_at(10_000) == 1  # the last value holds after the data
    assert trace.changes() == ((100.0, 5), (250.0, 1))
    with pytest.raises(WorkloadError, match="before the trace starts"):
        trace.value_at(-1)


def test_mean_is_time_weighted():
    trace = parse_availability(BAMBOO_STYLE)
    assert trace.mean() == pytest.approx((2 * 100 + 5 * 150 + 1 * 150) / 400)
    assert trace.mean(50, 150) == pytest.approx((2 * 50 + 5 * 50) / 100)
    assert trace.mean(120, 120) == 5
    with pytest.raises(WorkloadError, match="before start_s"):
        trace.mean(200, 100)


def test_window_is_rebased_and_excludes_a_change_at_its_end():
    trace = parse_availability(BAMBOO_STYLE)
    win = trace.window(50, 200)  # [50, 250): the jump at 250 belongs to the next window
    assert win.times_s == (0.0, 50.0) and win.values == (2, 5) and win.end_s == 200.0
    assert win.mean() == pytest.approx(trace.mean(50, 250))
    assert trace.window(100, 100).values == (5,)
    with pytest.raises(WorkloadError, match="within the data"):
        trace.window(300, 200)


def test_windows_tile_the_changes():
    trace = parse_availability(BAMBOO_STYLE)
    first, second = trace.window(0, 250), trace.window(250, 150)
    # The change at 250 is the second window's start value, not a change in either window.
    assert first.changes() == ((100.0, 5),) and second.changes() == ()
    assert second.values == (1,)


def test_scale_and_cap():
    trace = parse_availability("0,12\n10,7\n20,3\n30,3\n")
    assert trace.cap(8).values == (8, 7, 3)
    assert trace.cap(2).values == (2,)  # equal neighbours merge
    assert trace.scale(0.5).values == (6, 3, 1)  # whole TP2 groups
    assert trace.scale(1 / 3).values == (4, 2, 1)
    assert trace.scale(2).values == (24, 14, 6)
    with pytest.raises(WorkloadError, match="max_value"):
        trace.cap(-1)


def test_header_declares_the_unit_and_hours_are_converted():
    hours = parse_availability("time_h,available\n0,3\n0.5,4\n1.25,4\n")
    assert hours.times_s == (0.0, 1800.0) and hours.end_s == 4500.0
    bare = parse_availability("0.000,0\n0.030,0\n0.030,9\n", time_unit=TimeUnit.HOURS)
    assert bare.times_s == (0.0, pytest.approx(108.0)) and bare.values == (0, 9)
    assert parse_availability("# comment\ntime,available\n0,1\n5,2\n", time_unit="min").end_s == 300
    with pytest.raises(ConfigError, match="time_unit 'days' is not one of s, min, h"):
        parse_availability("0,1\n", "x", time_unit="days")
    with pytest.raises(TraceFormatError, match=r"^x:1: field header: declares unit 'h'"):
        parse_availability("time_h,available\n0,1\n", "x", time_unit="s")


@pytest.mark.parametrize(
    "text, line, field, message",
    [
        ("0,1\n10,2\n5,3\n", 3, "time", "must not decrease"),
        ("0,1\n10,-2\n", 2, "available", ">= 0"),
        ("0,1\n10,2.5\n", 2, "available", "whole number"),
        ("0,1\nten,2\n", 2, "time", "not a number"),
        ("0,1\n-3,2\n", 2, "time", ">= 0"),
        ("0,1\n10,2,3\n", 2, r"\(line\)", "2 comma-separated"),
        ("0,1\ninf,2\n", 2, "time", "finite"),
        ("time_s,avail\n0,1\n", 1, "header", "expected 'time_s,available'"),
        ("0,1\ntime_s,available\n", 2, "time", "not a number"),
        ("# only a comment\n\n", 1, r"\(file\)", "no 'time,available'"),
    ],
)
def test_malformed_availability_files_name_file_line_and_field(
    tmp_path, text, line, field, message
):
    path = tmp_path / "avail.csv"
    path.write_text(text)
    with pytest.raises(
        TraceFormatError, match=rf"^{path}:{line}: field {field}: .*{message}"
    ) as info:
        load_availability(path)
    assert isinstance(info.value, PearlError) and isinstance(info.value, ValueError)


def test_trace_values_are_validated():
    with pytest.raises(WorkloadError, match="increase strictly"):
        AvailabilityTrace((0.0, 0.0), (1, 2), 1.0)
    with pytest.raises(WorkloadError, match="repeats"):
        AvailabilityTrace((0.0, 1.0), (1, 1), 2.0)
    with pytest.raises(WorkloadError, match="end_s"):
        AvailabilityTrace((0.0, 5.0), (1, 2), 4.0)
    with pytest.raises(WorkloadError, match="int >= 0"):
        AvailabilityTrace((0.0,), (-1,), 4.0)
    assert AvailabilityTrace.constant(4, 100.0).mean() == 4.0


def test_csv_round_trip(tmp_path):
    trace = synthetic_availability(SyntheticAvailability(duration_s=1000.5), seed=3)
    assert parse_availability(dumps_availability(trace), trace.source) == trace
    path = tmp_path / "a.csv"
    save_availability(trace, path)
    assert load_availability(path).values == trace.values


def test_shipped_files_are_the_bamboo_g4dn_traces():
    assert shipped_files() == (
        "aws-g4dn-xlarge-us-east-1c-2020-11-20.csv",
        "aws-g4dn-xlarge-us-east-1d-2020-11-23.csv",
    )
    spans = {name: load_shipped(name) for name in shipped_files()}
    assert [round(t.duration_s / 3600, 1) for t in spans.values()] == [24.5, 12.7]
    assert all(t.max_value == 12 and t.min_value == 0 for t in spans.values())
    with pytest.raises(ConfigError, match="valid: aws-g4dn"):
        load_shipped("missing.csv")


@pytest.mark.parametrize("name", ["segment1", "segment2", "segment3"])
def test_segments_match_the_readme(name):
    seg = SEGMENTS[name]
    trace = load_segment(name)
    assert trace.start_s == 0.0 and trace.duration_s == 7_200
    assert 0 <= trace.min_value and trace.max_value <= 12
    # README: "mean with 4 reserved" and "changes in window" (value changes after the start).
    assert trace.mean() + seg.reserved_gpus == pytest.approx(
        seg.reference_mean_with_reserved, abs=0.01
    )
    assert len(trace.changes()) == seg.reference_changes
    assert trace.source == name


def test_segment_reference_numbers():
    assert {
        n: (s.reference_mean_with_reserved, s.reference_changes) for n, s in SEGMENTS.items()
    } == {
        "segment1": (13.59, 16),
        "segment2": (8.94, 15),
        "segment3": (11.56, 14),
    }
    with pytest.raises(ConfigError, match="valid: segment1"):
        load_segment("segment4")


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    model=st.sampled_from(list(ChangeModel)),
    top=st.integers(1, 16),
    interval=st.floats(10, 2_000),
)
def test_synthetic_traces_stay_in_bounds_and_are_deterministic(seed, model, top, interval):
    config = SyntheticAvailability(
        duration_s=3_600,
        max_available=top,
        mean_change_interval_s=interval,
        model=model,
        low_level=0,
        high_level=top,
    )
    trace = synthetic_availability(config, seed)
    assert trace == synthetic_availability(config, seed)
    assert 0 <= trace.min_value and trace.max_value <= top
    assert trace.start_s == 0.0 and trace.end_s == 3_600
    if model is ChangeModel.TWO_LEVEL:
        assert set(trace.values) <= {0, top}
    if model is ChangeModel.RANDOM_WALK:
        steps = [abs(b - a) for a, b in zip(trace.values, trace.values[1:], strict=False)]
        assert all(1 <= s <= config.max_step for s in steps)


def test_synthetic_change_rate_and_seed_sensitivity():
    config = SyntheticAvailability()  # two hours, 12 instances, one change per 450 s
    counts = [len(synthetic_availability(config, seed).changes()) for seed in range(200)]
    assert sum(counts) / len(counts) == pytest.approx(16, abs=1.0)
    assert synthetic_availability(config, 1) != synthetic_availability(config, 2)
    fixed = synthetic_availability(SyntheticAvailability(initial=7), seed=5)
    assert fixed.values[0] == 7
    with pytest.raises(ConfigError, match="high_level"):
        SyntheticAvailability(max_available=8, high_level=10, model=ChangeModel.TWO_LEVEL)
    # The levels only matter to the two-level model; other models ignore them.
    SyntheticAvailability(max_available=8, high_level=10, model=ChangeModel.JUMP)
