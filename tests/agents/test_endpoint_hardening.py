"""The agent endpoint against careless and hostile agents (issue 59): calls after their
episode ended, plain (blocking) agents, an endpoint stopped mid-call, prompts too large
to fit, odd bodies and methods, and a run-side failure that must not leak its text."""

import asyncio
import json
import logging
import threading
import time

import httpx
import openai
import pytest
from test_endpoint import USER, client, run_agents
from tiny_model import tiny_chat_tokenizer

from pearl.agents import episode as episode_module
from pearl.agents.endpoint import STOP_GRACE_S
from pearl.agents.messages import MAX_JSON_DEPTH
from pearl.control.interfaces import WorkerRole
from pearl.models.chat import ChatFormat
from pearl.models.tokenizer import Tokenizer
from pearl.sim.worker import SimulatedWorker


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    return ChatFormat(Tokenizer(tiny_chat_tokenizer(tmp_path_factory.mktemp("tok"))))


async def wait_for(predicate, limit_s=30.0):
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, "waited too long"
        await asyncio.sleep(0.01)


# -- 1. a call that reaches the endpoint before its episode ends, its body after ----------


async def lingers(seed, c):
    lingers.config = c
    async with client(c) as llm:
        await llm.chat.completions.create(model=c.model, messages=USER)
    await lingers.go.wait()  # the late call has been looked up by the endpoint
    return 1.0


def test_a_call_whose_body_arrives_after_its_episode_ended_is_refused_and_joins_nothing(chat):
    late = {}

    async def late_call(router, pool):
        await wait_for(lambda: hasattr(lingers, "config"))
        c = lingers.config
        body_sent = asyncio.Event()

        async def body():
            await body_sent.wait()
            yield json.dumps(
                {"model": c.model, "messages": [*USER, {"role": "user", "content": "x"}]}
            ).encode()

        async with httpx.AsyncClient(timeout=30) as http:
            call = asyncio.ensure_future(
                http.post(c.base_url + "/chat/completions", content=body())
            )
            await asyncio.sleep(0.5)  # its headers are read and its episode looked up
            lingers.go.set()  # the agent returns: its episode ends
            while (await http.get(c.base_url + "/models")).status_code == 200:
                await asyncio.sleep(0.01)
            body_sent.set()
            response = await call
        late["status"], late["error"] = response.status_code, response.json()["error"]
        late["homes"] = [
            router.home_of(s, role)
            for s in ("e0", "e0/s1")
            for role in (WorkerRole.COLOCATED, WorkerRole.PREFILL, WorkerRole.DECODE)
        ]
        late["pinned"] = [await pool[0].session_length(s) for s in ("e0", "e0/s1")]

    lingers.go = asyncio.Event()
    (t,), endpoint, events = run_agents(chat, lingers, during=late_call)
    assert late["status"] == 404 and late["error"]["code"] == "episode_not_found"
    assert t.stop_reason == "done" and len(t.turns) == 1 and t.extra_samples == []
    assert late["homes"] == [None] * 6 and late["pinned"] == [0, 0]  # session and KV released
    assert endpoint.calls == 2  # the late call was read, then refused


# -- 2. plain agents run in threads; a blocking async agent is named ----------------------


def plain_agent(seed, c):
    """The SDK's blocking client and a blocking wait: fine in a thread of its own. The two
    episodes meet at a barrier between their calls, which they pass only if both run at
    once (on the event loop, the first would block the endpoint and the other episode)."""
    llm = openai.OpenAI(base_url=c.base_url, api_key=c.api_key, max_retries=0, timeout=10)
    messages = list(USER)
    for _ in range(2):
        r = llm.chat.completions.create(model=c.model, messages=messages)
        messages += [r.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "user", "content": "more"}]
        plain_agent.barrier.wait()
    return 0.5


def test_plain_agents_run_in_threads_of_their_own(chat):
    plain_agent.barrier = threading.Barrier(2, timeout=20)
    results, _, events = run_agents(chat, plain_agent, episodes=2)
    assert events == []
    for t in results:
        assert t.stop_reason == "done" and t.reward == 0.5 and len(t.turns) == 2
        assert t.extra_samples == []  # the second call extended the first: one segment


