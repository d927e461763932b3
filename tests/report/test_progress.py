import io
import logging

import pytest

from pearl.report import progress
from pearl.report.progress import NORMAL, QUIET, VERBOSE, Progress, reset_logging, setup_logging


@pytest.fixture
def captured(monkeypatch):
    """A buffer standing for stderr (as under a pipe); call it in the test body, where
    pytest's own capture has already swapped the stream it patches."""
    stream = io.StringIO()

    def install() -> io.StringIO:
        monkeypatch.setattr(progress.sys, "stderr", stream)
        return stream

    yield install
    reset_logging()


def test_plain_lines_count_share_elapsed_and_eta(captured, monkeypatch):
    stream = captured()
    setup_logging(NORMAL)
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    with Progress(4, "runs") as bar:
        assert bar.eta_s() is None
        now[0] += 30
        bar.advance("a@segment1")
        assert bar.eta_s() == pytest.approx(90.0)  # 30 s per run so far, 3 left
        now[0] += 90
        bar.advance()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[1/4] 25% runs: a@segment1  elapsed 30s, ETA 1m30s"
    assert lines[1] == "[2/4] 50% runs  elapsed 2m00s, ETA 2m00s"


def test_quiet_shows_warnings_only_and_verbose_shows_debug_with_names(captured):
    stream = captured()
    setup_logging(QUIET)
    log = logging.getLogger("pearl.apps.experiment")
    with Progress(2, "runs") as bar:
        bar.advance("x")
    log.info("info line")
    log.warning("a warning")
    assert stream.getvalue() == "a warning\n"
    setup_logging(VERBOSE)
    log.debug("debug line")
    assert "DEBUG pearl.apps.experiment: debug line" in stream.getvalue()


def test_a_terminal_gets_a_live_bar_with_the_notes_above_it(monkeypatch):
    from rich.console import Console

    out = io.StringIO()
    monkeypatch.setattr(progress, "_interactive", lambda: True)
    monkeypatch.setitem(progress._state, "console", Console(file=out, force_terminal=True))
    setup_logging(NORMAL)
    try:
        with Progress(3, "simulated RL runs") as bar:
            bar.advance("roll@segment1 done")
            bar.advance()
    finally:
        reset_logging()
    text = out.getvalue()
    assert "simulated RL runs" in text and "2/3" in text and "ETA" in text
    assert "roll@segment1 done" in text
