"""Run folders: unique, never overwritten, clear errors when they cannot be written."""

import os

import pytest

from pearl.config import ConfigError, load_simulate_config
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
