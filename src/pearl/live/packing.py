"""The trainer's batch layout: a GRPO group's trajectories as one prefix tree per row.

The G trajectories of one task share their prompt (and sometimes the first tokens of a
reply). A row holds that shared prefix once, then each trajectory's own tokens one after
another; an attention mask lets each trajectory's tokens see the prefix and, causally,
themselves only, and positions restart after the prefix for each of them. The hidden
states are exactly those of each trajectory run alone, at the cost of ``P + sum(S_i)``
tokens instead of ``G * (P + max S_i)`` for a padded batch. Rows of several groups are
stacked (right-padded) into micro-batches of at most ``budget`` tokens.

Only what the loss needs is gathered: for every token the model sampled (loss mask 1), the
row and column of the position that predicts it, the token, and its behaviour
log-probability.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pearl.control.interfaces import TrainSample


@dataclass(slots=True, frozen=True)
class PackedBatch:
    ids: torch.Tensor  # [B, L] token ids, right-padded with 0
    positions: torch.Tensor  # [B, L] each token's position in its own trajectory
    allowed: torch.Tensor  # [B, L, L] bool: query j may attend to key k
    rows: torch.Tensor  # [N] for each scored token: the row and column of the position
    cols: torch.Tensor  # [N]   that predicts it,
    targets: torch.Tensor  # [N]   the token itself,
    behaviour: torch.Tensor  # [N]   its behaviour log-probability,
    sample: torch.Tensor  # [N]   and the index of its trajectory in ``samples``
    offsets: torch.Tensor  # [N] the token's index in its trajectory

    def to(self, device: torch.device) -> PackedBatch:
        """The tensors the forward pass and the loss use, on ``device`` (``sample`` and
        ``offsets`` index host-side lists and stay where they are)."""
        if device.type == "cpu":
            return self
        moved = (self.ids, self.positions, self.allowed, self.rows, self.cols, self.targets)
        ids, positions, allowed, rows, cols, targets = (t.to(device) for t in moved)
        behaviour = self.behaviour.to(device)
        return PackedBatch(
            ids, positions, allowed, rows, cols, targets, behaviour, self.sample, self.offsets
        )


def common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the prefix all ``sequences`` share, leaving each at least one token."""
    limit = min(len(s) for s in sequences) - 1
    first = sequences[0]
    n = 0
    while n < limit and all(s[n] == first[n] for s in sequences[1:]):
        n += 1
    return n


def trees(
    samples: Sequence[TrainSample], indices: Sequence[int], budget: int
) -> list[tuple[int, list[int]]]:
    """``(prefix length, trajectory indices)`` per row: the ``indices`` by group, a
    group split into rows of at most ``budget`` tokens where one trajectory fits."""
    by_group: dict[str, list[int]] = {}
    for i in indices:
        by_group.setdefault(samples[i].group, []).append(i)
    out: list[tuple[int, list[int]]] = []
    for members in by_group.values():
        prefix = common_prefix([samples[i].token_ids for i in members])
        row: list[int] = []
        length = prefix
        for i in members:
            own = len(samples[i].token_ids) - prefix
            if row and length + own > budget:
                out.append((prefix, row))
                row, length = [], prefix
            row.append(i)
            length += own
        out.append((prefix, row))
    return out


def micro_batches(
    samples: Sequence[TrainSample], rows: list[tuple[int, list[int]]], budget: int
) -> list[list[tuple[int, list[int]]]]:
    """Rows stacked into micro-batches of at most ``budget`` padded tokens (a row longer
    than that goes alone), shortest first so that padding stays small."""

    def length(row: tuple[int, list[int]]) -> int:
        prefix, members = row
        return prefix + sum(len(samples[i].token_ids) - prefix for i in members)

    out: list[list[tuple[int, list[int]]]] = []
    current: list[tuple[int, list[int]]] = []
    for row in sorted(rows, key=length):
        if current and (len(current) + 1) * length(row) > budget:  # sorted: the longest
            out.append(current)
            current = []
        current.append(row)
    if current:
        out.append(current)
    return out


def pack(samples: Sequence[TrainSample], rows: list[tuple[int, list[int]]]) -> PackedBatch:
    """One micro-batch's tensors (see the module's docstring)."""
    lengths = [p + sum(len(samples[i].token_ids) - p for i in members) for p, members in rows]
    width = max(lengths)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    positions = torch.zeros(len(rows), width, dtype=torch.long)
    allowed = torch.zeros(len(rows), width, width, dtype=torch.bool)
    scored: list[tuple[int, int, int, float, int, int]] = []
    for r, (prefix, members) in enumerate(rows):
        shared = samples[members[0]].token_ids[:prefix]
        ids[r, :prefix] = torch.tensor(shared, dtype=torch.long)
        positions[r, :prefix] = torch.arange(prefix)
        allowed[r, :prefix, :prefix] = torch.ones(prefix, prefix, dtype=torch.bool).tril()
        start = prefix
        for i in members:
            s = samples[i]
            own = len(s.token_ids) - prefix
            end = start + own
            ids[r, start:end] = torch.tensor(s.token_ids[prefix:], dtype=torch.long)
            positions[r, start:end] = torch.arange(prefix, prefix + own)
            allowed[r, start:end, :prefix] = True
            allowed[r, start:end, start:end] = torch.ones(own, own, dtype=torch.bool).tril()
            for t in range(1, len(s.token_ids)):
                if s.loss_mask[t]:
                    before = t - 1  # the position that predicts token t
                    col = before if before < prefix else start + before - prefix
                    scored.append((r, col, s.token_ids[t], s.logprobs[t], i, t))
            start = end
        padding = torch.arange(start, width)
        allowed[r, padding, padding] = True  # a padded query attends to itself only
    r_, c_, tok, old, idx, off = zip(*scored, strict=True) if scored else ((),) * 6
    return PackedBatch(
        ids,
        positions,
        allowed,
        torch.tensor(r_, dtype=torch.long),
        torch.tensor(c_, dtype=torch.long),
        torch.tensor(tok, dtype=torch.long),
        torch.tensor(old, dtype=torch.float32),
        torch.tensor(idx, dtype=torch.long),
        torch.tensor(off, dtype=torch.long),
    )
