"""Reading a user's trace file as text: one clear error for a file that is missing,
unreadable or not UTF-8, naming the file and what it should be."""

from __future__ import annotations

from pathlib import Path

from pearl.errors import TraceFormatError


def read_trace_text(path: Path, what: str) -> str:
    """The UTF-8 text of ``path``; ``what`` says what the file should be (in the error)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    except OSError as exc:  # missing, a directory, unreadable
        raise TraceFormatError(
            f"{path}: cannot read the trace ({exc.strerror or exc}); {what}"
        ) from None
