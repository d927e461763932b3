"""Secrets never leave the process in a config: what a run folder, W&B or a message shows.

A key is secret when its name, split into words at ``_``, ``-``, ``.`` and camelCase humps
and lowercased:

- has one of the words ``password``, ``passwd``, ``secret``, ``secrets``, ``apikey``,
  ``credential``, ``credentials``, ``authorization`` or ``bearer``, or the pair ``api key``,
  ``private key`` or ``access key`` (``api_key``, ``clientSecret``, ``AWS_SECRET_ACCESS_KEY``);
- ends in ``token`` (``hf_token``; not ``max_new_tokens`` or ``stop_token_ids``), unless it
  names a tokenizer's special token (``pad_token``, ``eos_token``, ...);
- ends in ``auth``, ``cookie`` or ``cookies`` (``basic_auth``, ``Cookie``; not ``auth_mode``);
- ends in ``key`` or ``keys`` after another word (``openai_key``, ``wandb_key``,
  ``ssh_key``), unless that word says what the key looks up (``_LOOKUP_KEYS``: a dataset's
  ``prompt_key``, a ``sort_key``, a ``public_key``, a JAX ``rng_key``). ``key`` alone is not
  secret: a dict of anything has keys.

Its value, whatever it is, is replaced by ``REDACTED``; ``null`` stays (it says that no
secret is set). In every string value, credentials in a URL are replaced too: its user
information's password (``https://user:<redacted>@host``; a lone user name, often a token
as in ``https://<token>@github.com``, as a whole) and secret-named query parameters
(``?api_key=<redacted>``).

No PEARL config key ends in ``key`` today but ``env.options.api_key``; the exceptions are
there for agents' ``env.options.kwargs``, where a key that looks secret but is not would
be refused on resume (``redacted_keys``) until passed again.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "<redacted>"

_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "secret",
        "secrets",
        "apikey",
        "credential",
        "credentials",
        "authorization",
        "bearer",
    }
)
_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key")})
_SECRET_LAST_WORDS = frozenset({"token", "auth", "cookie", "cookies"})
# A tokenizer's special tokens: ``pad_token: "<|endoftext|>"`` is a setting, not a secret.
_SPECIAL_TOKENS = frozenset({"pad", "eos", "bos", "unk", "sep", "cls", "mask"})
# ``<word>_key``: what a key looks up or orders by, not a secret (RL datasets' column names,
# dict and sort keys, cryptography's public half, JAX's random keys).
_LOOKUP_KEYS = frozenset(
    {
        "answer",
        "cache",
        "chosen",
        "column",
        "content",
        "context",
        "data",
        "dataset",
        "dict",
        "field",
        "fn",
        "foreign",
        "group",
        "hash",
        "id",
        "image",
        "images",
        "index",
        "input",
        "label",
        "lookup",
        "message",
        "messages",
        "metric",
        "name",
        "output",
        "partition",
        "primary",
        "prng",
        "prompt",
        "public",
        "query",
        "question",
        "reference",
        "rejected",
        "response",
        "reward",
        "rng",
        "role",
        "shard",
        "solution",
        "sort",
        "system",
        "target",
        "task",
        "text",
        "tool",
        "tools",
        "truth",
        "value",
        "video",
    }
)
_HUMP = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.\-]*://\S+")
_QUERY_ITEM = re.compile(r"(?<=[?&;])([^=&;#]+)=([^&;#]*)")


def is_secret_key(name: str) -> bool:
    """Whether a config key's value is a secret, by its name (the module's rule)."""
    words = [w for w in re.split(r"[_\-.\s]+", _HUMP.sub("_", name).lower()) if w]
    if not words:
        return False
    last, before = words[-1], words[-2] if len(words) > 1 else None
    return (
        any(w in _SECRET_WORDS for w in words)
        or any(pair in _SECRET_PAIRS for pair in zip(words, words[1:], strict=False))
        or (last in _SECRET_LAST_WORDS and not (last == "token" and before in _SPECIAL_TOKENS))
        or (last in ("key", "keys") and before is not None and before not in _LOOKUP_KEYS)
    )


def redact_url_credentials(text: str) -> str:
    """``text`` with every URL's password (or lone user name) and secret-named query
    parameters replaced by ``REDACTED``."""
    return _URL.sub(_redact_url, text) if "://" in text else text


def _redact_url(found: re.Match[str]) -> str:
    url = found.group(0)
    scheme, rest = url.split("://", 1)
    authority_end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:authority_end], rest[authority_end:]
    if "@" in authority:
        userinfo, host = authority.rsplit("@", 1)  # a password may hold an unescaped @
        user, colon, _password = userinfo.partition(":")
        authority = f"{user}:{REDACTED}@{host}" if colon else f"{REDACTED}@{host}"
    tail = _QUERY_ITEM.sub(
        lambda item: f"{item.group(1)}={REDACTED}" if is_secret_key(item.group(1)) else item[0],
        tail,
    )
    return f"{scheme}://{authority}{tail}"


def redact_secrets(value: Any) -> Any:
    """A copy of ``value`` (nested dicts and lists, as from ``model_dump``) whose secret keys'
    values (``is_secret_key``) are ``REDACTED`` and whose strings' URLs hold no credentials
    (``redact_url_credentials``); everything else as it was."""
    if isinstance(value, dict):
        return {
            key: REDACTED
            if isinstance(key, str) and is_secret_key(key) and item is not None
            else redact_secrets(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_secrets(item) for item in value]
    if isinstance(value, str):
        return redact_url_credentials(value)
    return value


def redacted_keys(value: Any, prefix: str = "") -> list[str]:
    """The dotted keys of ``value`` whose value is ``REDACTED`` or holds it (a URL's
    credentials), as in a config read back from a run folder: the secrets to pass again."""
    if isinstance(value, dict):
        found = []
        for key, item in value.items():
            found += redacted_keys(item, f"{prefix}{key}.")
        return found
    if isinstance(value, list):
        return [k for i, item in enumerate(value) for k in redacted_keys(item, f"{prefix}{i}.")]
    return [prefix.removesuffix(".")] if isinstance(value, str) and REDACTED in value else []
