"""An agent's calls as token sequences, without re-tokenizing what the model said.

Each call sends the whole conversation as messages. When they extend a conversation this
episode already had (its earlier messages, then the assistant message PEARL returned,
then new ones), the prompt is that conversation's token ids (the sampled ids as sampled)
followed by the new messages rendered: the model is trained on exactly the tokens it
produced. Decoding a reply and encoding it again can give other ids (a byte-level
tokenizer's merges, or text that spells a special token), which would train the model on
tokens it never sampled.

A call that does not extend one (a retry of the same request, an edited history, a second
agent, a call while the same conversation has one in flight) starts a new segment: its
prompt is rendered whole, earlier assistant text included as prompt (not trained on
there). Every segment becomes its own training sample with the episode's reward; nothing
is merged silently. Model tokens are trained once, in the segment that sampled them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pearl.agents.messages import Message, canonical, flatten, template_messages
from pearl.models.chat import ChatFormat


@dataclass(slots=True)
class Segment:
    """One linear conversation: its tokens, loss mask and behaviour log-probabilities."""

    index: int
    tools_key: str
    messages: list[tuple] = field(default_factory=list)  # canonical, the last reply included
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    busy: bool = False  # a call on it is in flight
    calls: int = 0


@dataclass(slots=True, frozen=True)
class NewTurn:
    """A call whose segment is chosen (and busy) and whose prompt is not rendered yet."""

    segment: Segment
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    canonical: tuple[tuple, ...]


@dataclass(slots=True, frozen=True)
class OpenTurn:
    """A call's prompt: the segment it continues (or starts) and the ids to prefill."""

    segment: Segment
    prompt: list[int]
    appended: int  # prompt tokens new to the segment (all of them for a new segment)
    messages: tuple[tuple, ...]  # the request's canonical messages


class Conversation:
    """An episode's segments (module docstring)."""

    def __init__(self, chat: ChatFormat) -> None:
        self.chat = chat
        self.segments: list[Segment] = []

    def open(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> OpenTurn:
        """The prompt for a call with ``messages`` and the ``tools`` it offers; its segment
        is busy until ``close`` or ``cancel``."""
        return self.render(self.start(messages, tools))

    def start(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> NewTurn:
        """``open``'s first half, cheap: the segment the call continues (or a new one), made
        busy. ``render`` then tokenizes; a failure between the two must ``cancel``."""
        canon = tuple(canonical(m) for m in messages)
        key = json.dumps(tools, sort_keys=True) if tools else ""
        extended = [
            s
            for s in self.segments
            if s.calls
            and not s.busy
            and s.tools_key == key
            and len(canon) > len(s.messages)
            and canon[: len(s.messages)] == tuple(s.messages)
        ]
        if extended:
            segment = max(extended, key=lambda s: len(s.messages))
        else:
            segment = Segment(len(self.segments), key)
            self.segments.append(segment)
        segment.busy = True
        return NewTurn(segment, messages, tools, canon)

    def render(self, new: NewTurn) -> OpenTurn:
        """``open``'s second half: the prompt's ids. It reads only the busy segment, which
        nothing else changes, so it may run in another thread (a long prompt)."""
        segment, messages, tools = new.segment, new.messages, new.tools
        if segment.calls:
            appended = self.chat.append(
                segment.token_ids, flatten(messages[len(segment.messages) :], None)
            )
            prompt = segment.token_ids + appended
        elif tools and self.chat.renders_tools:  # the model's own layout of tools
            text = self.chat.render_template(template_messages(messages), tools)
            prompt = appended = self.chat.tokenizer.encode(text)
        else:
            prompt = appended = self.chat.render(flatten(messages, tools))
        return OpenTurn(segment, prompt, len(appended), new.canonical)

    def cancel(self, turn: OpenTurn | NewTurn) -> None:
        """The call failed: the segment is as before it (a segment it started stays empty)."""
        turn.segment.busy = False

    def close(
        self, turn: OpenTurn, reply: list[int], logprobs: list[float], returned: Message
    ) -> None:
        """Record the turn: its prompt's new tokens (not trained on), the ``reply`` as
        sampled (trained on) and ``returned``, the assistant message the agent got."""
        s = turn.segment
        if len(reply) != len(logprobs):
            raise ValueError(f"{len(reply)} reply tokens with {len(logprobs)} logprobs")
        new = turn.prompt[len(s.token_ids) :]
        s.token_ids = turn.prompt + reply
        s.loss_mask += [0] * len(new) + [1] * len(reply)
        s.logprobs += [0.0] * len(new) + list(logprobs)
        s.messages = [*turn.messages, canonical(returned)]
        s.busy = False
        s.calls += 1

    @property
    def used(self) -> list[Segment]:
        """The segments with at least one reply, in the order they started."""
        return [s for s in self.segments if s.calls]
