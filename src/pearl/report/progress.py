"""What long commands print while they run: ``logging`` set up once, and a progress display.

On a terminal, log lines and a live bar (done / total, elapsed, ETA) share one rich console
on stderr; piped or under a test runner, the same information comes as plain lines
(``[3/21] 14% pearl@segment1 ... ETA 2m10s``), one per finished unit. Results (tables, the
run folder) go to stdout with ``print``; everything here goes to stderr.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

QUIET, NORMAL, VERBOSE = -1, 0, 1
_state: dict[str, Any] = {"verbosity": NORMAL, "console": None}


def _interactive() -> bool:
    return sys.stderr.isatty()


def setup_logging(verbosity: int = NORMAL) -> None:
    """Route the ``pearl`` loggers to stderr: warnings only (QUIET), progress and info
    (NORMAL), or everything with times and module names (VERBOSE). Safe to call again
    (handlers are replaced, so a test runner's swapped streams are picked up)."""
    logger = logging.getLogger("pearl")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    _state["verbosity"] = verbosity
    level = {QUIET: logging.WARNING, NORMAL: logging.INFO}.get(verbosity, logging.DEBUG)
    handler: logging.Handler
    if _interactive():
        from rich.highlighter import NullHighlighter  # import time
        from rich.logging import RichHandler

        handler = RichHandler(
            console=console(),
            highlighter=NullHighlighter(),
            show_time=verbosity >= VERBOSE,
            show_path=verbosity >= VERBOSE,
            show_level=verbosity >= VERBOSE,
            markup=False,
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        detailed = "%(asctime)s %(levelname)s %(name)s: %(message)s"
        handler.setFormatter(logging.Formatter(detailed if verbosity >= VERBOSE else "%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def reset_logging() -> None:
    """Remove the handlers :func:`setup_logging` added (the ``pearl`` loggers fall back to
    Python's default: warnings to stderr)."""
    logger = logging.getLogger("pearl")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.propagate = True
    logger.setLevel(logging.NOTSET)
    _state["verbosity"] = NORMAL


def console():
    """The rich console on stderr that log lines and progress bars share."""
    if _state["console"] is None:
        from rich.console import Console  # import time

        _state["console"] = Console(stderr=True)
    return _state["console"]


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """``with Progress(21, "runs") as bar: ... bar.advance("pearl@segment1")``.

    A rich bar on a terminal (unless quiet); otherwise one log line per ``advance`` with
    the count, the share done, the elapsed time and the ETA (elapsed per unit so far times
    the units left)."""

    def __init__(self, total: int, what: str, logger: str = "pearl.progress") -> None:
        self.total = max(0, total)
        self.what = what
        self.done = 0
        self.log = logging.getLogger(logger)
        self._bar: Any = None
        self._task: Any = None
        self._started = time.monotonic()

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        if _interactive() and _state["verbosity"] > QUIET and self.total:
            from rich.progress import (  # import time
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar  # import time

            self._bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=console(),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=self.total)
        return self

    def eta_s(self) -> float | None:
        """Seconds left at the pace so far; None before the first unit finishes."""
        if not self.done:
            return None
        elapsed = time.monotonic() - self._started
        return elapsed / self.done * (self.total - self.done)

    def advance(self, note: str = "") -> None:
        self.done += 1
        if self._bar is not None:
            if note:
                self.log.info(note)  # printed above the bar
            self._bar.update(self._task, advance=1)
            return
        eta = self.eta_s()
        share = 100 * self.done / self.total if self.total else 100.0
        self.log.info(
            f"[{self.done}/{self.total}] {share:.0f}% {self.what}"
            f"{': ' + note if note else ''}  elapsed "
            f"{_duration(time.monotonic() - self._started)}"
            f"{', ETA ' + _duration(eta) if eta is not None and self.done < self.total else ''}"
        )

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
