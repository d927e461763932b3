"""A fixed rollout deployment by worker counts: ``8C`` (colocated) or ``5P3D`` (prefill +
decode), as experiments and fidelity cases name them; its :class:`Topology` is what the
control plane's state table holds."""

from __future__ import annotations

from dataclasses import dataclass

from pearl.control.state import Topology


@dataclass(slots=True, frozen=True)
class Deployment:
    """A fixed rollout topology: ``colocated`` workers, or ``prefill`` + ``decode`` workers."""

    colocated: int = 0
    prefill: int = 0
    decode: int = 0

    def __post_init__(self) -> None:
        if min(self.colocated, self.prefill, self.decode) < 0:
            raise ValueError(f"worker counts must be >= 0, got {self.label}")
        if self.colocated and (self.prefill or self.decode):
            raise ValueError(
                f"a deployment is colocated or disaggregated, not both: {self.colocated} "
                f"colocated with {self.prefill} prefill and {self.decode} decode workers"
            )
        if not self.colocated and (self.prefill < 1 or self.decode < 1):
            if not (self.prefill or self.decode):
                raise ValueError("a deployment needs at least one worker (e.g. '1C')")
            raise ValueError(
                f"{self.label}: a disaggregated deployment needs at least one prefill and one "
                f"decode worker"
            )

    @property
    def num_workers(self) -> int:
        return self.colocated + self.prefill + self.decode

    @property
    def label(self) -> str:
        return f"{self.colocated}C" if self.colocated else f"{self.prefill}P{self.decode}D"

    @property
    def topology(self) -> Topology:
        return Topology(self.prefill, self.decode, self.colocated)

    @classmethod
    def parse(cls, text: str) -> Deployment:
        """``"8C"``, ``"colocated:8"``, ``"5P3D"``; a malformed or impossible one raises
        ``ValueError`` saying why."""
        t = str(text).strip().upper()
        counts = None
        if t.startswith("COLOCATED:") and t.split(":", 1)[1].isdigit():
            counts = dict(colocated=int(t.split(":", 1)[1]))
        elif t.endswith("C") and t[:-1].isdigit():
            counts = dict(colocated=int(t[:-1]))
        elif "P" in t and t.endswith("D"):
            p, d = t[:-1].split("P", 1)
            if p.isdigit() and d.isdigit():
                counts = dict(prefill=int(p), decode=int(d))
        if counts is None:
            raise ValueError(f"deployment {text!r} is not one of: '8C', 'colocated:8', '5P3D'")
        try:
            return cls(**counts)
        except ValueError as exc:
            raise ValueError(f"deployment {text!r}: {exc}") from None
