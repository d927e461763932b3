"""Weights & Biases scalars, offline: what ``WandbLog`` writes, read back from the run file."""

import sys
import time

import pytest

pytest.importorskip("wandb")

from google.protobuf.message import DecodeError  # noqa: E402
from wandb_records import config, history  # noqa: E402

from pearl.report.wandb_log import WandbLog, wandb_mode  # noqa: E402


def test_offline_run_keeps_every_finite_scalar_per_prefix_step(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = WandbLog(tmp_path, "pearl-test", "unit", {"rollout": {"group_size": 4}})
    log.scalars("eval_before", {"success_rate": 0.25, "tasks": 8}, 0)
    log.scalars("train", {"loss": 1.5, "reward_mean": 0.25, "done": True, "x": float("nan")}, 0)
    log.scalars("train", {"loss": 1.0, "reward_mean": 0.5, "note": "text"}, 1)
    log.scalars("eval_after", {"success_rate": 0.5}, 2)
    log.close()
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    # W&B's service process writes the file; on a loaded machine its last records have been
    # seen to land after ``finish`` returned (once, no rows read): read until all four are in.
    deadline = time.monotonic() + 60
    while len(_history_so_far(run_file)) < 4 and time.monotonic() < deadline:
        time.sleep(0.5)
    rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in history(run_file)]
    assert rows == [
        {"eval_before/success_rate": 0.25, "eval_before/tasks": 8, "eval_before/step": 0},
        {"train/loss": 1.5, "train/reward_mean": 0.25, "train/step": 0},
        {"train/loss": 1.0, "train/reward_mean": 0.5, "train/step": 1},
        {"eval_after/success_rate": 0.5, "eval_after/step": 2},
    ]


def test_wandb_receives_the_run_config_without_its_secrets(tmp_path, monkeypatch):
    """An agent run's ``env.options.api_key`` (and any secret-named key) reaches W&B as
    ``<redacted>``: the key is in no file W&B keeps for upload."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    key = "sk-live-0123456789abcdef"
    options = {"agent": "pkg.mod:fn", "api_key": key, "kwargs": {"hf_token": key, "turns": 2}}
    log = WandbLog(
        tmp_path, "pearl-test", "secrets", {"env": {"name": "agent", "options": options}}
    )
    log.scalars("train", {"loss": 1.0}, 0)
    log.close()
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 60  # W&B's service process may still be writing (above)
    while not _config_so_far(run_file) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert config(run_file) == {
        "env": {
            "name": "agent",
            "options": {
                "agent": "pkg.mod:fn",
                "api_key": "<redacted>",
                "kwargs": {"hf_token": "<redacted>", "turns": 2},
            },
        }
    }
    kept = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert kept and not [p for p in kept if key.encode() in p.read_bytes()]


def test_wandb_is_not_sent_the_command_line(tmp_path, monkeypatch):
    """W&B records a run's ``sys.argv`` as metadata; a secret passed as an override
    (``env.options.api_key=...``) would reach it: no file W&B keeps holds the command line."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    key = "sk-live-argv-0123456789"
    monkeypatch.setattr(
        sys, "argv", ["pearl", "train", f"env.options.api_key={key}", "env.name=agent"]
    )
    log = WandbLog(tmp_path, "pearl-test", "argv", {"run": {"steps": 1}})
    log.scalars("train", {"loss": 1.0}, 0)
    log.close()
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 60  # W&B's service process may still be writing (above)
    while len(_history_so_far(run_file)) < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    kept = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert kept and not [p for p in kept if b"env.options.api_key" in p.read_bytes()]
    assert not [p for p in kept if key.encode() in p.read_bytes()]


def _config_so_far(run_file):
    try:
        return config(run_file)
    except DecodeError:  # a record still being written
        return {}


def _history_so_far(run_file):
    try:
        return history(run_file)
    except DecodeError:  # a record still being written
        return []


def test_mode_is_offline_without_a_key(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    assert wandb_mode() == "offline"
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password k\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"
