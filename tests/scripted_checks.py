"""Checks shared by the simulated and live scripted-reconfiguration tests."""

from __future__ import annotations


def assert_served_by_new_topology(late: list, to: str) -> None:
    """Turns submitted after a scripted change ran on the topology it set: ``1P1D`` (a
    switch: prefill on w0, decode on w1) or a shrink to w0 alone. None is allowed: a
    one-token turn needs no decode worker, a small append is prefilled where its KV lives
    (the decode worker)."""
    if to == "1P1D":
        assert all(t.prefill_worker in ("w0", None) for t in late)
        assert all(t.decode_worker in ("w1", None) for t in late)
        assert any((t.prefill_worker, t.decode_worker) == ("w0", "w1") for t in late)
    else:
        assert all({t.prefill_worker, t.decode_worker} <= {"w0", None} for t in late)
