"""The KV a vLLM worker of PEARL holds in its server process, per session: a prefill
worker's last prompt (what the connector saved, cut into chunks by ``export_kv``) and a
decode worker's imported chunks (written for the connector to load)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np

from pearl.errors import EngineStateError


@dataclass(slots=True)
class SessionKV:
    """A session's KV held in this process: tokens ``[0, n)`` and their keys and values
    ``[layers, n, kv_heads, head_dim]`` (float32), computed by weights ``version``."""

    token_ids: list[int]
    keys: np.ndarray
    values: np.ndarray
    version: int

    @classmethod
    def read(cls, path: str, token_ids: list[int], version: int) -> SessionKV:
        """What the connector saved for a prompt of ``token_ids``."""
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            keys = f.get_tensor("keys").float().numpy()
            values = f.get_tensor("values").float().numpy()
        if keys.shape[1] != len(token_ids):
            raise EngineStateError(
                f"vLLM saved KV of {keys.shape[1]} tokens for a prompt of {len(token_ids)}"
            )
        return cls(token_ids, keys, values, version)

    def matched(self, token_ids: list[int]) -> int:
        """The length of the common prefix of the held tokens and ``token_ids``."""
        n = 0
        for a, b in zip(self.token_ids, token_ids, strict=False):
            if a != b:
                break
            n += 1
        return n

    def truncate(self, n: int) -> None:
        self.token_ids = self.token_ids[:n]
        self.keys, self.values = self.keys[:, :n], self.values[:, :n]

    def append(self, token_ids: list[int], keys: np.ndarray, values: np.ndarray) -> None:
        self.token_ids = self.token_ids + token_ids
        self.keys = np.concatenate([self.keys, keys], axis=1)
        self.values = np.concatenate([self.values, values], axis=1)

    def write(self, path: str, n: int) -> None:
        """Tokens ``[0, n)`` as the connector loads them."""
        from safetensors.numpy import save_file

        save_file(
            {
                "keys": np.ascontiguousarray(self.keys[:, :n]),
                "values": np.ascontiguousarray(self.values[:, :n]),
            },
            path,
        )


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
