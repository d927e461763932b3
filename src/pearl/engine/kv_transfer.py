"""Self-describing KV chunks moved between engines (pure Python + numpy; no torch).

A chunk carries the KV of tokens ``[start, end)`` of one session, layer-major
(``keys``/``values``: ``[layers, end - start, kv_heads, head_dim]``), with what the
receiver must check before appending it: the model, dtype, weight version, the
chunk's token ids and a digest of the tokens before ``start``.
"""

from __future__ import annotations

import hashlib
import json
import struct
from array import array
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np

from pearl.errors import KVTransferError

_MAGIC = b"PEARLKV1"


def token_digest(token_ids: Seq[int]) -> str:
    """A process-independent digest of a token sequence."""
    return hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=16).hexdigest()


def _body_digest(keys: bytes, values: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(keys)
    h.update(values)
    return h.hexdigest()


def _flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be true or false, got {value!r}")
    return value


@dataclass(slots=True, frozen=True)
class KVChunk:
    """The KV of one session's tokens ``[start, end)`` and the facts needed to trust it."""

    model_id: str
    dtype: str
    block_size: int  # of the sender (informational: KV travels token-major)
    # The exporter's weights when it exported; the importer must run the same version.
    # KV of a session that lived through an update is older in part: ``cacheable`` False.
    weight_version: int
    session_id: str
    start: int
    end: int
    token_ids: tuple[int, ...]  # tokens [start, end)
    prefix_digest: str  # token_digest of tokens [0, start)
    keys: np.ndarray  # [layers, end - start, kv_heads, head_dim]
    values: np.ndarray
    # False if the session's KV (this chunk's, or the prefix's it attended to) was computed,
    # in part, before the exporter's current weights: the receiver continues the session on
    # it but never registers it in its prefix cache (``Scheduler.invalidate_cached_kv``).
    cacheable: bool = True
    # The oldest weights version among the session's KV (this chunk's or its prefix's);
    # None: ``weight_version``. The importer's tokens sampled on it are tagged with it.
    kv_version: int | None = None

    @property
    def oldest_version(self) -> int:
        return self.weight_version if self.kv_version is None else self.kv_version

    @property
    def num_tokens(self) -> int:
        return self.end - self.start

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.values.nbytes)

    def validate_shape(self) -> None:
        if self.end <= self.start or self.start < 0:
            raise KVTransferError(
                f"KV chunk of session {self.session_id!r}: empty or negative range [{self.start}, {self.end})"
            )
        if len(self.token_ids) != self.num_tokens:
            raise KVTransferError(
                f"KV chunk of session {self.session_id!r}: {len(self.token_ids)} token ids for range "
                f"[{self.start}, {self.end})"
            )
        if (
            self.keys.shape != self.values.shape
            or self.keys.ndim != 4
            or self.keys.shape[1] != self.num_tokens
        ):
            raise KVTransferError(
                f"KV chunk of session {self.session_id!r}: keys {self.keys.shape} / values "
                f"{self.values.shape} do not match [layers, {self.num_tokens}, kv_heads, head_dim]"
            )

    def to_bytes(self) -> bytes:
        """Serialize without pickle: a JSON header (with a checksum of the body) followed
        by the raw arrays."""
        keys = np.ascontiguousarray(self.keys).tobytes()
        values = np.ascontiguousarray(self.values).tobytes()
        header = {
            "model_id": self.model_id,
            "dtype": self.dtype,
            "block_size": self.block_size,
            "weight_version": self.weight_version,
            "session_id": self.session_id,
            "start": self.start,
            "end": self.end,
            "token_ids": list(self.token_ids),
            "prefix_digest": self.prefix_digest,
            "cacheable": self.cacheable,
            "kv_version": self.oldest_version,
            "shape": list(self.keys.shape),
            "array_dtype": str(self.keys.dtype),
            "body_blake2b": _body_digest(keys, values),
        }
        raw = json.dumps(header).encode()
        return _MAGIC + struct.pack("<Q", len(raw)) + raw + keys + values

    @classmethod
    def from_bytes(cls, data: bytes) -> KVChunk:
        """Parse :meth:`to_bytes`' format; any malformed, truncated or corrupted input
        raises ``KVTransferError`` saying what is wrong."""
        if len(data) < 16 or data[:8] != _MAGIC:
            raise KVTransferError(
                f"not a PEARL KV chunk ({'too short' if len(data) < 16 else 'bad magic bytes'})"
            )
        (n,) = struct.unpack("<Q", data[8:16])
        if 16 + n > len(data):
            raise KVTransferError(f"KV chunk is truncated: header of {n} bytes, {len(data)} in all")
        try:
            header = json.loads(data[16 : 16 + n])
            shape = tuple(int(x) for x in header["shape"])
            dtype = np.dtype(header["array_dtype"])
            fields = dict(
                model_id=str(header["model_id"]),
                dtype=str(header["dtype"]),
                block_size=int(header["block_size"]),
                weight_version=int(header["weight_version"]),
                session_id=str(header["session_id"]),
                start=int(header["start"]),
                end=int(header["end"]),
                token_ids=tuple(int(t) for t in header["token_ids"]),
                prefix_digest=header["prefix_digest"],
                cacheable=_flag(header.get("cacheable", True), "cacheable"),
                kv_version=int(header.get("kv_version", header["weight_version"])),
            )
            digest = str(header["body_blake2b"])
        except (ValueError, KeyError, TypeError) as exc:
            raise KVTransferError(
                f"KV chunk header is malformed ({type(exc).__name__}: {exc})"
            ) from None
        if dtype.kind != "f" or any(d < 0 for d in shape):
            raise KVTransferError(
                f"KV chunk arrays must be floating point with non-negative dims, got "
                f"{dtype} {shape}"
            )
        size = int(np.prod(shape)) * dtype.itemsize
        body = data[16 + n :]
        if len(body) != 2 * size:
            raise KVTransferError(f"KV chunk body has {len(body)} bytes, header implies {2 * size}")
        if _body_digest(body[:size], body[size:]) != digest:
            raise KVTransferError(
                "KV chunk body does not match its checksum (corrupted in transit)"
            )
        keys = np.frombuffer(body[:size], dtype=dtype).reshape(shape)
        values = np.frombuffer(body[size:], dtype=dtype).reshape(shape)
        chunk = cls(**fields, keys=keys, values=values)
        chunk.validate_shape()
        return chunk
