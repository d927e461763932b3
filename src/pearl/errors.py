"""Exceptions shared across PEARL's layers.

Each carries a message that names the offending value, where it came from and
what would have been valid.
"""


class PearlError(Exception):
    """Base class of every error PEARL raises on purpose."""


class ConfigError(PearlError, ValueError):
    """A configuration (model config, run config) is invalid."""


class CheckpointError(PearlError, ValueError):
    """A checkpoint folder or state dict does not match the model."""


class RequestError(PearlError, ValueError):
    """A request (prompt, sampling parameters) is invalid; the engine is unchanged."""


class KVTransferError(PearlError, ValueError):
    """A KV chunk cannot be imported into this engine (model, dtype, version, tokens)."""


class KVPrefixMismatch(KVTransferError):
    """A KV chunk does not continue the tokens the engine holds for its session (the
    context was edited, or a stale length was used); nothing changed. Re-match and resend."""


class KVOutOfMemory(KVTransferError):
    """The engine has no KV memory for a chunk now; nothing changed. Retry once running
    requests free memory."""


class EngineStateError(PearlError, RuntimeError):
    """An operation is not valid in the engine's current state (asleep, wrong role)."""


class StalenessError(PearlError, RuntimeError):
    """A rollout batch older than the pipeline's staleness bound reached the trainer (a
    scheduling bug: the step is refused rather than trained on)."""


class WorkloadError(PearlError, ValueError):
    """A workload value (trajectory, profile, availability trace) is inconsistent or out of range."""


class TraceFormatError(PearlError, ValueError):
    """A trace file (rollout JSONL, availability CSV) is malformed; the message names file, line and field."""


class RunInterrupted(PearlError, RuntimeError):
    """A run stopped before its last step; its folder keeps what finished, and the message
    says how to continue."""


class RunStopped(RunInterrupted):
    """The user stopped a run (Ctrl-C or SIGTERM); the message says where its results are."""


class RunsLost(RunInterrupted):
    """Some of an experiment's runs were lost with the process running them (killed, out of
    memory); the others finished and are kept. The message names each lost run and why."""
