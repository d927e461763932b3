"""Run folders: unique, never overwritten, clear errors when they cannot be written."""

import errno
import json
import os
import resource
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from full_disk import fill, small_disk

from pearl.config.simulate import load_simulate_config
from pearl.errors import ConfigError
from pearl.report.run_folder import RunFolder, RunFolderError


def test_a_folder_holding_a_run_is_never_reused_and_unwritable_parents_say_so(tmp_path):
    first = RunFolder(tmp_path, "same")
    first.metric({"step": 0})
    first.close()
    with pytest.raises(RunFolderError, match="already holds a run"):
        RunFolder(tmp_path, "same")
    assert (tmp_path / "same" / "metrics.jsonl").read_text() == '{"step": 0}\n'  # kept
    a, b = RunFolder(tmp_path), RunFolder(tmp_path)  # the same second: different folders
    assert a.path != b.path
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(RunFolderError, match="cannot write the run folder"):
            RunFolder(locked / "runs", "x")
    with pytest.raises(RunFolderError, match="cannot write the run folder"):
        RunFolder(tmp_path / "same" / "metrics.jsonl", "x")  # a file where a folder goes


def test_run_names_are_names_not_paths():
    with pytest.raises(ConfigError, match="run_name"):
        load_simulate_config(None, ["logger.run_name=../../x"])


def test_a_run_folder_and_its_files_are_its_owners_only(tmp_path):
    run = RunFolder(tmp_path / "runs", "private")
    run.write_config("model: {name: x}\n")
    run.metric({"step": 0})
    run.event({"kind": "placed"})
    run.append("rollouts.jsonl", {"step": 0})
    run.summary({"complete": True})
    run.close()
    assert stat.S_IMODE(run.path.stat().st_mode) == 0o700
    for name in ("config.yaml", "metrics.jsonl", "events.jsonl", "rollouts.jsonl", "summary.json"):
        assert stat.S_IMODE((run.path / name).stat().st_mode) == 0o600, name


def full_disk_scenario(parent: str, make_full: Callable[[], None], make_room: Callable[[], None]):
    """A run writes a row and a summary, the disk fills, it writes a long row and a long
    summary, room is made, it writes a row again: the errors (errno, file) and the files."""
    run = RunFolder(parent, "r")
    run.metric({"step": 0, "note": "x" * 50})
    run.summary({"complete": False, "steps": 1})
    make_full()
    errors = []
    for write in (
        lambda: run.metric({"step": 1, "note": "y" * 9000}),
        lambda: run.summary({"complete": True, "steps": 2, "note": "z" * 20000}),
    ):
        try:
            write()
            errors.append(None)
        except OSError as exc:
            errors.append([exc.errno, exc.filename])
    make_room()
    run.metric({"step": 1})
    run.close()
    files = {p.name: p.read_text() for p in run.path.iterdir()}
    return {"errors": errors, "files": files}


def _limit_file_size(limit: int) -> Callable[[], None]:
    def full() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
        resource.setrlimit(
            resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1])
        )

    return full


@pytest.mark.parametrize("disk", ["tmpfs", "file-size-limit"])
def test_a_full_disk_leaves_whole_lines_and_the_previous_summary(tmp_path, disk):
    """The disk fills mid-run (a 1 MiB tmpfs filled for real; or ``ulimit -f``, EFBIG, in a
    subprocess): the failed row is not in metrics.jsonl (no half line), summary.json is the
    previous one, no temp file is left, each error names its file, and once there is room
    the next row is appended whole."""
    if disk == "tmpfs":
        with small_disk(tmp_path / "disk") as parent:
            filler: list[Path] = []
            out = full_disk_scenario(
                str(parent), lambda: filler.append(fill(parent)), lambda: filler[0].unlink()
            )
        full = errno.ENOSPC
    else:
        here, parent = Path(__file__).parent, tmp_path
        script = (
            "import json, resource, sys\n"
            "from test_run_folder import _limit_file_size, full_disk_scenario\n"
            "unlimited = resource.getrlimit(resource.RLIMIT_FSIZE)\n"
            "out = full_disk_scenario(sys.argv[1], _limit_file_size(4096),\n"
            "    lambda: resource.setrlimit(resource.RLIMIT_FSIZE, unlimited))\n"
            "print(json.dumps(out))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, str(parent)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent)])},
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        full = errno.EFBIG
    rows = [json.loads(line) for line in out["files"]["metrics.jsonl"].splitlines()]
    assert out["files"]["metrics.jsonl"].endswith("\n")
    assert [r["step"] for r in rows] == [0, 1] and "note" not in rows[1]
    assert json.loads(out["files"]["summary.json"]) == {"complete": False, "steps": 1}
    assert sorted(out["files"]) == ["events.jsonl", "metrics.jsonl", "summary.json"]
    assert out["errors"] == [
        [full, str(parent / "r" / "metrics.jsonl")],
        [full, str(parent / "r" / "summary.json")],
    ]
