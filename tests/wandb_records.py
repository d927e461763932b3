"""Read a W&B run file (``run-<id>.wandb``) back: its history rows and config, for tests.

The file is W&B's header (``:W&B``, a magic number and a version: 7 bytes) and then a
LevelDB-style log: 32 KiB blocks of records, each a 7-byte header (CRC, length, type:
1 full, 2 first, 3 middle, 4 last) and a piece of one protobuf ``Record``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path


def history(path: str | Path) -> list[dict]:
    """Every ``history`` record of the run file at ``path``, as ``{key: value}``."""
    return [
        {
            item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in record.history.item
        }
        for record in records(path)
        if record.WhichOneof("record_type") == "history"
    ]


def config(path: str | Path) -> dict:
    """The run's config as the run file at ``path`` holds it (the ``run`` record's, then
    ``config`` records' updates, in order; W&B's own ``_wandb`` entry left out)."""
    out: dict = {}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind in ("run", "config"):
            updates = record.run.config.update if kind == "run" else record.config.update
            for item in updates:
                out[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    out.pop("_wandb", None)
    return out


def records(path: str | Path) -> list:
    """Every protobuf ``Record`` of the run file at ``path``."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B run file")
    pos, block, pieces, found = 7, 32768, [], []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header: padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            break
        pieces.append(data[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or its last piece
            record = pb.Record()
            record.ParseFromString(b"".join(pieces))
            pieces = []
            found.append(record)
    return found
