"""Unmodified agents on the official ``openai`` SDK, through the real endpoint (FastAPI on
uvicorn), the control plane's router and simulated workers in wall-clock time: exact
tokens, grouping into segments, errors, failures that end an episode, and security."""

import asyncio
import dataclasses
import json
import os
import re
import sys

import httpx
import openai
import pytest
from flat_cost import FlatCost
from tiny_model import tiny_chat_tokenizer

from pearl.agents import episode as episode_module
from pearl.agents.endpoint import AgentEndpoint
from pearl.agents.episode import AgentEpisode
from pearl.agents.plugin import AgentOptions
from pearl.control.agent_loop import AgentLoopConfig
from pearl.control.episode import EpisodeBatch, run_episode_batch
from pearl.control.interfaces import AsyncioClock
from pearl.control.router import Router
from pearl.errors import ConfigError
from pearl.models.chat import ChatFormat
from pearl.models.tokenizer import Tokenizer
from pearl.sim.worker import SimEngineConfig, SimulatedWorker

VOCAB = 258  # the tiny byte-level tokenizer's bytes and ChatML's two special tokens


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    return ChatFormat(Tokenizer(tiny_chat_tokenizer(tmp_path_factory.mktemp("tok"))))


def run_agents(
    chat,
    agent,
    episodes=1,
    max_turns=None,
    max_context=4096,
    timeout_s=30.0,
    api_key=None,
    during=None,
    workers=1,
    worker=SimulatedWorker,
    max_new_tokens=12,
    built_in=None,
):
    """Run ``episodes`` of ``agent`` (seeds 0..) as one batch; ``during(router, workers)``
    runs alongside (a topology change); ``built_in(seed)``, when given, makes each episode
    a built-in environment's instead. Returns (results, endpoint, events)."""
    events = []

    async def main():
        endpoint = run_agents.endpoint = AgentEndpoint("pearl-policy", api_key=api_key)
        await endpoint.start()
        cfg = SimEngineConfig(num_kv_blocks=1024)
        pool = [worker(f"w{k}", FlatCost(0.002), cfg, vocab_size=VOCAB) for k in range(workers)]
        router = Router()
        router.set_topology(colocated=pool[:1])
        batch = EpisodeBatch(
            [
                (
                    f"e{k}",
                    built_in(k)
                    if built_in
                    else AgentEpisode(
                        agent, k, f"g{k}", chat, endpoint, timeout_s, log=events.append
                    ),
                )
                for k in range(episodes)
            ],
            max_new_tokens=max_new_tokens,
            max_context_tokens=max_context,
            max_turns=max_turns,
        )
        side = asyncio.ensure_future(during(router, pool)) if during else None
        try:
            config = AgentLoopConfig(vocab_size=VOCAB, stop_token_ids=(chat.end_id,))
            result = await run_episode_batch(batch, router, AsyncioClock(), config)
        finally:
            if side is not None:
                await side
            await endpoint.stop()
            for w in pool:
                w.close()
        return result.trajectories, endpoint

    results, endpoint = asyncio.run(main())
    return results, endpoint, events


def client(c, **kw):
    return openai.AsyncOpenAI(base_url=c.base_url, api_key=c.api_key, max_retries=0, **kw)


USER = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]


async def two_turns(seed, c):
    """Sends back what it got, as SDK agents do, then asks again; keeps the ids it got."""
    async with client(c) as llm:
        seen = []
        messages = list(USER)
        for _ in range(2):
            r = await llm.chat.completions.create(
                model=c.model, messages=messages, extra_body={"return_token_ids": True}
            )
            extra = r.model_extra or {}
            seen.append((extra["prompt_token_ids"], r.choices[0].model_extra["token_ids"]))
            messages += [r.choices[0].message.model_dump(exclude_none=True)]
            messages += [{"role": "user", "content": "more"}]
        two_turns.seen[seed] = seen
        return 0.75


two_turns.seen = {}


def test_an_sdk_agent_trains_on_the_ids_it_was_sampled_in_one_segment(chat):
    results, endpoint, events = run_agents(chat, two_turns, episodes=2)
    assert events == [] and endpoint.calls == 4
    for k, t in enumerate(results):
        assert t.stop_reason == "done" and t.reward == 0.75 and t.extra_samples == []
        (p1, r1), (p2, r2) = two_turns.seen[k]
        assert [out.token_ids for out in t.turns] == [r1, r2]
        assert p2[: len(p1) + len(r1)] == p1 + r1  # the next prompt extends the sampled ids
        sample = t.sample
        assert list(sample.token_ids) == p2 + r2 and sample.group == f"g{k}"
        trained = [i for i, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m]
        assert trained == r1 + r2
        assert [lp for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m] == [
            *t.turns[0].logprobs,
            *t.turns[1].logprobs,
        ]


async def retrying(seed, c):
    """Samples the same first step twice: two segments, never merged."""
    async with client(c) as llm:
        await llm.chat.completions.create(model=c.model, messages=USER)
        await llm.chat.completions.create(model=c.model, messages=USER)
    return {"reward": 1.0, "success": True}


async def parallel(seed, c):
    async with client(c) as llm:
        await asyncio.gather(
            *(llm.chat.completions.create(model=c.model, messages=USER) for _ in range(3))
        )
    return 1.0


@pytest.mark.parametrize("agent, segments", [(retrying, 2), (parallel, 3)])
def test_calls_that_do_not_extend_a_conversation_are_samples_of_their_own(chat, agent, segments):
    (t,), _, _ = run_agents(chat, agent)
    samples = t.samples
    assert len(samples) == segments and t.stop_reason == "done"
    assert all(s.reward == 1.0 and s.success and s.group == "g0" for s in samples)
    assert sum(sum(s.loss_mask) for s in samples) == sum(len(o.token_ids) for o in t.turns)


async def misbehaving(seed, c):
    """Every malformed call gets an OpenAI error object; the episode goes on."""
    url = c.base_url
    headers = {"Authorization": f"Bearer {c.api_key}"}
    async with httpx.AsyncClient(headers=headers) as http:
        post = lambda body, path="/chat/completions", **kw: http.post(  # noqa: E731
            url + path, content=body, **kw
        )
        good = {"model": c.model, "messages": USER}
        got = {
            "json": await post(b"{not json"),
            "model": await post(json.dumps({**good, "model": "gpt-9"}).encode()),
            "n": await post(json.dumps({**good, "n": 2}).encode()),
            "choice": await post(json.dumps({**good, "tool_choice": "required"}).encode()),
            "image": await post(
                json.dumps(
                    {
                        **good,
                        "messages": [{"role": "user", "content": [{"type": "image_url"}]}],
                    }
                ).encode()
            ),
            "big": await post(b"x" * (5 << 20)),
            "route": await post(b"{}", "/completions"),
        }
        misbehaving.got = {k: (r.status_code, r.json()["error"]) for k, r in got.items()}
        models = await http.get(url + "/models")
        misbehaving.models = models.json()
        ok = await post(json.dumps(good).encode())
        assert ok.status_code == 200, ok.text
    return 1.0


def test_bad_requests_get_openai_errors_and_the_episode_goes_on(chat):
    (t,), endpoint, events = run_agents(chat, misbehaving)
    got = misbehaving.got
    assert got["json"][0] == 400 and "not valid JSON" in got["json"][1]["message"]
    assert got["model"][0] == 404 and got["model"][1]["code"] == "model_not_found"
    assert got["n"][0] == 400 and got["n"][1]["param"] == "n"
    assert got["choice"][0] == 400 and "tool_choice" in got["choice"][1]["message"]
    assert got["image"][0] == 400 and "only text parts" in got["image"][1]["message"]
    assert got["big"][0] == 413 and got["route"][0] == 404
    assert all(set(e) == {"message", "type", "param", "code"} for _, e in got.values())
    assert misbehaving.models["data"][0]["id"] == "pearl-policy"
    assert t.stop_reason == "done" and t.reward == 1.0 and len(t.turns) == 1 and events == []


async def raises(seed, c):
    async with client(c) as llm:
        await llm.chat.completions.create(model=c.model, messages=USER)
    raise KeyError("oops")


async def hangs(seed, c):
    await asyncio.sleep(3600)


async def never_calls(seed, c):
    return 1.0


async def says_yes(seed, c):
    async with client(c) as llm:
        await llm.chat.completions.create(model=c.model, messages=USER)
    return "yes"


