"""Optional TensorBoard scalars in a run folder (``tb/``), written when the ``tensorboard``
package is installed (``pip install tensorboard``); without it every call does nothing.

View them with ``tensorboard --logdir runs/<run>/tb``. The JSONL files stay the record;
this is a convenience view of the same numbers.
"""

from __future__ import annotations

import logging
import math
import threading
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class ScalarLog:
    def __init__(self, folder: str | Path) -> None:
        self.writer: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter  # live extra
        except ImportError:  # torch or tensorboard missing: the run folder has the JSONL
            return
        _leave_writer_errors_to_the_caller()
        self.path = Path(folder) / "tb"
        self.writer = SummaryWriter(log_dir=str(self.path))
        logger.info(f"TensorBoard: tensorboard --logdir {self.path}")

    @property
    def enabled(self) -> bool:
        return self.writer is not None

    def scalars(self, prefix: str, values: dict[str, Any], step: int) -> None:
        """Every finite number in ``values`` as ``prefix/key`` at ``step``."""
        if self.writer is None:
            return
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                self.writer.add_scalar(f"{prefix}/{key}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _leave_writer_errors_to_the_caller() -> None:
    """TensorBoard writes from a background thread; when a write fails (a full disk) the
    thread keeps the exception, raises it again on the writer's next call (our caller sees
    it there) and dies, and Python's thread hook prints its traceback to stderr as well.
    Only that print is dropped, for TensorBoard's writer threads; others go to the old hook."""
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread  # optional

    previous = threading.excepthook
    if getattr(previous, "pearl_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if isinstance(args.thread, _AsyncWriterThread) and args.thread.exception is not None:
            logger.debug(f"TensorBoard writer thread stopped: {args.exc_value!r}")
            return
        previous(args)

    hook.pearl_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook
