"""Tokenizer wrapper over a Hugging Face ``tokenizer.json`` (via the ``tokenizers`` package)."""

from __future__ import annotations

import functools
from pathlib import Path

from pearl.errors import ConfigError

# Past this many characters, ``encode`` goes through ``encode_batch``, which releases the
# GIL (``encode`` holds it: 1 s for 1.2 MB), so another thread's tokenizing does not stop
# the event loop; below it, one call's overhead matters more.
LONG_TEXT_CHARS = 16 << 10


class Tokenizer:
    """Encode text to token ids and decode back; loaded from a model folder's tokenizer.json."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer  # live extra

        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(f"{path}: tokenizer.json not found")
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed files
            raise ConfigError(f"{path}: not a valid tokenizer.json ({exc})") from exc

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The most UTF-8 bytes one token stands for (+1: a decoder may drop a leading
        space): text of ``n`` bytes takes at least ``n / max_token_bytes`` tokens."""
        pieces = self._tok.decode_batch([[i] for i in range(self.vocab_size)], False)
        return max(len(p.encode()) for p in pieces) + 1

    def encode(self, text: str) -> list[int]:
        if len(text) > LONG_TEXT_CHARS:  # the same ids, the interpreter free meanwhile
            return self._tok.encode_batch([text], add_special_tokens=False)[0].ids
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)