# Only the hanging agent gets a short timeout: the others call the model, which on a busy
# host can take longer than half a second, and must fail for their own reason.
@pytest.mark.parametrize(
    "agent, timeout_s, reason, message",
    [
        (raises, 60.0, "env_error", "raised KeyError: 'oops'"),
        (hangs, 0.5, "env_timeout", "took more than 0.5 s"),
        (never_calls, 60.0, "env_error", "returned without calling the model"),
        (says_yes, 60.0, "env_error", "returned str; expected a finite number"),
    ],
)
def test_an_agent_that_fails_ends_its_episode_not_the_run(chat, agent, timeout_s, reason, message):
    (t,), _, events = run_agents(chat, agent, timeout_s=timeout_s)
    assert t.stop_reason == reason and t.reward == 0.0 and message in t.error
    assert all(s.stop_reason == reason and s.reward == 0.0 for s in t.samples)
    assert events and events[0]["kind"] == reason and events[0]["seed"] == 0


async def chatty(seed, c):
    """Goes on until refused; what it saw is kept."""
    async with client(c) as llm:
        messages = list(USER)
        while True:
            try:
                r = await llm.chat.completions.create(model=c.model, messages=messages)
            except openai.BadRequestError as exc:
                chatty.error = exc.body
                raise
            messages += [r.choices[0].message.model_dump(exclude_none=True)]
            messages += [{"role": "user", "content": "x" * 40}]


@pytest.mark.parametrize(
    "limits, reason, code",
    [
        ({"max_turns": 3}, "max_turns", "max_turns"),
        ({"max_context": 160}, "context_full", "context_length_exceeded"),
    ],
)
def test_a_budget_ends_the_episode_with_what_it_did_so_far(chat, limits, reason, code, monkeypatch):
    # The agent sees the refusal, keeps it and returns; a busy host may take a while.
    monkeypatch.setattr(episode_module, "END_GRACE_S", 30.0)
    chatty.error = None
    (t,), _, _ = run_agents(chat, chatty, **limits)
    assert chatty.error["code"] == code
    assert t.stop_reason == reason and t.reward == 0.0 and t.turns
    assert len(t.sample.token_ids) <= limits.get("max_context", 4096)
    assert sum(t.sample.loss_mask) == sum(len(o.token_ids) for o in t.turns)


async def leaks_its_url(seed, c):
    leaks_its_url.config = c
    async with client(c) as llm:
        await llm.chat.completions.create(model=c.model, messages=USER)
    return 1.0


def test_an_ended_episodes_url_is_refused(chat):
    results = []

    async def after(router, pool):
        deadline = asyncio.get_running_loop().time() + 60  # bounded: a hang fails, not stalls
        while not hasattr(leaks_its_url, "config"):
            assert asyncio.get_running_loop().time() < deadline, "the agent never started"
            await asyncio.sleep(0.01)
        c = leaks_its_url.config
        while True:  # once the episode has ended
            assert asyncio.get_running_loop().time() < deadline, "the URL was never refused"
            async with httpx.AsyncClient() as http:
                r = await http.post(
                    c.base_url + "/chat/completions", json={"model": c.model, "messages": USER}
                )
            if r.status_code != 200:
                results.append((r.status_code, r.json()["error"]["code"]))
                return
            await asyncio.sleep(0.05)

    run_agents(chat, leaks_its_url, during=after)
    assert results[0] in [(404, "episode_not_found"), (409, "episode_ended")]


async def streams(seed, c):
    async with client(c) as llm:
        stream = await llm.chat.completions.create(model=c.model, messages=USER, stream=True)
        chunks = [chunk async for chunk in stream]
    streams.text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    streams.finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1]
    return 1.0


def test_a_streaming_agent_gets_the_turn_as_events(chat):
    (t,), _, _ = run_agents(chat, streams)
    assert streams.text == chat.text(t.turns[0].token_ids)
    assert streams.finish in ("stop", "length")


