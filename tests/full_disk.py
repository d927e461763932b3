"""A file system of its own to fill for real (a small tmpfs: needs root), and a process
whose file-size limit plays a full disk (anyone): for the tests of what a full disk leaves."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(where: Path, size: str = "1m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (created) for the block; the test is skipped
    where mounting is not allowed (not root, no CAP_SYS_ADMIN)."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs at {where}: {mounted.stderr.strip()} (needs root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=True)


def fill(disk: Path) -> Path:
    """Write ``disk/filler`` until the file system is full; the filler's path."""
    filler = disk / "filler"
    with open(filler, "ab", buffering=0) as f:
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    return filler
