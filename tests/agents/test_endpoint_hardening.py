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

from pearl.agents import agent_call
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
    return None  # a posted reward would count; none is posted in time


@pytest.mark.parametrize("route", ["chat/completions", "reward"])
def test_a_call_whose_body_arrives_after_its_episode_ended_is_refused_and_joins_nothing(
    chat, route
):
    late = {}

    async def late_call(router, pool):
        await wait_for(lambda: hasattr(lingers, "config"))
        c, endpoint = lingers.config, run_agents.endpoint
        body_sent = asyncio.Event()
        messages = [*USER, {"role": "user", "content": "x"}]
        payload = {"model": c.model, "messages": messages} if route != "reward" else {"reward": 1}

        async def body():
            await body_sent.wait()
            yield json.dumps(payload).encode()

        async with httpx.AsyncClient(timeout=30) as http:
            call = asyncio.ensure_future(http.post(f"{c.base_url}/{route}", content=body()))
            await wait_for(lambda: endpoint.received == 2)  # looked up, its body not read
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

    lingers.__dict__.pop("config", None)
    lingers.go = asyncio.Event()
    (t,), endpoint, events = run_agents(chat, lingers, during=late_call)
    assert late["status"] == 404 and late["error"]["code"] == "episode_not_found"
    assert len(t.turns) == 1 and t.extra_samples == []
    assert t.stop_reason == "env_error" and "returned NoneType" in t.error  # no reward came
    assert late["homes"] == [None] * 6 and late["pinned"] == [0, 0]  # session and KV released


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


def heartbeat(gaps, agent):
    """A ``during`` that records the event loop's pauses (``gaps``) until ``agent`` has its
    error."""

    async def beat(router, pool):
        last = time.monotonic()
        while not hasattr(agent, "error"):
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    return beat


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

    (t,), _, _ = run_agents(chat, sends_a_huge_prompt, during=heartbeat(gaps, sends_a_huge_prompt))
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
            "reward huge": await http.post(
                url + "/reward", content=b'{"reward": 1' + b"0" * 400 + b"}"
            ),
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
    assert got["reward huge"][0] == 400 and got["reward huge"][1]["param"] == "reward"
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


async def calls_at_once(seed, c):
    """Thirty calls at once: each would start a segment of its own."""
    async with client(c) as llm:
        answers = await asyncio.gather(
            *(llm.chat.completions.create(model=c.model, messages=USER) for _ in range(30)),
            return_exceptions=True,
        )
    calls_at_once.refused = sum(isinstance(a, openai.APIStatusError) for a in answers)
    return 1.0


def test_concurrent_calls_cannot_pass_the_turn_budget(chat, monkeypatch):
    monkeypatch.setattr(episode_module, "END_GRACE_S", 30.0)
    (t,), _, _ = run_agents(chat, calls_at_once, max_turns=5)
    assert t.stop_reason == "max_turns" and len(t.turns) <= 5
    assert len(t.samples) <= 5 and calls_at_once.refused >= 25


def test_a_long_prompt_that_may_fit_is_tokenized_off_the_loop(chat, monkeypatch):
    """1.2 MB of text passes the bound under a 100k-token context (the tiny tokenizer's
    tokens are a byte or two), so it is tokenized: in a thread, the loop going on."""
    monkeypatch.setattr(episode_module, "END_GRACE_S", 30.0)
    gaps = []

    async def long_prompt(seed, c):
        async with client(c) as llm:
            await llm.chat.completions.create(model=c.model, messages=USER)
            try:
                text = [{"role": "user", "content": "hello world " * 100_000}]
                await llm.chat.completions.create(model=c.model, messages=text)
            except openai.BadRequestError as exc:
                long_prompt.error = exc.body
        return 1.0

    (t,), _, _ = run_agents(
        chat, long_prompt, during=heartbeat(gaps, long_prompt), max_context=100_000
    )
    assert long_prompt.error["message"].startswith("the prompt is 1200")  # it was tokenized
    assert t.stop_reason == "context_full"
    assert max(gaps) < 1.0  # on the loop: ~1.3 s here


async def waits_forever(seed, c):
    async with client(c, timeout=120) as llm:
        await llm.chat.completions.create(model=c.model, messages=USER)
    return 1.0


def test_an_episode_past_its_timeout_does_not_wait_for_its_call(chat):
    """Its call waits for workers that are gone; the episode ends on its timeout (plus the
    grace for calls in flight), not when the router gives up."""

    async def no_workers(router, pool):
        router.max_wait_s = 60.0  # before the fix the episode waited this long
        router.set_topology(colocated=[])

    started = time.monotonic()
    (t,), _, _ = run_agents(chat, waits_forever, during=no_workers, timeout_s=0.5)
    assert t.stop_reason == "env_timeout"
    assert time.monotonic() - started < 0.5 + episode_module.END_GRACE_S + 15


def test_an_agent_returning_a_number_past_floats_fails_only_its_episode(chat):
    async def huge(seed, c):
        async with client(c) as llm:
            await llm.chat.completions.create(model=c.model, messages=USER)
        return 10**400 if seed == 0 else {"reward": 1.0}

    (bad, good), _, _ = run_agents(chat, huge, episodes=2)
    assert bad.stop_reason == "env_error" and "expected a finite number" in bad.error
    assert good.stop_reason == "done" and good.reward == 1.0


def test_past_the_limit_of_left_threads_a_plain_agent_is_not_started(chat, monkeypatch):
    monkeypatch.setattr(agent_call, "MAX_LEFT_THREADS", 0)
    (t,), _, _ = run_agents(chat, plain_agent, timeout_s=5)
    assert t.stop_reason == "env_error" and "was not started" in t.error