def test_a_turn_cut_by_a_topology_change_reaches_the_agent_as_one_answer(chat):
    """A worker leaves mid-turn (preemption): the router resumes the turn elsewhere and the
    agent sees one answer, with the ids it was sampled in."""

    cut = []

    async def preempt(router, pool):
        a, b = pool
        while not a.scheduler.running:
            await asyncio.sleep(0.001)
        router.set_topology(colocated=[b])
        cut.extend(await a.abort_all())

    (t,), _, events = run_agents(chat, two_turns, during=preempt, workers=2)
    assert cut, "no turn was in flight on the leaving worker: nothing was cut"
    assert events == [] and t.stop_reason == "done"
    (p1, r1), (p2, r2) = two_turns.seen[0]
    assert [o.token_ids for o in t.turns] == [r1, r2]


def test_off_loopback_the_endpoint_needs_a_key_and_checks_it(chat):
    with pytest.raises(ConfigError, match="needs api_key"):
        AgentOptions.parse({"agent": "m:f", "host": "0.0.0.0"})
    assert AgentOptions.parse({"agent": "m:f", "host": "0.0.0.0", "api_key": "k" * 12})

    async def wrong_key(seed, c):
        async with httpx.AsyncClient() as http:
            body = {"model": c.model, "messages": USER}
            r = await http.post(c.base_url + "/chat/completions", json=body)
            wrong_key.status = r.status_code, r.json()["error"]["code"]
        async with client(c) as llm:  # with the key it was given
            await llm.chat.completions.create(model=c.model, messages=USER)
        return 1.0

    (t,), _, _ = run_agents(chat, wrong_key, api_key="s3cret-key")
    assert wrong_key.status == (401, "invalid_api_key") and t.stop_reason == "done"


NOT_A_FUNCTION = 1.0


@pytest.mark.parametrize(
    "options, message",
    [
        ({"agent": "tests_agents_nowhere:f"}, "module 'tests_agents_nowhere' not found"),
        ({"agent": f"{__name__}:NOT_A_FUNCTION"}, "is a float, not a function"),
        ({"agent": f"{__name__}:two_turns", "kwargs": {"x": 1}}, "cannot be called"),
        ({"agent": f"{__name__}:two_turns", "timeout": 3}, "env.options.timeout"),
        ({}, "env.options.agent: Field required"),
    ],
)
def test_a_bad_agent_option_fails_before_the_run_with_what_is_valid(options, message):
    with pytest.raises(ConfigError, match=message):
        AgentOptions.parse(options).load()


OTHER_PROCESS = """
import json, sys, httpx, openai
base_url, key, model = sys.argv[1:]
llm = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
llm.chat.completions.create(model=model, messages=json.loads(sys.stdin.read()))
httpx.post(base_url + "/reward", json={"reward": 0.5, "success": True},
           headers={"Authorization": f"Bearer {key}"}).raise_for_status()
"""


