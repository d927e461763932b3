"""Files and folders whole or untouched (pearl.durable_files): file systems that cannot
fsync a folder, and a checkpoint whose replacement a crash cut between its two renames."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pearl.apps.train.run import _last_checkpoint
from pearl.durable_files import folder_written_whole, recover_folder, write_file_atomically

real_fsync = os.fsync


@pytest.mark.parametrize("code", ["EINVAL", "ENOTSUP", "EOPNOTSUPP", "ENOSYS", "EBADF"])
def test_a_file_system_that_cannot_fsync_a_folder_still_gets_its_files(tmp_path, monkeypatch, code):
    """FUSE and network file systems answer a folder's fsync with one of these: the files
    are written and renamed into place all the same."""
    monkeypatch.setattr(os, "fsync", _fsync_refusing_folders(getattr(errno, code)))
    write_file_atomically(tmp_path / "summary.json", '{"steps": 1}')
    with folder_written_whole(tmp_path / "v1") as tmp:
        (tmp / "weights").write_text("w")
    assert (tmp_path / "summary.json").read_text() == '{"steps": 1}'
    assert (tmp_path / "v1" / "weights").read_text() == "w"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json", "v1"]


def test_a_folder_fsync_that_fails_otherwise_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", _fsync_refusing_folders(errno.EIO))
    with pytest.raises(OSError) as failed:
        write_file_atomically(tmp_path / "summary.json", "{}")
    assert failed.value.errno == errno.EIO


def _fsync_refusing_folders(code: int):
    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    return fsync


# Rewrites checkpoint v2 and dies (as a killed process does: no cleanup) between the swap's
# two renames: v2 moved aside to v2.old, the new v2.tmp not yet renamed in.
CUT_SWAP = """
import os, sys
from pathlib import Path
from pearl.durable_files import folder_written_whole
real_rename = Path.rename
def rename(self, target):
    if self.name == "v2.tmp":
        os._exit(9)
    return real_rename(self, target)
Path.rename = rename
with folder_written_whole(Path(sys.argv[1])) as tmp:
    (tmp / "optimizer").mkdir()
    (tmp / "optimizer" / "trainer.json").write_text('{"version": "new"}')
"""


def _checkpoint(folder: Path, version: str) -> None:
    (folder / "optimizer").mkdir(parents=True)
    (folder / "optimizer" / "trainer.json").write_text(json.dumps({"version": version}))


def test_a_crash_between_the_swaps_renames_loses_no_checkpoint(tmp_path):
    """v2 is being replaced when the process dies between moving it aside and moving the
    new one in: the run's last checkpoint is still v2 (the old one, whole), found and put
    back where a resume looks for it, and the next write of v2 goes through."""
    checkpoints = tmp_path / "run" / "checkpoints"
    _checkpoint(checkpoints / "v1", "v1")
    _checkpoint(checkpoints / "v2", "old")
    cut = subprocess.run(
        [sys.executable, "-c", CUT_SWAP, str(checkpoints / "v2")], capture_output=True, timeout=60
    )
    assert cut.returncode == 9, cut.stderr
    assert sorted(p.name for p in checkpoints.iterdir()) == ["v1", "v2.old", "v2.tmp"]

    assert _last_checkpoint(tmp_path / "run") == (2, checkpoints / "v2")
    meta = json.loads((checkpoints / "v2" / "optimizer" / "trainer.json").read_text())
    assert meta == {"version": "old"}
    with folder_written_whole(checkpoints / "v2") as tmp:
        _checkpoint(tmp, "new")
    assert sorted(p.name for p in checkpoints.iterdir()) == ["v1", "v2"]
    meta = json.loads((checkpoints / "v2" / "optimizer" / "trainer.json").read_text())
    assert meta == {"version": "new"}


def test_resuming_from_a_checkpoint_left_aside_puts_it_back(tmp_path):
    """``pearl train --resume .../v2`` after such a crash: v2 is back (``recover_folder``);
    a folder already in place is left as it is."""
    _checkpoint(tmp_path / "v2.old", "old")
    assert recover_folder(tmp_path / "v2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v2"]
    assert recover_folder(tmp_path / "v2")  # nothing to do
    assert not recover_folder(tmp_path / "v3")
