"""Router and agent loop over simulated workers in virtual time."""

import asyncio
import dataclasses

import pytest

from pearl.control.agent_loop import AgentLoopConfig, run_trajectory
from pearl.control.interfaces import AsyncioClock, TurnRequest, WorkerRole
from pearl.control.router import NoWorkerAvailable, Router
from pearl.sim.clock import run_virtual
from pearl.sim.worker import SimEngineConfig, SimulatedWorker
from pearl.workloads.batch import Trajectory, Turn
from pearl.workloads.token_ids import context_token_ids


class FlatCost:
    def iteration_time(self, prefills, decode_contexts):
        return 0.01 + 1e-5 * (sum(n for n, _ in prefills) + len(decode_contexts))

    def decode_time(self, batch_size, total_context):
        return 0.01 + 1e-5 * batch_size

    def decode_times(self, batch_size, total_context, steps):
        return [self.decode_time(batch_size, total_context)] * steps


class InstantMover:
    def __init__(self):
        self.moves = []

    async def move(self, src, dst, session_id, token_ids, start, end):
        self.moves.append((src.worker_id, dst.worker_id, session_id, start, end))
        await dst.import_kv(session_id, token_ids, start, end)
        return (end - start) * 10, 0.0


def worker(wid, role=WorkerRole.COLOCATED):
    return SimulatedWorker(
        wid, FlatCost(), SimEngineConfig(num_kv_blocks=512), role=role, vocab_size=500
    )


def trajectory(task="t", index=0, turns=3):
    return Trajectory(
        task_id=task,
        index_in_group=index,
        turns=tuple(
            Turn(
                observation_tokens=40 if k == 0 else 15,
                response_tokens=8,
                response_tokens_kept=8,
                env_latency_s=0.5,
            )
            for k in range(turns)
        ),
    )


def test_colocated_sessions_stick_to_their_worker_and_spread_over_workers():
    async def main():
        workers = [worker("w0"), worker("w1")]
        router = Router()
        router.set_topology(colocated=workers)
        cfg = AgentLoopConfig(vocab_size=500)
        results = await asyncio.gather(
            *(run_trajectory(trajectory(index=i), router, AsyncioClock(), cfg) for i in range(4))
        )
        for w in workers:
            w.close()
        return results

    results = run_virtual(main)[0]
    for r in results:
        homes = {o.telemetry.decode_worker for o in r.turns}
        assert len(homes) == 1  # affinity across turns
        # turns after the first reuse the session's KV: only the 15 new + 8 response... tokens are computed
        assert all(o.telemetry.prefill_tokens_cached > 0 for o in r.turns[1:])
    assert {r.turns[0].telemetry.decode_worker for r in results} == {"w0", "w1"}


def test_disaggregated_turns_prefill_transfer_and_decode():
    async def main():
        p, d = worker("p0", WorkerRole.PREFILL), worker("d0", WorkerRole.DECODE)
        mover = InstantMover()
        router = Router(mover)
        router.set_topology(prefill=[p], decode=[d])
        r = await run_trajectory(
            trajectory(turns=3), router, AsyncioClock(), AgentLoopConfig(vocab_size=500)
        )
        p.close()
        d.close()
        return r, mover

    result, mover = run_virtual(main)[0]
    assert [len(o.token_ids) for o in result.turns] == [8, 8, 8]
    assert all(
        o.telemetry.prefill_worker == "p0" and o.telemetry.decode_worker == "d0"
        for o in result.turns
    )
    # First transfer sends the whole prompt; later ones only what the decode worker lacks.
    assert mover.moves[0][3:] == (0, 40)
    assert mover.moves[1][3] == 40 + 7  # D decoded 7 of the 8 response tokens itself
    assert mover.moves[1][4] == 40 + 8 + 15


