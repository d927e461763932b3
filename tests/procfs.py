"""Processes of this machine from /proc (Linux), for tests that look at what Ray started."""

import os


def process_tree(root: int) -> set[int]:
    """``root`` and every process descended from it."""
    parent_of = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent_of[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, todo = {root}, [root]
    while todo:
        current = todo.pop()
        for pid, parent in parent_of.items():
            if parent == current and pid not in tree:
                tree.add(pid)
                todo.append(pid)
    return tree


def processes_named(prefix: str, within: set[int]) -> list[int]:
    """Pids in ``within`` whose command line starts with ``prefix`` (Ray names its
    actor processes ``ray::<Class>.<method>``)."""
    out = []
    for pid in within:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().decode(errors="replace").startswith(prefix):
                    out.append(pid)
        except OSError:
            continue
    return out


def running(pid: int) -> bool:
    """Whether ``pid`` is still running (a zombie has ended; only its parent has not reaped it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until_gone(pids, timeout_s: float) -> list[int]:
    """Wait up to ``timeout_s`` for ``pids`` to end; the ones still running."""
    import time

    deadline = time.monotonic() + timeout_s
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in pids if running(p)]


def processes_with_environment(name: str, value: str) -> list[int]:
    """Pids of this user's processes started with ``name=value`` in their environment: a
    mark a test sets on what it starts, which every descendant inherits (Ray's daemons,
    re-parented away from the ``ray start`` that made them, included)."""
    mark = f"{name}={value}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    out.append(int(entry))
        except OSError:
            continue
    return out
