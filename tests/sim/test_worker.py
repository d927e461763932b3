"""The simulated worker: engine scheduler + cost model in virtual time, with fast-forward."""

import asyncio
import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.control.interfaces import TurnRequest, WorkerRole
from pearl.errors import EngineStateError
from pearl.sim.clock import run_virtual
from pearl.sim.worker import SimEngineConfig, SimulatedWorker


class LinearCost:
    """A stand-in cost model: fixed + per-token + per-context-token terms."""

    def iteration_time(self, prefills, decode_contexts):
        tokens = sum(n for n, _ in prefills) + len(decode_contexts)
        context = (
            sum(n * p + n * (n + 1) / 2 for n, p in prefills) * 1e-9 + sum(decode_contexts) * 1e-7
        )
        return 0.004 + tokens * 2e-5 + context

    def decode_time(self, batch_size, total_context):
        return 0.004 + batch_size * 2e-5 + total_context * 1e-7

    def decode_times(self, batch_size, total_context, steps):
        return [self.decode_time(batch_size, total_context + i * batch_size) for i in range(steps)]


def make_workload(seed, sessions, turns):
    rng = random.Random(seed)
    return [
        dict(
            sid=f"s{i}",
            start=rng.uniform(0, 0.5),
            prompt=rng.randint(5, 400),
            turns=[
                (rng.randint(1, 120), rng.randint(1, 80), rng.uniform(0.01, 0.4))
                for _ in range(turns)
            ],
        )
        for i in range(sessions)
    ]


async def run_sessions(worker, workload):
    """Each session: wait, then turns of (appended tokens, response tokens, env time)."""
    times = {}

    async def session(spec):
        await asyncio.sleep(spec["start"])
        context = [7] * spec["prompt"]
        for k, (obs, resp, env) in enumerate(spec["turns"]):
            context = context + [k + 3] * obs
            out = await worker.generate(
                TurnRequest(f"{spec['sid']}/{k}", spec["sid"], context, resp)
            )
            assert len(out.token_ids) == resp
            times[(spec["sid"], k)] = out.telemetry.finished_at
            context = context + out.token_ids
            await asyncio.sleep(env)

    await asyncio.gather(*(session(s) for s in workload))
    worker.close()
    return times


def simulate(workload, fast_forward, **cfg):
    async def main():
        config = SimEngineConfig(fast_forward=fast_forward, **cfg)
        worker = SimulatedWorker("w0", LinearCost(), config, vocab_size=1000)
        times = await run_sessions(worker, workload)
        return times, worker.counters

    return run_virtual(main)[0]


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    sessions=st.integers(1, 12),
    max_seqs=st.integers(2, 16),
    blocks=st.integers(120, 800),
    budget=st.integers(64, 1024),
    scheduling=st.sampled_from(["mixed", "sglang"]),
)
def test_fast_forward_gives_the_same_completion_times_as_stepping(
    seed, sessions, max_seqs, blocks, budget, scheduling
):
    workload = make_workload(seed, sessions, turns=3)
    cfg = dict(
        num_kv_blocks=blocks,
        block_size=16,
        max_num_seqs=max_seqs,
        max_num_batched_tokens=budget,
        chunked_prefill_size=budget,
        max_model_len=4096,
        scheduling=scheduling,
    )
    stepped, c_step = simulate(workload, False, **cfg)
    jumped, c_ff = simulate(workload, True, **cfg)
    assert stepped.keys() == jumped.keys()
    for key, t in stepped.items():
        assert jumped[key] == pytest.approx(t, rel=1e-9), key
    assert c_step.iterations == c_ff.iterations
    assert c_ff.fast_forwards > 0 or c_ff.iterations == c_step.iterations


def test_fast_forward_runs_far_fewer_engine_wakeups():
    workload = make_workload(1, 16, turns=4)
    stepped, c_step = simulate(workload, False)
    jumped, c_ff = simulate(workload, True)
    assert c_ff.fast_forwarded_iterations > 0.5 * c_ff.iterations
    assert max(jumped.values()) == pytest.approx(max(stepped.values()), rel=1e-9)


def test_turns_reuse_the_pinned_session_kv():
    async def main():
        worker = SimulatedWorker("w0", LinearCost(), SimEngineConfig(), vocab_size=1000)
        first = await worker.generate(TurnRequest("a/0", "a", [1] * 300, 20))
        second = await worker.generate(
            TurnRequest("a/1", "a", [1] * 300 + first.token_ids + [2] * 50, 20)
        )
        worker.close()
        return second

    second = run_virtual(main)[0]
    assert second.telemetry.prefill_tokens_cached == 319
    assert second.telemetry.prefill_tokens_computed == 51


def test_prefill_and_decode_workers_with_kv_import():
    async def main():
        p = SimulatedWorker(
            "p", LinearCost(), SimEngineConfig(), role=WorkerRole.PREFILL, vocab_size=1000
        )
        d = SimulatedWorker(
            "d", LinearCost(), SimEngineConfig(), role=WorkerRole.DECODE, vocab_size=1000
        )
        ctx = [1] * 200
        first = await p.prefill(TurnRequest("a/0/p", "a", ctx, 30))
        assert first.finish_reason == "prefilled" and len(first.token_ids) == 1
        assert await d.import_kv("a", ctx, 0, 200) == 200
        rest = await d.decode(TurnRequest("a/0/d", "a", ctx + first.token_ids, 29))
        p.close()
        d.close()
        return first.token_ids + rest.token_ids

    tokens = run_virtual(main)[0]
    assert len(tokens) == 30


def test_flush_on_weight_update_makes_continuing_sessions_re_prefill():
    async def turn_two(flush):
        cfg = SimEngineConfig(scheduling="sglang", flush_cache_on_weight_update=flush)
        worker = SimulatedWorker("w0", LinearCost(), cfg, vocab_size=1000)
        first = await worker.generate(TurnRequest("a/0", "a", [1] * 300, 20))
        await worker.sync_weights(1, 0.5)
        second = await worker.generate(
            TurnRequest("a/1", "a", [1] * 300 + first.token_ids + [2] * 50, 20)
        )
        worker.close()
        return second.telemetry

    kept = run_virtual(lambda: turn_two(False))[0]
    flushed = run_virtual(lambda: turn_two(True))[0]
    assert kept.prefill_tokens_computed == 51
    assert flushed.prefill_tokens_cached == 0 and flushed.prefill_tokens_computed == 370


