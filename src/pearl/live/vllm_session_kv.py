"""The KV a vLLM worker of PEARL holds per session, in a file both of its processes use: the
server (``VllmServer``) and vLLM's engine process (``PearlConnector``).

A session's file holds its KV token by token: row ``t`` is token ``t``'s keys and values of
every layer, ``[layers, 2, kv_heads, head_dim]`` float32, so a token range is one slice of
the file and tokens are added or dropped at its end. A prefill worker's file holds the
session's last prompt: the connector writes only the rows after what the previous prompt
shares with this one, and ``export_kv`` reads the chunk's rows. A decode worker's file holds
the imported chunks: ``import_kv`` appends their rows and the connector reads only what
vLLM's prefix cache lacks. Every step moves the new tokens' rows, never the whole context
(which re-reading and re-writing whole prefixes did each turn, on the server's event loop).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np

from pearl.errors import KVTransferError

ROW_DTYPE = np.float32


def write_rows(path: str, start: int, rows: np.ndarray) -> None:
    """Rows ``[start, start + len(rows))`` of the file at ``path`` (created if absent),
    which ends after them: rows it held from ``start`` on are replaced or dropped."""
    data = np.ascontiguousarray(rows, dtype=ROW_DTYPE)
    row_bytes = data.itemsize * int(np.prod(data.shape[1:]))
    with open(path, "r+b" if os.path.exists(path) else "wb") as f:
        f.seek(start * row_bytes)
        data.tofile(f)
        f.truncate()


def read_rows(path: str, start: int, end: int, row_shape: tuple[int, ...]) -> np.ndarray:
    """Rows ``[start, end)`` of the file at ``path``: ``[end - start, *row_shape]``."""
    elems = int(np.prod(row_shape))
    row_bytes = elems * np.dtype(ROW_DTYPE).itemsize
    rows = np.fromfile(path, dtype=ROW_DTYPE, count=(end - start) * elems, offset=start * row_bytes)
    if rows.size != (end - start) * elems:
        raise KVTransferError(
            f"{path} holds {os.path.getsize(path) // row_bytes} tokens of KV, not tokens "
            f"[{start}, {end})"
        )
    return rows.reshape(end - start, *row_shape)


@dataclass(slots=True)
class SessionKV:
    """A session's KV in the file at ``path``: tokens ``token_ids``, computed by weights
    ``version`` (the oldest, where parts came from different weights); ``geometry`` is
    (layers, kv_heads, head_dim). The file may run ahead of ``token_ids`` while vLLM
    writes a prompt's rows (``saved`` says how far it got)."""

    path: str
    geometry: tuple[int, int, int]
    token_ids: list[int]
    version: int

    @property
    def row_shape(self) -> tuple[int, int, int, int]:
        layers, heads, head_dim = self.geometry
        return (layers, 2, heads, head_dim)

    def saved(self) -> int:
        """Tokens of KV in the file."""
        return os.path.getsize(self.path) // self._row_bytes() if os.path.exists(self.path) else 0

    def matched(self, token_ids: list[int]) -> int:
        """The length of the common prefix of the held tokens and ``token_ids``."""
        n = 0
        for a, b in zip(self.token_ids, token_ids, strict=False):
            if a != b:
                break
            n += 1
        return n

    def truncate(self, n: int) -> None:
        """Keep tokens ``[0, n)``."""
        self.token_ids = self.token_ids[:n]
        if os.path.exists(self.path):
            os.truncate(self.path, min(n, self.saved()) * self._row_bytes())

    def append(self, token_ids: list[int], keys: np.ndarray, values: np.ndarray) -> None:
        """Add tokens at the end, with their keys and values ``[layers, n, kv_heads,
        head_dim]``."""
        rows = np.stack([keys, values], axis=2).transpose(1, 0, 2, 3, 4)
        write_rows(self.path, len(self.token_ids), rows)
        self.token_ids = self.token_ids + list(token_ids)

    def read(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of tokens ``[start, end)``, ``[layers, end - start, kv_heads,
        head_dim]`` each."""
        rows = read_rows(self.path, start, end, self.row_shape)
        return (
            np.ascontiguousarray(rows[:, :, 0].transpose(1, 0, 2, 3)),
            np.ascontiguousarray(rows[:, :, 1].transpose(1, 0, 2, 3)),
        )

    def remove(self) -> None:
        if os.path.exists(self.path):
            os.remove(self.path)

    def _row_bytes(self) -> int:
        return int(np.prod(self.row_shape)) * np.dtype(ROW_DTYPE).itemsize


def model_identity(folder: str) -> tuple[str, tuple[int, int, int]]:
    """A model id for KV chunks (its type and a digest of its ``config.json``: workers of
    one run load the same folder) and its KV geometry (layers, kv_heads, head_dim)."""
    with open(os.path.join(folder, "config.json"), "rb") as f:
        raw = f.read()
    cfg = json.loads(raw)
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    geometry = (int(cfg["num_hidden_layers"]), int(cfg.get("num_key_value_heads", heads)), head_dim)
    digest = hashlib.blake2b(raw, digest_size=6).hexdigest()
    return f"vllm-{cfg.get('model_type', 'model')}-{digest}", geometry
