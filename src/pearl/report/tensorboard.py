"""Optional TensorBoard scalars in a run folder (``tb/``), written when the ``tensorboard``
package is installed (``pip install tensorboard``); without it every call does nothing.

View them with ``tensorboard --logdir runs/<run>/tb``. The JSONL files stay the record;
this is a convenience view of the same numbers.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class ScalarLog:
    def __init__(self, folder: str | Path) -> None:
        self.writer: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # torch or tensorboard missing: the run folder has the JSONL
            return
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