def test_a_plain_agent_that_hangs_ends_on_its_timeout_and_its_thread_is_left(chat):
    release = threading.Event()

    def hangs(seed, c):
        release.wait(60)
        return 1.0

    started = time.monotonic()
    try:
        (t,), _, events = run_agents(chat, hangs, timeout_s=0.5)
    finally:
        release.set()
    assert t.stop_reason == "env_timeout" and "took more than 0.5 s" in t.error
    assert time.monotonic() - started < 10


def test_an_async_agent_that_blocks_the_loop_is_named_once(chat, caplog):
    async def blocks(seed, c):
        async with client(c) as llm:
            await llm.chat.completions.create(model=c.model, messages=USER)
            time.sleep(1.5)  # the mistake: a blocking call in an async def
            await llm.chat.completions.create(model=c.model, messages=USER)
            time.sleep(1.5)
        return 1.0

    with caplog.at_level(logging.WARNING, logger="pearl.agents.loop_watch"):
        (t,), _, _ = run_agents(chat, blocks)
    warnings = [r.getMessage() for r in caplog.records if r.name == "pearl.agents.loop_watch"]
    assert len(warnings) == 1, warnings
    assert "blocks" in warnings[0] and "blocked the event loop" in warnings[0]
    assert "time.sleep" in warnings[0] or "test_endpoint_hardening.py" in warnings[0]
    assert t.stop_reason == "done"


# -- 3. stopping the endpoint with a call in flight ------------------------------------


async def waits_for_a_worker(seed, c):
    async with client(c, timeout=60) as llm:
        await llm.chat.completions.create(model=c.model, messages=USER)
    return 1.0


def test_stopping_the_endpoint_with_a_call_waiting_for_workers_is_bounded(chat):
    took = {}

    async def stop_mid_call(router, pool):
        router.set_topology(colocated=[])  # the workers are gone: the call waits for one
        endpoint = run_agents.endpoint
        await wait_for(lambda: endpoint.calls == 1)
        await asyncio.sleep(0.2)
        started = time.monotonic()
        try:
            await asyncio.wait_for(endpoint.stop(), 30)  # unbounded, it never returned
        except TimeoutError:  # failed: take the server down so the test ends
            endpoint._server.force_exit = True
            endpoint._task.cancel()
        took["s"] = time.monotonic() - started

    (t,), _, _ = run_agents(chat, waits_for_a_worker, during=stop_mid_call)
    assert took["s"] < STOP_GRACE_S + 3
    assert t.stop_reason == "env_error" and not t.turns  # the agent saw its call fail


# -- 4. a prompt that cannot fit ---------------------------------------------------------


async def sends_a_huge_prompt(seed, c):
    async with client(c) as llm:
        await llm.chat.completions.create(model=c.model, messages=USER)
        try:
            huge = [{"role": "user", "content": "hello world " * 250_000}]  # 3 MB
            await llm.chat.completions.create(model=c.model, messages=huge)
        except openai.BadRequestError as exc:
            sends_a_huge_prompt.error = exc.body
    return 1.0


def test_a_prompt_that_cannot_fit_is_refused_without_blocking_the_loop(chat, monkeypatch):
    monkeypatch.setattr(episode_module, "END_GRACE_S", 30.0)
    gaps = []

    async def heartbeat(router, pool):
        last = time.monotonic()
        while not hasattr(sends_a_huge_prompt, "error"):
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    (t,), _, _ = run_agents(chat, sends_a_huge_prompt, during=heartbeat)
    assert sends_a_huge_prompt.error["code"] == "context_length_exceeded"
    assert "at least" in sends_a_huge_prompt.error["message"]
    assert t.stop_reason == "context_full" and len(t.turns) == 1
    assert max(gaps) < 1.0  # tokenizing 3 MB here takes ~3 s: it was not tokenized


# -- 5. what the endpoint accepts -------------------------------------------------------


