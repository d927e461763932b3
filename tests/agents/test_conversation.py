"""An agent's calls as token segments: sampled ids kept as sampled, new messages rendered,
anything that does not extend a conversation a new segment."""

import asyncio

import pytest

from pearl.agents.conversation import Conversation
from pearl.agents.messages import ChatRequest, Message
from pearl.agents.replies import make_reply
from pearl.envs.calculator import CalculatorEnv
from pearl.live.episodes import TextEpisode
from pearl.models.chat import ChatFormat
from pearl.models.tokenizer import Tokenizer

SMOL_TEMPLATE = (  # SmolLM2-135M-Instruct's chat template (no tools)
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


TOOLS_TEMPLATE = (  # a template that lays out tools itself (as Qwen's do)
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if loop.first and tools %}\nTools: {% for t in tools %}{{ t | tojson }}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}"
)


def merging_tokenizer(folder):
    """Byte-level BPE with one merge, ``a`` + ``b`` -> ``ab``: the text "ab" has two
    spellings in ids, and encoding picks the merged one."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab["ab"] = len(vocab)
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok.save(str(folder / "tokenizer.json"))
    return Tokenizer(folder)


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    return ChatFormat(merging_tokenizer(tmp_path_factory.mktemp("tok")))


def msgs(*pairs):
    return [Message(role=r, content=c) for r, c in pairs]


def reply(chat, conv, turn, ids):
    """Close ``turn`` with the sampled ``ids`` (plus the end token); the message returned."""
    ids = ids + [chat.end_id]
    out = make_reply(chat, ids, [-0.5] * len(ids), False, [], None)
    conv.close(turn, out.token_ids, out.logprobs, out.message)
    return out.message


def test_a_conversation_that_goes_on_keeps_the_sampled_ids_where_re_tokenizing_differs(chat):
    tok = chat.tokenizer
    a, b = tok.encode("a")[0], tok.encode("b")[0]
    assert tok.encode("ab") != [a, b]  # the text the model wrote re-encodes otherwise
    conv = Conversation(chat)
    first = msgs(("system", "sys"), ("user", "say ab"))
    t1 = conv.open(first, None)
    assert t1.prompt == tok.encode(
        "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nsay ab<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    answer = reply(chat, conv, t1, [a, b])
    assert answer.content == "ab"
    # The agent sends back what it got (as an SDK dumps it), then a new user message.
    echoed = Message.model_validate({**answer.model_dump(), "refusal": None})
    t2 = conv.open([*first, echoed, *msgs(("user", "again"))], None)
    assert t2.segment is t1.segment and len(conv.segments) == 1
    sampled = t1.prompt + [a, b, chat.end_id]
    assert t2.prompt[: len(sampled)] == sampled  # the ids as sampled, not tok.encode("ab")
    assert tok.decode(t2.prompt[len(sampled) :]) == (
        "\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    )
    # What a proxy that re-rendered the text would have trained on instead:
    rendered = chat.render([("system", "sys"), ("user", "say ab"), ("assistant", "ab")])
    assert rendered[: len(t1.prompt) + 1] != sampled[: len(t1.prompt) + 1]
    reply(chat, conv, t2, [a])
    (segment,) = conv.used
    assert segment.token_ids == t2.prompt + [a, chat.end_id]
    assert [i for i, m in zip(segment.token_ids, segment.loss_mask, strict=True) if m] == [
        a,
        b,
        chat.end_id,
        a,
        chat.end_id,
    ]
    assert sum(segment.loss_mask) == sum(1 for lp in segment.logprobs if lp == -0.5)


def test_what_does_not_extend_a_conversation_starts_a_segment_of_its_own(chat):
    tok = chat.tokenizer
    conv = Conversation(chat)
    first = msgs(("user", "hi"))
    t1 = conv.open(first, None)
    answer = reply(chat, conv, t1, tok.encode("yo"))
    # A retry of the same request, an edited answer, another tool set: new segments.
    retry = conv.open(first, None)
    edited = conv.open([*first, *msgs(("assistant", "hello"), ("user", "x"))], None)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    other = conv.open([*first, answer, *msgs(("user", "x"))], tools)
    assert len({t.segment.index for t in (t1, retry, edited, other)}) == 4
    # The edited history is prompt in its segment: rendered whole, nothing trained on.
    assert edited.prompt == chat.render([("user", "hi"), ("assistant", "hello"), ("user", "x")])
    assert edited.appended == len(edited.prompt)


def test_a_call_while_its_conversation_has_one_in_flight_branches(chat):
    conv = Conversation(chat)
    first = msgs(("user", "hi"))
    t1 = conv.open(first, None)
    answer = reply(chat, conv, t1, chat.tokenizer.encode("yo"))
    follow = [*first, answer, *msgs(("user", "go on"))]
    t2 = conv.open(follow, None)  # in flight
    t3 = conv.open(follow, None)  # a parallel sample of the same step
    assert t2.segment is t1.segment and t3.segment is not t1.segment
    conv.cancel(t3)  # failed: its segment holds nothing and is never trained on
    reply(chat, conv, t2, [5])
    assert [s.index for s in conv.used] == [t1.segment.index]


@pytest.mark.parametrize("template", [SMOL_TEMPLATE, TOOLS_TEMPLATE], ids=["smollm2", "tools"])
def test_the_calculator_agent_sees_the_tokens_the_built_in_environment_gives(chat, template):
    """The calculator agent's messages (system, demonstration, task, tools as JSON schema),
    rendered here, are token for token the built-in environment's prompt with
    ``tool_format: json``, and so is the turn after a tool call: with SmolLM2's template
    (tools listed in the system message) and with one that lays out tools itself."""
    env = CalculatorEnv(tool_format="json")
    chat = ChatFormat(chat.tokenizer, template)
    assert chat.renders_tools == (template is TOOLS_TEMPLATE)
    episode = TextEpisode(CalculatorEnv(tool_format="json"), 5, chat, "g")
    built_in = asyncio.run(episode.start())
    task = asyncio.run(env.reset(5))
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": env.system_prompt},
            *({"role": r, "content": t} for r, t in env.demonstration),
            {"role": "user", "content": task},
        ],
        "tools": env.tools,
    }
    request = ChatRequest.model_validate(body)
    conv = Conversation(chat)
    turn = conv.open(request.messages, request.offered_tools)
    assert turn.prompt == built_in
    call = chat.tokenizer.encode(
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1+2"}}\n</tool_call>'
    ) + [chat.end_id]
    out = make_reply(chat, call, [0.0] * len(call), False, [], request.offered_tools)
    assert out.finish_reason == "tool_calls" and out.message.content is None
    conv.close(turn, out.token_ids, out.logprobs, out.message)
    (tool_call,) = out.message.tool_calls
    nxt = ChatRequest.model_validate(
        {
            **body,
            "messages": [
                *body["messages"],
                out.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": tool_call.id, "content": "3"},
            ],
        }
    )
    turn2 = conv.open(nxt.messages, nxt.offered_tools)
    appended, _, _ = asyncio.run(episode.respond(call))
    assert turn2.prompt == built_in + call + appended


def test_stop_strings_cut_the_reply_and_the_trajectory_after_the_stop(chat):
    tok = chat.tokenizer
    ids = tok.encode("one END two") + [chat.end_id]
    out = make_reply(chat, ids, [-1.0] * len(ids), False, ["END"], None)
    assert out.message.content == "one " and out.finish_reason == "stop"
    assert tok.decode(out.token_ids) == "one END" and len(out.logprobs) == len(out.token_ids)
    cut = make_reply(chat, tok.encode("one two"), [-1.0] * 7, True, [], None)
    assert cut.finish_reason == "length" and cut.message.content == "one two"


def test_the_tag_calculator_agent_sees_the_tokens_the_built_in_environment_gives(chat):
    """Without tools (``tool_format: tag``): the agent's prompt, and the turn after a
    ``<calc>`` reply it answers with the calculator's result, are token for token the
    built-in environment's."""
    env = CalculatorEnv(tool_format="tag")
    chat = ChatFormat(chat.tokenizer, SMOL_TEMPLATE)
    episode = TextEpisode(CalculatorEnv(tool_format="tag"), 5, chat, "g")
    built_in = asyncio.run(episode.start())
    messages = [
        {"role": "system", "content": env.system_prompt},
        *({"role": r, "content": t} for r, t in env.demonstration),
        {"role": "user", "content": asyncio.run(env.reset(5))},
    ]
    request = ChatRequest.model_validate({"model": "m", "messages": messages})
    conv = Conversation(chat)
    turn = conv.open(request.messages, request.offered_tools)
    assert turn.prompt == built_in
    call = chat.tokenizer.encode("<calc>1+2</calc>") + [chat.end_id]
    out = make_reply(chat, call, [0.0] * len(call), False, [], None)
    conv.close(turn, out.token_ids, out.logprobs, out.message)
    step = asyncio.run(env.step(out.message.content))
    assert step.observation == "Result: 3" and not step.done
    nxt = ChatRequest.model_validate(
        {
            "model": "m",
            "messages": [
                *messages,
                out.message.model_dump(exclude_none=True),
                {"role": "user", "content": step.observation},
            ],
        }
    )
    turn2 = conv.open(nxt.messages, nxt.offered_tools)
    appended, _, _ = asyncio.run(episode.respond(call))
    assert turn2.prompt == built_in + call + appended
