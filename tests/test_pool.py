"""``pearl.processes.pool``: jobs in fresh processes; a dead process is reported with its job."""

from __future__ import annotations

import math
import operator
import os
import signal
import time

import pytest

from pearl.processes.pool import died_reason, run_in_processes


def test_answers_arrive_and_a_killed_or_exited_process_is_reported_with_its_job():
    jobs = [
        ("sqrt", (math.sqrt, 16.0)),
        ("killed", (signal.raise_signal, signal.SIGKILL)),  # as the out-of-memory killer does
        ("exited", (os._exit, 3)),
        ("slow", (operator.add, 2, 3)),
    ]
    answers, died = {}, {}
    start = time.monotonic()
    run_in_processes(operator.call, jobs, 2, answers.__setitem__, died.__setitem__)
    assert time.monotonic() - start < 60  # no hang
    assert answers == {"sqrt": 4.0, "slow": 5}
    assert set(died) == {"killed", "exited"}
    assert "SIGKILL" in died["killed"] and "out of memory" in died["killed"]
    assert "exited with code 3" in died["exited"]


def test_an_exception_in_a_job_is_raised_here_with_its_traceback_and_ends_the_rest():
    jobs = [("zero", (operator.truediv, 1, 0)), ("long", (time.sleep, 60))]
    start = time.monotonic()
    with pytest.raises(ZeroDivisionError) as exc:
        run_in_processes(operator.call, jobs, 2, lambda k, v: None, lambda k, w: None)
    assert time.monotonic() - start < 30  # the sleeping process was terminated
    assert any("process running zero" in note for note in exc.value.__notes__)


def test_processes_start_with_the_extra_environment_and_this_ones_is_left_as_it_was():
    answers: dict = {}
    before = dict(os.environ)
    extra = {"PEARL_TEST_POOL_ENV": "set", "HOME": "/elsewhere"}
    jobs = [("new", ("PEARL_TEST_POOL_ENV",)), ("home", ("HOME",))]
    run_in_processes(os.getenv, jobs, 2, answers.__setitem__, lambda k, w: None, env=extra)
    assert answers == {"new": "set", "home": "/elsewhere"}
    assert dict(os.environ) == before


def test_died_reason_names_signals_and_exit_codes():
    assert "SIGTERM" in died_reason(-signal.SIGTERM)
    assert "code 1" in died_reason(1)
    with pytest.raises(ValueError, match="processes must be >= 1"):
        run_in_processes(operator.call, [], 0, lambda k, v: None, lambda k, w: None)