def test_disaggregated_turns_survive_context_editing_without_retries():
    """Turn 2 drops turn 1's response (thinking stripped): the decode worker keeps the
    block-aligned common prefix and receives only what it lacks; nothing is retried."""
    from pearl.control.router import Router
    from pearl.sim.costmodel import CostModel
    from pearl.sim.hardware import get_gpu
    from pearl.sim.kv_mover import SimKVMover
    from pearl.sim.network import Network
    from pearl.sim.shapes import load_model_shape

    async def main():
        cost = CostModel(get_gpu("H800"), load_model_shape("Qwen3-8B"), tp=2)
        cfg = SimEngineConfig(block_size=16)
        p = SimulatedWorker("p", LinearCost(), cfg, role=WorkerRole.PREFILL, vocab_size=1000)
        d = SimulatedWorker("d", LinearCost(), cfg, role=WorkerRole.DECODE, vocab_size=1000)
        mover = SimKVMover(Network.for_gpu(cost.gpu, 1), cost, {"p": [0, 1], "d": [2, 3]})
        router = Router(mover)
        router.set_topology(prefill=[p], decode=[d])
        prompt = [5] * 100
        first = await router.run_turn(TurnRequest("a/0", "a", prompt, 40))
        before = mover.bytes_moved
        edited = prompt + first.token_ids[-3:] + [6] * 30  # thinking stripped, answer kept
        second = await router.run_turn(TurnRequest("a/1", "a", edited, 10))
        p.close()
        d.close()
        return first, second, mover.bytes_moved - before, router.transfer_retries, cost

    first, second, moved, retries, cost = run_virtual(main)[0]
    assert len(second.token_ids) == 10 and retries == 0
    common = 100  # the prompt; the kept answer differs from the response's first tokens
    assert moved == cost.kv_bytes(133 - common // 16 * 16)


@pytest.mark.parametrize("refuse", [True, False])
def test_the_live_twin_refuses_kv_of_other_weights_until_the_versions_agree(refuse):
    """Our live engine refuses a KV chunk exported under other weights (``LLMEngine.import_kv``)
    and the router retries the move; its twin does the same (``SimEngineConfig.mirroring``):
    a prefill worker already on v1 hands a turn to a decode worker still on v0, and the KV
    lands only once the decode worker has installed v1. A GPU engine's model accepts it."""
    from pearl.control.router import Router
    from pearl.errors import KVTransferError
    from pearl.sim.costmodel import CostModel
    from pearl.sim.hardware import get_gpu
    from pearl.sim.kv_mover import SimKVMover
    from pearl.sim.network import Network
    from pearl.sim.shapes import load_model_shape

    async def main():
        loop = asyncio.get_running_loop()
        cost = CostModel(get_gpu("H800"), load_model_shape("Qwen3-8B"), tp=2)
        cfg = SimEngineConfig(block_size=16, refuse_kv_of_other_weights=refuse)
        assert SimEngineConfig.mirroring(SimEngineConfig(), 2048).refuse_kv_of_other_weights
        p = SimulatedWorker("p", LinearCost(), cfg, WorkerRole.PREFILL, 1000, weight_version=1)
        d = SimulatedWorker("d", LinearCost(), cfg, WorkerRole.DECODE, 1000, weight_version=0)
        if refuse:  # refused as a whole: nothing of the chunk is held afterwards
            with pytest.raises(KVTransferError, match="weight version 1, worker d runs version 0"):
                await d.import_kv("z", [5] * 40, 0, 40, weights=1)
            assert await d.session_length("z") == 0
        router = Router(SimKVMover(Network.for_gpu(cost.gpu, 1), cost, {"p": [0], "d": [1]}))
        router.set_topology(prefill=[p], decode=[d])
        turn = asyncio.create_task(router.run_turn(TurnRequest("a/0", "a", [5] * 100, 40)))
        await asyncio.sleep(1.0)
        synced = loop.time()
        await d.sync_weights(1, 0.5)
        out = await turn
        p.close()
        d.close()
        return out, router.transfer_retries, synced

    out, retries, synced = run_virtual(main)[0]
    assert len(out.token_ids) == 40
    if refuse:
        assert retries >= 5 and out.telemetry.finished_at > synced + 0.5
        assert out.weight_version == 1 and out.tokens_by_version() == {(1, 1): 40}
    else:  # decoded at once by v0 on KV of v1 (what a GPU engine's model does here)
        assert retries == 0 and out.telemetry.finished_at < synced
        assert out.weight_version == 0 and (0, 1) in out.tokens_by_version()
        assert out.oldest_version == 0  # sampled by v0: the oldest it depended on


@pytest.mark.parametrize("fast_forward", [False, True])
def test_queries_answer_at_the_next_iteration_boundary_without_cutting_a_stretch(fast_forward):
    """In the live worker's twin, session_length / match_session and a KV export wait for the
    iteration in progress, as a live worker's engine lock makes them; a fast-forwarded
    decode stretch is not cut short by them."""

    async def main():
        loop = asyncio.get_running_loop()
        config = SimEngineConfig(fast_forward=fast_forward, calls_wait_for_iteration=True)
        worker = SimulatedWorker("w0", LinearCost(), config, vocab_size=1000)
        gen = asyncio.create_task(worker.generate(TurnRequest("a/0", "a", [1] * 100, 200)))
        await asyncio.sleep(0.1001)  # in the middle of the decode
        await worker.session_length("a")
        answered = loop.time()
        await worker.match_session("a", [1] * 100)
        matched = loop.time()
        await worker.export_kv("a", 0, 50)
        exported = loop.time()
        out = await gen
        worker.close()
        return answered, matched, out.telemetry.finished_at, worker.counters, exported

    runs = {ff: run_virtual(main)[0] for ff in (False, True)}
    answered, matched, finished, counters, exported = runs[fast_forward]
    step = LinearCost().decode_time(1, 200)  # about one decode iteration
    assert 0.1001 < answered < 0.1001 + 1.1 * step
    assert answered < matched <= answered + 1.1 * step  # the next boundary after that
    assert matched < exported <= matched + 1.1 * step
    # Same boundaries and the same finish with or without fast-forward ...
    assert answered == pytest.approx(runs[not fast_forward][0], rel=1e-9)
    assert finished == pytest.approx(runs[not fast_forward][2], rel=1e-9)
    if fast_forward:  # ... and the stretch ran whole: the prefill, then one decode stretch
        assert counters.fast_forwards == 1


def test_a_gpu_engines_queries_and_export_do_not_wait_for_the_iteration():
    """The default (a GPU serving engine: SGLang sends a prefilled request's KV right after
    the batch's forward) answers mid-iteration; the live twin waits for the boundary."""

    async def main(wait: bool):
        loop = asyncio.get_running_loop()
        config = SimEngineConfig(calls_wait_for_iteration=wait)
        assert SimEngineConfig.mirroring(config, 2048).calls_wait_for_iteration
        worker = SimulatedWorker("w0", LinearCost(), config, vocab_size=1000)
        gen = asyncio.create_task(worker.generate(TurnRequest("a/0", "a", [1] * 100, 200)))
        await asyncio.sleep(0.1001)
        await worker.session_length("a")
        await worker.match_session("a", [1] * 100)
        await worker.export_kv("a", 0, 50)
        done = loop.time()
        await gen
        worker.close()
        return done

    assert run_virtual(lambda: main(False))[0] == pytest.approx(0.1001, abs=1e-9)
    assert run_virtual(lambda: main(True))[0] > 0.1001 + 1e-6


def test_a_stopped_worker_keeps_its_counters_and_lets_its_engine_state_go():
    """A run keeps every worker it made (for time breakdowns): a stopped one must not hold
    its KV accounting and pinned sessions, and its session state is no longer observable."""

    async def main():
        worker = SimulatedWorker(
            "w0", LinearCost(), SimEngineConfig(num_kv_blocks=4096), vocab_size=1000
        )
        await worker.generate(TurnRequest("a/0", "a", [1] * 300, 20))
        held = await worker.session_length("a")
        iterations = worker.counters.iterations
        worker.close()
        with pytest.raises(EngineStateError, match="stopped"):
            await worker.session_length("a")
        return held, iterations, worker

    held, iterations, worker = run_virtual(main)[0]
    assert held == 319
    assert worker.counters.iterations == iterations > 0
    assert worker.blocks.num_blocks == 1 and not worker.scheduler.sessions


def test_a_turn_still_on_its_way_when_the_worker_switches_role_comes_back_aborted():
    """A turn picked for a colocated worker spends ``request_overhead_s`` on its way; a role
    switch that lands first (or a stop) must hand it back with nothing generated, as a live
    worker does, so the router resumes it on the new topology rather than the run failing."""

    async def main():
        cfg = SimEngineConfig(num_kv_blocks=4096, request_overhead_s=0.005)
        worker = SimulatedWorker("w0", LinearCost(), cfg, vocab_size=1000)
        stopped = SimulatedWorker("w1", LinearCost(), cfg, vocab_size=1000)
        turn = asyncio.ensure_future(worker.generate(TurnRequest("a/0", "a", [1] * 300, 20)))
        lost = asyncio.ensure_future(stopped.generate(TurnRequest("b/0", "b", [1] * 300, 20)))
        await asyncio.sleep(0.001)
        assert await worker.set_role(WorkerRole.DECODE) == []  # nothing in flight yet
        stopped.close()
        outs = await turn, await lost
        worker.close()
        return outs

    for out in run_virtual(main)[0]:
        assert out.finish_reason == "abort" and out.token_ids == []


@pytest.mark.parametrize("scheduling", ["sglang", "mixed"])
def test_without_cross_turn_reuse_every_turn_prefills_its_whole_prompt(scheduling):
    """``sim.cross_turn_reuse=none`` (docs/regime.md, Switches): no pinned session and no
    prefix-cache hit, so the engine computes every prompt token of every turn; the default
    (``prefix``) serves the earlier turns' KV. Through the config, as ``pearl simulate``."""
    from pearl.apps.sim_build import build_batch, build_cost_model, engine_config
    from pearl.config.simulate import load_simulate_config
    from pearl.control.deployment import Deployment
    from pearl.sim.fixed import simulate_fixed_rollout

    def run(*overrides):
        cfg = load_simulate_config(
            None,
            [
                "workload.profile=tiny",
                "workload.num_tasks=1",
                "workload.group_size=3",
                f"sim.scheduling={scheduling}",
                *overrides,
            ],
        )
        batch = build_batch(cfg)
        cost = build_cost_model(cfg)
        report = simulate_fixed_rollout(
            batch, cost, Deployment.parse("1C"), engine_config(cfg.sim), cost.model.vocab_size
        )
        prompts = sum(sum(t.context_lengths()) for t in batch.trajectories)
        assert report.prefill_tokens_computed + report.prefill_tokens_cached == prompts
        assert report.generated_tokens == sum(t.generated_tokens for t in batch.trajectories)
        return report, prompts

    reused, prompts = run()
    assert reused.prefill_tokens_cached > prompts / 2  # appended history: most is held
    none, _ = run("sim.cross_turn_reuse=none")
    assert none.prefill_tokens_cached == 0
    assert none.prefill_tokens_computed == prompts
    assert none.makespan_s > reused.makespan_s


def _engine_from_config(override: str) -> SimEngineConfig:
    """The engine a ``pearl simulate`` config with ``override`` builds, in blocks of 16."""
    from pearl.apps.sim_build import engine_config
    from pearl.config.simulate import load_simulate_config

    return dataclasses.replace(
        engine_config(load_simulate_config(None, [override]).sim), block_size=16
    )


def _one_prefill_one_decode(cfg: SimEngineConfig):
    """1P1D of ``cfg`` workers behind a router whose KV moves cost Qwen3-8B's bytes on H800
    (call inside the virtual loop): (cost model, prefill, decode, mover, router)."""
    from pearl.control.router import Router
    from pearl.sim.costmodel import CostModel
    from pearl.sim.hardware import get_gpu
    from pearl.sim.kv_mover import SimKVMover
    from pearl.sim.network import Network
    from pearl.sim.shapes import load_model_shape

    cost = CostModel(get_gpu("H800"), load_model_shape("Qwen3-8B"), tp=2)
    p = SimulatedWorker("p", LinearCost(), cfg, role=WorkerRole.PREFILL, vocab_size=1000)
    d = SimulatedWorker("d", LinearCost(), cfg, role=WorkerRole.DECODE, vocab_size=1000)
    mover = SimKVMover(Network.for_gpu(cost.gpu, 1), cost, {"p": [0, 1], "d": [2, 3]})
    router = Router(mover)
    router.set_topology(prefill=[p], decode=[d])
    return cost, p, d, mover, router


@pytest.mark.parametrize("keep", ["retain", "none"])
def test_without_decode_reuse_every_pd_turn_moves_its_whole_prompt(keep):
    """``sim.pd_decode_reuse=none`` (docs/regime.md, Switches): a decode worker keeps no
    session between turns, as SGLang's PD decode server (chunk cache), so every turn moves
    the KV of its whole prompt; the prefill worker keeps its cache. ``retain`` (default)
    moves only the tokens the decode worker lacks. Through the config, as ``pearl simulate``."""
    cfg = _engine_from_config(f"sim.pd_decode_reuse={keep}")

    async def main():
        cost, p, d, mover, router = _one_prefill_one_decode(cfg)
        context = [5] * 100
        turns = []
        for k in range(3):
            held = await d.session_length("a")
            before = mover.bytes_moved
            out = await router.run_turn(TurnRequest(f"a/{k}", "a", context, 20))
            turns.append((len(context), held, mover.bytes_moved - before, out.telemetry))
            context = context + out.token_ids + [6 + k] * 30  # an appended observation
        turns.append((0, await d.session_length("a"), 0, None))
        p.close()
        d.close()
        return turns, cost

    turns, cost = run_virtual(main)[0]
    for k, (prompt, held, moved, telemetry) in enumerate(turns[:3]):
        assert moved == cost.kv_bytes(prompt - held)
        if k:  # the prefill worker serves the earlier turns either way
            assert telemetry.prefill_tokens_cached > 0
        if keep == "none":
            assert held == 0  # nothing kept: the whole prompt moved
        elif k:
            assert prompt - held <= 31  # the observation (and the last sampled token)
    assert (turns[3][1] == 0) is (keep == "none")


@pytest.mark.parametrize("reuse", ["prefix", "none"])
def test_without_cross_turn_reuse_a_prefill_worker_prefills_every_turn_whole(reuse):
    """``sim.cross_turn_reuse=none`` holds on disaggregated workers too: the prefill worker
    pins a session only for its KV move, and each turn still computes its whole prompt, as a
    colocated turn does (otherwise a split would prefill less than colocation by the switch
    alone). Under ``prefix`` the earlier turns come from the pinned session."""
    cfg = _engine_from_config(f"sim.cross_turn_reuse={reuse}")

    async def main():
        cost, p, d, mover, router = _one_prefill_one_decode(cfg)
        context, seen = [5] * 100, []
        for k in range(3):
            out = await router.run_turn(TurnRequest(f"a/{k}", "a", context, 20))
            seen.append((len(context), out.telemetry))
            context = context + out.token_ids + [6 + k] * 30
        p.close()
        d.close()
        return seen

    seen = run_virtual(main)[0]
    for k, (prompt, telemetry) in enumerate(seen):
        assert telemetry.prefill_tokens_computed + telemetry.prefill_tokens_cached == prompt
        if reuse == "none" or k == 0:
            assert telemetry.prefill_tokens_cached == 0
        else:  # the previous prompt (the response was decoded on the decode worker)
            assert telemetry.prefill_tokens_cached == seen[k - 1][0]
