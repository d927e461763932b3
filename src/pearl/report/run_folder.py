"""One run = one folder: config.yaml, metrics.jsonl, events.jsonl, summary.json."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

from pearl.errors import PearlError

RUN_FILES = ("metrics.jsonl", "events.jsonl", "summary.json")


class RunFolderError(PearlError, OSError):
    """A run folder cannot be created or would overwrite another run's results."""


def default_run_name(prefix: str = "") -> str:
    """A timestamp plus a random suffix: two runs started in the same second differ."""
    return f"{prefix}{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


class RunFolder:
    """Creates the folder and writes the run's files; JSON lines are written in order.
    A folder that already holds a run's results is never reused (nothing is overwritten)."""

    def __init__(self, parent: str | Path, name: str | None = None) -> None:
        self.path = Path(parent) / (name or default_run_name())
        taken = [f for f in RUN_FILES if (self.path / f).exists()]
        if taken:
            raise RunFolderError(
                f"run folder {self.path} already holds a run ({', '.join(taken)}); choose "
                f"another run name, or leave it unset for a fresh timestamped folder"
            )
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._metrics = (self.path / "metrics.jsonl").open("x")
            self._events = (self.path / "events.jsonl").open("x")
        except FileExistsError:  # another run took the name between the check and here
            raise RunFolderError(f"run folder {self.path} was taken by another run") from None
        except OSError as exc:
            raise RunFolderError(
                f"cannot write the run folder {self.path}: {exc.strerror or exc}; set the run "
                f"directory to a writable folder"
            ) from None

    def write_config(self, text: str) -> None:
        (self.path / "config.yaml").write_text(text)

    def metric(self, record: dict[str, Any]) -> None:
        self._metrics.write(json.dumps(record, sort_keys=True) + "\n")
        self._metrics.flush()  # a row is on disk as soon as its step ends

    def event(self, record: dict[str, Any]) -> None:
        self._events.write(json.dumps(record, sort_keys=True) + "\n")
        self._events.flush()

    def append(self, filename: str, record: dict[str, Any]) -> None:
        """One JSON line appended to ``filename`` in the folder (opened per call: rare)."""
        with (self.path / filename).open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    def summary(self, record: dict[str, Any]) -> None:
        (self.path / "summary.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")

    def close(self) -> None:
        self._metrics.close()
        self._events.close()
