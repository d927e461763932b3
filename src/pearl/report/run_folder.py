"""One run = one folder: config.yaml, metrics.jsonl, events.jsonl, summary.json.

The folder is its owner's only (mode 0o700, its files 0o600): a config may hold paths and
hosts a neighbour need not see, and the secrets in it are redacted (``pearl.redaction``).
A full disk leaves every file whole: JSON lines whole or absent, ``summary.json`` and
``config.yaml`` the old or the new (``pearl.durable_files``).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from pearl.durable_files import LineFile, write_file_atomically
from pearl.errors import PearlError

OWNER_ONLY_FOLDER = 0o700

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
            self.path.mkdir(parents=True, exist_ok=True, mode=OWNER_ONLY_FOLDER)
            os.chmod(self.path, OWNER_ONLY_FOLDER)  # mkdir's mode is masked by the umask
            self._metrics = LineFile(self.path / "metrics.jsonl", exclusive=True)
            self._events = LineFile(self.path / "events.jsonl", exclusive=True)
        except FileExistsError:  # another run took the name between the check and here
            raise RunFolderError(f"run folder {self.path} was taken by another run") from None
        except OSError as exc:
            raise RunFolderError(
                f"cannot write the run folder {self.path}: {exc.strerror or exc}; set the run "
                f"directory to a writable folder"
            ) from None
        self._appended: dict[str, LineFile] = {}

    def write_config(self, text: str) -> None:
        """``config.yaml`` (``text`` comes from ``pearl.config.dump_config``: no secrets)."""
        write_file_atomically(self.path / "config.yaml", text)

    def metric(self, record: dict[str, Any]) -> None:
        self._metrics.append(json.dumps(record, sort_keys=True))  # on disk as its step ends

    def event(self, record: dict[str, Any]) -> None:
        self._events.append(json.dumps(record, sort_keys=True))

    def append(self, filename: str, record: dict[str, Any]) -> None:
        """One JSON line appended to ``filename`` in the folder."""
        if filename not in self._appended:
            self._appended[filename] = LineFile(self.path / filename)
        self._appended[filename].append(json.dumps(record, sort_keys=True))

    def summary(self, record: dict[str, Any]) -> None:
        """``summary.json``, replaced whole (a failed write leaves the previous one)."""
        text = json.dumps(record, indent=2, sort_keys=True) + "\n"
        write_file_atomically(self.path / "summary.json", text)

    def close(self) -> None:
        for lines in (self._metrics, self._events, *self._appended.values()):
            lines.close()
