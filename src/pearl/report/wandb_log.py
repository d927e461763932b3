"""Optional Weights & Biases scalars: the same numbers ``ScalarLog`` writes to TensorBoard.

``logger.wandb: true`` in ``pearl train``. Online when an API key is known (``WANDB_API_KEY``
or a ``wandb login`` entry in ``~/.netrc``), offline otherwise (the run is kept under the
run folder's ``wandb/`` and ``wandb sync`` uploads it later); ``WANDB_MODE`` overrides both.
Each prefix (``train``, ``eval_before``, ...) has its own step axis, ``<prefix>/step``, so
evaluations and steps never fight over W&B's single monotonic step.

W&B's system metadata (``x_disable_meta``) is off: it holds the process's command line
(``sys.argv``), where an override may carry a secret. The host, Python and GPU it also
lists are lost with it (the run folder keeps its own config and summary).
"""

from __future__ import annotations

import logging
import math
import netrc
import os
from pathlib import Path
from typing import Any

from pearl.errors import ConfigError
from pearl.redaction import redact_secrets

logger = logging.getLogger(__name__)


def wandb_mode() -> str:
    """``WANDB_MODE`` if set; else online with a known API key, offline without one."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        known = netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        known = False
    return "online" if known else "offline"


class WandbLog:
    """Scalars to a W&B run under ``folder``; the run's config is ``config`` with its
    secrets redacted (``pearl.redaction``) and no command line: W&B never receives an
    API key."""

    def __init__(self, folder: str | Path, project: str, name: str, config: dict) -> None:
        try:
            import wandb  # optional
        except ImportError:
            raise ConfigError(
                "logger.wandb: true needs the wandb package (pip install 'pearl-rollout[wandb]'"
                " or pip install wandb)"
            ) from None
        mode = wandb_mode()
        self.run: Any = wandb.init(
            project=project,
            name=name,
            dir=str(folder),
            config=redact_secrets(config),
            mode=mode,
            settings=wandb.Settings(x_disable_meta=True),
        )
        self.prefixes: set[str] = set()
        logger.info(f"Weights & Biases: run {name} in project {project} ({mode})")

    def scalars(self, prefix: str, values: dict[str, Any], step: int) -> None:
        """Every finite number in ``values`` as ``prefix/key``, against ``prefix/step``."""
        if prefix not in self.prefixes:
            self.run.define_metric(f"{prefix}/*", step_metric=f"{prefix}/step")
            self.prefixes.add(prefix)
        row = {
            f"{prefix}/{key}": value
            for key, value in values.items()
            if isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
        }
        self.run.log({**row, f"{prefix}/step": step})

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