async def odd_bodies(seed, c):
    url, headers = c.base_url, {"Authorization": f"Bearer {c.api_key}"}
    deep = b"[" * 5000 + b"]" * 5000
    nested = json.dumps({"model": c.model, "messages": USER, "tools": _deep(MAX_JSON_DEPTH)})
    async with httpx.AsyncClient(headers=headers) as http:
        got = {
            "deep chat": await http.post(url + "/chat/completions", content=deep),
            "deep tools": await http.post(url + "/chat/completions", content=nested.encode()),
            "deep reward": await http.post(url + "/reward", content=deep),
            "reward lots": await http.post(url + "/reward", json={"reward": "lots"}),
            "reward nan": await http.post(url + "/reward", content=b'{"reward": NaN}'),
            "reward extra": await http.post(url + "/reward", json={"reward": 1, "bonus": 2}),
            "options": await http.options(url + "/chat/completions"),
            "get chat": await http.get(url + "/chat/completions"),
            "elsewhere": await http.options(url + "/nowhere"),
        }
        head = await http.head(url + "/models")
        odd_bodies.got = {k: (r.status_code, r.json()["error"]) for k, r in got.items()}
        odd_bodies.head = head.status_code, head.headers.get("content-type")
        async with client(c) as llm:
            await llm.chat.completions.create(model=c.model, messages=USER)
        ok = await http.post(url + "/reward", json={"reward": 0.25})
        assert ok.status_code == 200, ok.text
    return None  # the posted reward counts


def _deep(depth):
    value: object = {}
    for _ in range(depth):
        value = {"x": value}
    return [value]


def test_odd_bodies_and_methods_get_openai_errors_and_the_episode_goes_on(chat):
    (t,), endpoint, events = run_agents(chat, odd_bodies)
    got = odd_bodies.got
    assert all(set(e) == {"message", "type", "param", "code"} for _, e in got.values())
    for name in ("deep chat", "deep tools", "deep reward"):
        assert got[name][0] == 400 and "nested more than" in got[name][1]["message"], name
    assert got["reward lots"][0] == 400 and got["reward lots"][1]["param"] == "reward"
    assert got["reward nan"][0] == 400 and got["reward extra"][1]["param"] == "bonus"
    assert got["options"][0] == 405 and got["options"][1]["code"] == "method_not_allowed"
    assert got["get chat"][0] == 405 and "use POST" in got["get chat"][1]["message"]
    assert got["elsewhere"][0] == 404
    assert odd_bodies.head == (405, "application/json")
    assert t.stop_reason == "done" and t.reward == 0.25 and events == []


class Broken(SimulatedWorker):
    async def generate(self, turn):
        raise RuntimeError("secret-internal-detail at /srv/private/path")


async def meets_a_broken_worker(seed, c):
    async with client(c) as llm:
        try:
            await llm.chat.completions.create(model=c.model, messages=USER)
        except openai.InternalServerError as exc:
            meets_a_broken_worker.error = exc.body
    return 1.0


def test_a_run_side_failure_is_a_500_that_leaks_nothing(chat, caplog):
    with caplog.at_level(logging.ERROR, logger="pearl.agents.endpoint"):
        run_agents(chat, meets_a_broken_worker, worker=Broken)
    error = meets_a_broken_worker.error
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    assert "secret" not in json.dumps(error) and "RuntimeError" not in json.dumps(error)
    ref = error["message"].split("ref ")[1].split(";")[0]
    logged = [r for r in caplog.records if ref in r.getMessage()]
    assert logged and "secret-internal-detail" in str(logged[0].exc_info[1])


async def retries_forever(seed, c):
    async with client(c) as llm:
        while True:  # the same request again and again: a new segment each time
            try:
                await llm.chat.completions.create(model=c.model, messages=USER)
            except openai.BadRequestError as exc:
                retries_forever.error = exc.body
                return 1.0


def test_an_agent_that_loops_ends_at_the_default_turn_budget(chat, monkeypatch):
    monkeypatch.setattr(episode_module, "END_GRACE_S", 30.0)
    monkeypatch.setattr(episode_module, "DEFAULT_MAX_TURNS", 12)  # 100 in a run: 8x the calls
    (t,), _, _ = run_agents(chat, retries_forever, max_turns=None, max_new_tokens=2)
    assert retries_forever.error["code"] == "max_turns"
    assert t.stop_reason == "max_turns" and len(t.turns) == 12
