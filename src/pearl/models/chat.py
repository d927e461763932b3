"""ChatML conversations as token ids: ``<|im_start|>role\\ncontent<|im_end|>\\n``.

Multi-turn RL keeps the tokens the model sampled as they are (never re-tokenized text), so
a conversation is built by appending: the prompt (system, user, assistant header), then
after each reply the tokens that close it and open the next user and assistant messages.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pearl.errors import ConfigError
from pearl.models.tokenizer import Tokenizer

START, END = "<|im_start|>", "<|im_end|>"


class ChatFormat:
    def __init__(self, tokenizer: Tokenizer, template: str | None = None) -> None:
        start, end = tokenizer.token_id(START), tokenizer.token_id(END)
        if start is None or end is None:
            raise ConfigError(
                f"the tokenizer has no {START} / {END} tokens: it is not a ChatML model"
            )
        self.tokenizer = tokenizer
        self.end_id = end
        self.template = template
        """The model's Jinja chat template, when it has one (used to offer tools)."""

    @classmethod
    def from_folder(cls, folder: str | Path) -> ChatFormat:
        """The tokenizer and chat template of a model folder (``chat_template.jinja``, or
        ``tokenizer_config.json``'s ``chat_template``)."""
        folder = Path(folder)
        template = None
        if (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text()
        elif (folder / "tokenizer_config.json").is_file():
            found = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
            template = found if isinstance(found, str) else None
        return cls(Tokenizer(folder), template)

    @property
    def renders_tools(self) -> bool:
        """Whether the model's own template lays out tools (it reads a ``tools`` variable)."""
        return self.template is not None and "tools" in self.template

    def prompt(
        self,
        system: str,
        user: str,
        demonstration: tuple[tuple[str, str], ...] = (),
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """System message, an optional demonstration (earlier ``(role, text)`` messages that
        show the format), the user message, then the assistant's header. With ``tools``
        (function schemas): the model's template renders the conversation when it lays out
        tools itself; otherwise the system message lists them (``pearl.envs.tools``)."""
        if tools and self.renders_tools:
            return self.tokenizer.encode(self._render(system, user, demonstration, tools))
        if tools:
            system = tools_system_prompt(system, tools)
        shown = "".join(f"{START}{role}\n{text}{END}\n" for role, text in demonstration)
        return self.tokenizer.encode(
            f"{START}system\n{system}{END}\n{shown}{START}user\n{user}{END}\n{START}assistant\n"
        )

    def _render(self, system, user, demonstration, tools) -> str:
        messages = [
            {"role": "system", "content": system},
            *({"role": r, "content": t} for r, t in demonstration),
            {"role": "user", "content": user},
        ]
        return self.render_template(messages, tools)

    def render_template(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str:
        """``messages`` (Hugging Face chat format) through the model's own template, in a
        sandbox, ending with the assistant's header; ``ConfigError`` if it cannot."""
        from jinja2.exceptions import TemplateError  # live extra (torch's)
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        if self.template is None:
            raise ConfigError("the model has no chat template")

        def fail(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(
            x, ensure_ascii=False, indent=indent
        )
        env.globals["raise_exception"] = fail
        try:
            text = env.from_string(self.template).render(
                messages=messages, tools=tools, add_generation_prompt=True
            )
        except TemplateError as exc:
            raise ConfigError(f"the model's chat template failed to render: {exc}") from exc
        if not text.endswith(f"{START}assistant\n"):
            raise ConfigError(
                "the model's chat template does not end a prompt with a ChatML assistant "
                f"header ({START}assistant); PEARL appends turns in ChatML"
            )
        return text

    def render(self, messages: list[tuple[str, str]]) -> list[int]:
        """A whole conversation of ``(role, text)`` messages as the model's template lays it
        out (plain ChatML for a model without one), then the assistant's header."""
        if self.template is not None:
            chat = [{"role": r, "content": t} for r, t in messages]
            return self.tokenizer.encode(self.render_template(chat))
        shown = "".join(f"{START}{role}\n{text}{END}\n" for role, text in messages)
        return self.tokenizer.encode(f"{shown}{START}assistant\n")

    def append(self, reply: list[int], messages: list[tuple[str, str]]) -> list[int]:
        """What follows the model's ``reply`` in a conversation that goes on with
        ``messages`` (``(role, text)``): the reply's end token if it was cut off, the
        messages in ChatML, then the assistant's header."""
        close = [] if reply and reply[-1] == self.end_id else [self.end_id]
        shown = "".join(f"{START}{role}\n{text}{END}\n" for role, text in messages)
        return close + self.tokenizer.encode(f"\n{shown}{START}assistant\n")

    def next_turn(self, reply: list[int], observation: str) -> list[int]:
        """What follows the model's ``reply``: its end token if the reply was cut off, then
        the user message ``observation`` and the assistant's header."""
        return self.append(reply, [("user", observation)])

    def text(self, ids: list[int]) -> str:
        """A reply as text, without its end token."""
        if ids and ids[-1] == self.end_id:
            ids = ids[:-1]
        return self.tokenizer.decode(ids)


def turn_stop_ids(
    folder: str | Path, chat: ChatFormat, config_eos: tuple[int, ...]
) -> tuple[int, ...]:
    """The ids that end a reply: the chat format's end of turn, the model config's
    end-of-sequence ids and ``generation_config.json``'s (where the model folder has one),
    sorted. A model whose configured end-of-sequence id is not its chat end token would
    otherwise reply past ``<|im_end|>`` into turns it invents."""
    ids = {chat.end_id, *config_eos}
    path = Path(folder) / "generation_config.json"
    if path.is_file():
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
        eos = raw.get("eos_token_id") if isinstance(raw, dict) else None
        found = eos if isinstance(eos, list) else [] if eos is None else [eos]
        for tok in found:
            if not isinstance(tok, int) or isinstance(tok, bool) or tok < 0:
                raise ConfigError(
                    f"{path}: eos_token_id {eos!r} is not a token id or a list of them"
                )
            ids.add(tok)
    return tuple(sorted(ids))


def tools_system_prompt(system: str, tools: list[dict[str, Any]]) -> str:
    """``system`` followed by the tools and how to call them (for templates without tools)."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        f"{system}\n\n# Tools\n\nYou can call these functions:\n<tools>\n{listed}\n</tools>\n\n"
        "To call one, reply with a JSON object of its name and arguments inside "
        '<tool_call></tool_call> tags, for example:\n<tool_call>\n{"name": "NAME", '
        '"arguments": {"ARGUMENT": "VALUE"}}\n</tool_call>'
    )
