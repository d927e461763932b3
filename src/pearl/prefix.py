"""Longest common prefix of two token sequences (used by engines and the agent loop)."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_length(a: Sequence[int], b: Sequence[int], limit: int | None = None) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (at most ``limit``).

    Both must be the same sequence type (list vs list): slices are compared in bulk,
    bisecting on the first difference, so the cost is a few C-speed passes, not a Python
    loop per token.
    """
    n = min(len(a), len(b)) if limit is None else min(limit, len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
