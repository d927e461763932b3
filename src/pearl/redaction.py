"""Secrets never leave the process in a config: what a run folder, W&B or a message shows.

A key is secret when its name, split into words at ``_``, ``-``, ``.`` and camelCase humps
and lowercased, has one of the words ``password``, ``passwd``, ``secret``, ``secrets``,
``apikey``, ``credential`` or ``credentials``, or the pair ``api key``, ``private key`` or
``access key``, or ends in the word ``token`` (``api_key``, ``hf_token``, ``clientSecret``,
``AWS_SECRET_ACCESS_KEY``; not ``max_new_tokens``, ``stop_token_ids`` or ``key``; a
``pad_token`` is redacted too: better one value too many). Its value, whatever it is,
is replaced by ``REDACTED``; ``null`` stays (it says that no secret is set).
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "<redacted>"

_SECRET_WORDS = frozenset(
    {"password", "passwd", "secret", "secrets", "apikey", "credential", "credentials"}
)
_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key")})
_HUMP = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def is_secret_key(name: str) -> bool:
    """Whether a config key's value is a secret, by its name (the module's rule)."""
    words = [w for w in re.split(r"[_\-.\s]+", _HUMP.sub("_", name).lower()) if w]
    return (
        any(w in _SECRET_WORDS for w in words)
        or any(pair in _SECRET_PAIRS for pair in zip(words, words[1:], strict=False))
        or words[-1:] == ["token"]
    )


def redact_secrets(value: Any) -> Any:
    """A copy of ``value`` (nested dicts and lists, as from ``model_dump``) whose secret keys'
    values (``is_secret_key``) are ``REDACTED``; everything else as it was."""
    if isinstance(value, dict):
        return {
            key: REDACTED
            if isinstance(key, str) and is_secret_key(key) and item is not None
            else redact_secrets(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_secrets(item) for item in value]
    return value


def redacted_keys(value: Any, prefix: str = "") -> list[str]:
    """The dotted keys of ``value`` whose value is ``REDACTED`` (a config read back from a
    run folder: the secrets to pass again)."""
    if isinstance(value, dict):
        found = []
        for key, item in value.items():
            found += redacted_keys(item, f"{prefix}{key}.")
        return found
    if isinstance(value, list):
        return [k for i, item in enumerate(value) for k in redacted_keys(item, f"{prefix}{i}.")]
    return [prefix.removesuffix(".")] if value == REDACTED else []