def test_topology_change_rehomes_sessions_of_departed_workers():
    async def main():
        a, b = worker("a"), worker("b")
        router = Router()
        router.set_topology(colocated=[a])
        await router.run_turn(TurnRequest("r0", "s", [1] * 30, 4))
        router.set_topology(colocated=[b])
        out = await router.run_turn(TurnRequest("r1", "s", [1] * 40, 4))
        router.set_topology()
        router.max_wait_s = 30.0
        with pytest.raises(NoWorkerAvailable):  # after waiting 30 s for a worker
            await router.run_turn(TurnRequest("r2", "s", [1] * 50, 4))
        # A turn waiting through a reconfiguration proceeds once workers are back.
        late = asyncio.ensure_future(router.run_turn(TurnRequest("r3", "s", [1] * 50, 4)))
        await asyncio.sleep(5.0)
        router.set_topology(colocated=[a])
        assert len((await late).token_ids) == 4
        a.close()
        b.close()
        return out

    out = run_virtual(main)[0]
    assert out.telemetry.decode_worker == "b"


def test_invalid_topologies_are_rejected():
    router = Router()
    with pytest.raises(ValueError, match="prefill and one decode"):
        router.set_topology(prefill=[worker("p", WorkerRole.PREFILL)])
    with pytest.raises(ValueError, match="KV mover"):
        router.set_topology(
            prefill=[worker("p", WorkerRole.PREFILL)], decode=[worker("d", WorkerRole.DECODE)]
        )


def test_a_turn_cut_short_by_a_shrink_resumes_elsewhere_without_losing_tokens():
    async def main():
        a, b = worker("a"), worker("b")
        router = Router()
        router.set_topology(colocated=[a])
        turn = asyncio.ensure_future(router.run_turn(TurnRequest("r0", "s", [1] * 40, 50)))
        await asyncio.sleep(0.2)  # ~20 decode iterations in
        router.set_topology(colocated=[b])  # stop routing to a, then take its GPUs
        partials = await a.abort_all()
        out = await turn
        a.close()
        b.close()
        return partials, out, router

    partials, out, router = run_virtual(main)[0]
    (partial,) = partials
    assert partial.finish_reason == "abort" and 0 < len(partial.token_ids) < 50
    assert len(out.token_ids) == 50 and len(out.logprobs) == 50
    assert out.token_ids[: len(partial.token_ids)] == partial.token_ids  # nothing generated is lost
    assert out.telemetry.decode_worker == "b" and router.turns_resumed == 1


def test_a_prefill_worker_gone_before_its_kv_moved_hands_the_turn_back_to_resume():
    """The prefill worker stops between its prefill and the KV move (shrunk or failed):
    the move cannot export, the first token is handed back and the turn resumes on the
    current prefill worker instead of retrying a move from a worker that is gone."""

    class LeavingMover(InstantMover):
        def __init__(self, router, replacement):
            super().__init__()
            self.router, self.replacement = router, replacement

        async def move(self, src, dst, session_id, token_ids, start, end):
            if src.worker_id == "p0":  # p0 leaves just as its KV is asked for
                self.router.set_topology(prefill=[self.replacement], decode=[dst])
                src.close()
                await src.export_kv(session_id, start, end)  # raises: p0 is stopped
            await src.export_kv(session_id, start, end)
            return await super().move(src, dst, session_id, token_ids, start, end)

    async def main():
        p0, p1 = worker("p0", WorkerRole.PREFILL), worker("p1", WorkerRole.PREFILL)
        d = worker("d0", WorkerRole.DECODE)
        router = Router()
        router.kv_mover = mover = LeavingMover(router, p1)
        router.set_topology(prefill=[p0], decode=[d])
        out = await asyncio.wait_for(router.run_turn(TurnRequest("r0", "s", [1] * 40, 8)), 60)
        for w in (p1, d):
            w.close()
        return out, router, mover

    out, router, mover = run_virtual(main)[0]
    assert len(out.token_ids) == 8 and len(out.logprobs) == 8
    assert out.telemetry.prefill_worker == "p1" and out.telemetry.decode_worker == "d0"
    assert router.turns_resumed == 1 and router.transfer_retries == 1
    assert [m[:2] for m in mover.moves] == [("p1", "d0")]