async def in_another_process(seed, c):
    """The agent runs in a process of its own and reports its reward to the endpoint."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        OTHER_PROCESS,
        c.base_url,
        c.api_key,
        c.model,
        stdin=asyncio.subprocess.PIPE,
    )
    await proc.communicate(json.dumps(USER).encode())
    assert proc.returncode == 0


def test_an_agent_in_another_process_posts_its_reward(chat):
    (t,), _, events = run_agents(chat, in_another_process)
    assert events == [] and t.stop_reason == "done" and len(t.turns) == 1
    assert t.reward == 0.5 and t.sample.success


class CalculatorModel(SimulatedWorker):
    """A simulated worker that answers as a model that knows the calculator task: it calls
    ``calculate`` on the question, then answers the tool's result (its replies replace the
    sampled stand-ins; the tiny tokenizer is byte-level, so any text is tokens)."""

    chat: ChatFormat

    async def generate(self, turn):
        out = await super().generate(turn)
        tok = self.chat.tokenizer
        last = tok.decode(turn.token_ids).rsplit("<|im_start|>user\n", 1)[1]
        if "<tool_response>" in last:
            reply = f"<answer>{last.split('<tool_response>')[1].split('<')[0].strip()}</answer>"
        else:
            expression = re.search(r"What is (.*?)\?", last).group(1)
            call = {"name": "calculate", "arguments": {"expression": expression}}
            reply = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        ids = [*tok.encode(reply), self.chat.end_id]
        return dataclasses.replace(out, token_ids=ids, logprobs=[-0.5] * len(ids))


def test_an_agents_sdk_agent_runs_its_tool_loop_through_the_endpoint(chat):
    """The second framework (OpenAI Agents SDK): its runner calls the model, runs the
    function tool, and sends the conversation back in a form the endpoint recognizes as
    the same conversation, so the episode is one trajectory on the sampled ids."""
    from pearl.agents.examples.calculator_agents_sdk import solve

    model = type("Model", (CalculatorModel,), {"chat": chat})
    results, endpoint, events = run_agents(
        chat, solve, episodes=2, worker=model, max_new_tokens=200
    )
    assert events == [] and endpoint.calls == 4
    for t in results:
        assert t.stop_reason == "done" and t.reward == 1.0 and t.extra_samples == []
        assert len(t.turns) == 2
        sample = t.sample
        trained = [i for i, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m]
        assert trained == [*t.turns[0].token_ids, *t.turns[1].token_ids]
        text = chat.tokenizer.decode(list(sample.token_ids))
        assert '"name": "calculate"' in text and "<tool_response>" in text


def test_an_agent_samples_as_the_built_in_environment_on_the_same_seeds(chat):
    """The calculator agent (``<calc>`` variant) and the built-in environment make the same
    requests, hence draw the same sampling seeds: a comparison of the two on the same tasks
    differs only by what the endpoint does, not by luck. (The simulated workers' tokens
    follow the request, so equal requests give equal replies.)"""
    from pearl.agents.examples.calculator import solve
    from pearl.envs.calculator import CalculatorEnv
    from pearl.live.episodes import TextEpisode

    async def tag_agent(seed, c):
        return await solve(seed, c, tool_format="tag")

    agent, _, _ = run_agents(chat, tag_agent, episodes=2)
    ours, _, _ = run_agents(
        chat,
        None,
        episodes=2,
        built_in=lambda k: TextEpisode(CalculatorEnv(tool_format="tag"), k, chat, f"g{k}"),
    )
    for a, b in zip(agent, ours, strict=True):
        assert [o.request_id for o in a.turns] == [o.request_id for o in b.turns]
        assert [o.token_ids for o in a.turns] == [o.token_ids for o in b.turns]
        assert list(a.sample.token_ids) == list(b.sample.token_ids)
        assert a.reward == b.reward


class SweModel(SimulatedWorker):
    """A simulated worker that answers as a model that can do the tier-0 SWE tasks in
    mini-swe-agent's text format: the sed command the issue spells out, then the submit
    command; ``submits=False``: it only ever lists files (the agent's step limit ends it)."""

    chat: ChatFormat
    submits = True
    block = "bash"

    async def generate(self, turn):
        out = await super().generate(turn)
        text = self.chat.tokenizer.decode(turn.token_ids)
        last = text.rsplit("<|im_start|>user\n", 1)[1]
        # The task's issue comes after the worked example's (PEARL's settings show one).
        fix = re.findall(r"Replace `(.*?)` with `(.*?)` in `(.*?)`", last)[-1:]
        if not self.submits:
            command = "ls"
        elif fix:
            command = "sed -i 's/{}/{}/' {}".format(*fix[0])
        else:
            command = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
        reply = f"THOUGHT: next step.\n\n```{self.block}\n{command}\n```"
        ids = [*self.chat.tokenizer.encode(reply), self.chat.end_id]
        return dataclasses.replace(out, token_ids=ids, logprobs=[-0.5] * len(ids))


@pytest.mark.parametrize(
    "submits, config",
    [(True, "pearl"), (False, "pearl"), (True, "mini_textbased")],
    ids=["submits", "step-limit", "its-own-config"],
)
def test_mini_swe_agent_fixes_a_task_in_the_sandbox_as_one_trajectory(chat, submits, config):
    """mini-swe-agent, unmodified: its litellm model calls the endpoint, its commands run in
    the episode's sandbox through its environment protocol, and it resends its history in a
    form the endpoint recognizes as one conversation (one trajectory on the sampled ids).
    The hidden tests score the tree: 1 for the fix, 0 when it only looked around."""
    pytest.importorskip("minisweagent")
    from pearl.agents.examples.mini_swe_agent import solve

    def agent(seed, c):
        return solve(seed, c, tier=0, step_limit=3, config=config)

    block = "bash" if config == "pearl" else "mswea_bash_command"
    model = type("Model", (SweModel,), {"chat": chat, "submits": submits, "block": block})
    results, endpoint, events = run_agents(
        chat, agent, episodes=2, worker=model, max_new_tokens=200, max_context=32768
    )
    assert events == []
    for t in results:
        assert t.stop_reason == "done" and t.extra_samples == []
        assert (t.reward, t.sample.success) == ((1.0, True) if submits else (0.0, False))
        assert len(t.turns) == (2 if submits else 3)
        sample = t.sample
        trained = [i for i, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m]
        assert trained == [i for out in t.turns for i in out.token_ids]
        text = chat.tokenizer.decode(list(sample.token_ids))
        assert "<returncode>0</returncode>" in text
        assert ("Please solve this issue" in text) == (config == "mini_textbased")


def test_mini_swe_agent_saves_its_trajectories_without_the_endpoints_key(chat, tmp_path):
    pytest.importorskip("minisweagent")
    from pearl.agents.examples.mini_swe_agent import solve

    def agent(seed, c):
        return solve(seed, c, tier=0, step_limit=3, trajectories=str(tmp_path))

    model = type("Model", (SweModel,), {"chat": chat})
    key = "a-key-of-this-run"
    (t, u), _, events = run_agents(
        chat, agent, episodes=2, worker=model, max_new_tokens=200, max_context=32768, api_key=key
    )
    assert events == [] and t.reward == u.reward == 1.0
    saved = sorted(p.name for p in tmp_path.iterdir())
    assert saved == ["0-0.traj.json", "1-0.traj.json"]
    for path in tmp_path.iterdir():
        record = json.loads(path.read_text())
        assert record["info"]["exit_status"] == "Submitted"
        assert key not in path.read_text() and "<endpoint key>" in path.read_text()


def test_mini_swe_agent_names_the_configs_it_can_take():
    pytest.importorskip("minisweagent")
    from pearl.agents.episode import ClientConfig
    from pearl.agents.examples.mini_swe_agent import solve

    with pytest.raises(ValueError, match=r"'nope': no such file; give 'pearl'.*mini_textbased"):
        solve(0, ClientConfig("http://127.0.0.1:1/v1", "none", "m"), config="nope")


async def drops_its_reply(seed, c):
    """As mini-swe-agent after a reply it cannot parse: the next call resends the first
    prompt plus a complaint, without the reply. Keeps both prompts' ids."""
    async with client(c) as llm:
        prompts = []
        for messages in (USER, [*USER, {"role": "user", "content": "format error"}]):
            r = await llm.chat.completions.create(
                model=c.model, messages=messages, extra_body={"return_token_ids": True}
            )
            prompts.append((r.model_extra or {})["prompt_token_ids"])
        drops_its_reply.prompts = prompts
    return 0.0


def test_each_call_is_recorded_as_the_sessions_growth_for_the_replay(chat):
    """rollouts.jsonl's per-turn shape (what the simulator replays): a call that extends
    the last one keeps its reply and appends the rest; one that resends the last prompt
    without the reply keeps nothing and appends only what follows that prompt (not its
    whole prompt again, which the replay would prefill anew)."""
    (t,), _, _ = run_agents(chat, two_turns)
    (p1, r1), (p2, _) = two_turns.seen[0]
    assert t.appended_tokens == [len(p1), len(p2) - len(p1) - len(r1)]
    assert t.kept_tokens[1] == len(r1)
    (d,), _, _ = run_agents(chat, drops_its_reply)
    assert len(d.samples) == 2  # two segments
    first, second = drops_its_reply.prompts
    common = len(os.path.commonprefix([first, second]))
    assert common > len(first) // 2  # the first prompt, bar its assistant header
    assert d.appended_tokens == [len(first), len(second) - common]
    assert d.kept_tokens[1] == 0


def test_without_mini_swe_agent_the_run_is_refused_before_it_starts(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "minisweagent" else find_spec(n, *a)
    )
    monkeypatch.delitem(sys.modules, "pearl.agents.examples.mini_swe_agent", raising=False)
    options = AgentOptions.parse({"agent": "pearl.agents.examples.mini_swe_agent:solve"})
    with pytest.raises(ConfigError, match=r"pip install 'pearl-rollout\[swe\]'"):
        options.load()
