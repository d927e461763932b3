"""One run = one folder: config.yaml, metrics.jsonl, events.jsonl, summary.json."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class RunFolder:
    """Creates the folder and writes the run's files; JSON lines are written in order."""

    def __init__(self, parent: str | Path, name: str | None = None) -> None:
        name = name or time.strftime("%Y%m%d-%H%M%S")
        self.path = Path(parent) / name
        self.path.mkdir(parents=True, exist_ok=True)
        self._metrics = (self.path / "metrics.jsonl").open("w")
        self._events = (self.path / "events.jsonl").open("w")

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