@pytest.mark.parametrize("new_role", [WorkerRole.PREFILL, WorkerRole.DECODE])
def test_a_colocated_turn_that_lands_after_its_worker_switched_role_resumes_whole(new_role):
    """2C -> 1P1D while a turn is on its way (``request_overhead_s``) to a worker that now
    prefills (it would stop at the first token) or decodes (it holds no KV for the turn):
    the turn still comes back whole, resumed on the new topology."""

    async def main():
        cfg = SimEngineConfig(num_kv_blocks=512, request_overhead_s=0.005)
        a, b = (SimulatedWorker(w, FlatCost(), cfg, vocab_size=500) for w in "ab")
        router = Router(InstantMover())
        router.set_topology(colocated=[a])
        turn = asyncio.ensure_future(router.run_turn(TurnRequest("r0", "s", [1] * 40, 20)))
        await asyncio.sleep(0.001)  # picked a, still on its way there
        other = WorkerRole.DECODE if new_role is WorkerRole.PREFILL else WorkerRole.PREFILL
        router.set_topology()
        await asyncio.gather(a.set_role(new_role), b.set_role(other))
        p, d = (a, b) if new_role is WorkerRole.PREFILL else (b, a)
        router.set_topology(prefill=[p], decode=[d])
        out = await asyncio.wait_for(turn, 60)
        a.close()
        b.close()
        return out

    out = run_virtual(main)[0]
    assert len(out.token_ids) == 20 and len(out.logprobs) == 20
    assert out.finish_reason == "length"


class RecordingRouter(Router):
    def __init__(self):
        super().__init__()
        self.contexts = []

    async def run_turn(self, turn):
        self.contexts.append(list(turn.token_ids))
        return await super().run_turn(turn)


def test_agent_loop_reports_and_re_prefills_what_a_collapsed_observation_edits():
    """Window of 2 observations: at turn 3 observation 1 collapses to 2 tokens, so the
    context diverges inside it and everything after is prefilled again."""
    traj = dataclasses.replace(trajectory(turns=4), observation_window=2)
    traj = dataclasses.replace(traj, collapsed_observation_tokens=2)

    async def main():
        w = SimulatedWorker(
            "w", FlatCost(), SimEngineConfig(num_kv_blocks=512, block_size=16), vocab_size=500
        )
        router = RecordingRouter()
        router.set_topology(colocated=[w])
        result = await run_trajectory(traj, router, AsyncioClock(), AgentLoopConfig(500))
        w.close()
        return result, router.contexts

    result, contexts = run_virtual(main)[0]
    # Every context is the workload's own definition of it, given the generated responses.
    responses = [o.token_ids for o in result.turns]
    for k, ctx in enumerate(contexts):
        assert ctx == context_token_ids(traj, k, 500, responses=responses[:k])
    assert result.appended_tokens[:3] == [40, 15, 15]
    # turn 3: previous context 40+8+15+8+15; new 40+8+(2)+8+15+8+15, common prefix 50
    assert result.appended_tokens[3] + result.kept_tokens[3] == 96 - 50
    # The worker reuses whole cached blocks up to the edit (48 tokens) and computes the rest.
    assert result.turns[3].telemetry.prefill_tokens_computed == 96 - 48


def test_without_keep_tokens_a_trajectory_keeps_counts_and_telemetry_not_token_ids():
    """The simulator's setting: turns keep no ids (memory), everything counted is the same."""
    traj = dataclasses.replace(trajectory(turns=4), observation_window=2)

    async def main(keep: bool):
        w = SimulatedWorker("w", FlatCost(), SimEngineConfig(num_kv_blocks=512), vocab_size=500)
        router = Router()
        router.set_topology(colocated=[w])
        config = AgentLoopConfig(500, keep_tokens=keep)
        result = await run_trajectory(traj, router, AsyncioClock(), config)
        w.close()
        return result

    kept, dropped = (run_virtual(lambda k=k: main(k))[0] for k in (True, False))
    assert [len(o.token_ids) for o in kept.turns] == kept.generated == [8, 8, 8, 8]
    assert dropped.generated == kept.generated and dropped.generated_tokens == 32
    assert all(o.token_ids == [] and o.logprobs == [] for o in dropped.turns)
    assert [o.telemetry for o in dropped.turns] == [o.telemetry for o in kept.turns]
    assert (dropped.appended_tokens, dropped.kept_tokens, dropped.context_tokens) == (
        kept.appended_tokens,
        kept.kept_tokens,
        kept.context_tokens,
    )
