"""Read a W&B run file (``run-<id>.wandb``) back: its history rows, for tests.

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
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B run file")
    pos, block, pieces, rows = 7, 32768, [], []
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
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {
                        item.key or "/".join(item.nested_key): json.loads(item.value_json)
                        for item in record.history.item
                    }
                )
    return rows
