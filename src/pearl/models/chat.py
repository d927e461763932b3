"""ChatML conversations as token ids: ``<|im_start|>role\\ncontent<|im_end|>\\n``.

Multi-turn RL keeps the tokens the model sampled as they are (never re-tokenized text), so
a conversation is built by appending: the prompt (system, user, assistant header), then
after each reply the tokens that close it and open the next user and assistant messages.
"""

from __future__ import annotations

from pearl.errors import ConfigError
from pearl.models.tokenizer import Tokenizer

START, END = "<|im_start|>", "<|im_end|>"


class ChatFormat:
    def __init__(self, tokenizer: Tokenizer) -> None:
        start, end = tokenizer.token_id(START), tokenizer.token_id(END)
        if start is None or end is None:
            raise ConfigError(
                f"the tokenizer has no {START} / {END} tokens: it is not a ChatML model"
            )
        self.tokenizer = tokenizer
        self.end_id = end

    def prompt(
        self, system: str, user: str, demonstration: tuple[tuple[str, str], ...] = ()
    ) -> list[int]:
        """System message, an optional demonstration (earlier ``(role, text)`` messages that
        show the format), the user message, then the assistant's header."""
        shown = "".join(f"{START}{role}\n{text}{END}\n" for role, text in demonstration)
        return self.tokenizer.encode(
            f"{START}system\n{system}{END}\n{shown}{START}user\n{user}{END}\n{START}assistant\n"
        )

    def next_turn(self, reply: list[int], observation: str) -> list[int]:
        """What follows the model's ``reply``: its end token if the reply was cut off, then
        the user message ``observation`` and the assistant's header."""
        close = [] if reply and reply[-1] == self.end_id else [self.end_id]
        return close + self.tokenizer.encode(
            f"\n{START}user\n{observation}{END}\n{START}assistant\n"
        )

    def text(self, ids: list[int]) -> str:
        """A reply as text, without its end token."""
        if ids and ids[-1] == self.end_id:
            ids = ids[:-1]
        return self.tokenizer.decode(ids)
