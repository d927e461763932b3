"""Inter-scale rebuilder on simulated workers in virtual time."""

import asyncio

from pearl.control.agent_loop import AgentLoopConfig
from pearl.control.interfaces import AsyncioClock, WorkerRole
from pearl.control.pipeline import WeightSync
from pearl.control.rebuilder import InterScaleRebuilder
from pearl.control.rollout import run_rollout_batch
from pearl.control.router import Router
from pearl.control.state import WorkerStatus, WorkerTable, Zone
from pearl.sim.clock import run_virtual
from pearl.sim.worker import SimEngineConfig, SimulatedWorker
from pearl.workloads.agentic import generate_batch
from pearl.workloads.profiles import get_profile


class FlatCost:
    def iteration_time(self, prefills, decode_contexts):
        return 0.02 + 1e-5 * (sum(n for n, _ in prefills) + len(decode_contexts))

    def decode_time(self, batch_size, total_context):
        return 0.02 + 1e-5 * batch_size

    def decode_times(self, batch_size, total_context, steps):
        return [self.decode_time(batch_size, total_context)] * steps


class CheckedWorker(SimulatedWorker):
    """Fails the test if a turn reaches it while the table says it must not get one."""

    table: WorkerTable
    slot_id: int

    async def generate(self, turn):
        slot = self.table.snapshot().slot(self.slot_id)
        assert slot.status is WorkerStatus.ACTIVE and slot.role is WorkerRole.COLOCATED, slot
        return await super().generate(turn)


class Factory:
    def __init__(self, table, prepare_s=30.0, fail=()):
        self.table, self.prepare_s, self.fail = table, prepare_s, set(fail)
        self.started, self.stopped = [], []

    async def start(self, slot, role):
        await asyncio.sleep(self.prepare_s)
        if slot.slot_id in self.fail:
            raise RuntimeError(f"slot {slot.slot_id} failed to initialize")
        w = CheckedWorker(
            f"w{slot.slot_id}",
            FlatCost(),
            SimEngineConfig(num_kv_blocks=2048),
            role=role,
            vocab_size=1000,
        )
        w.table, w.slot_id = self.table, slot.slot_id
        self.started.append(slot.slot_id)
        return w

    async def stop(self, slot_id, worker):
        worker.close()
        self.stopped.append(slot_id)


def setup(fail=()):
    table = WorkerTable()
    slots = [
        table.add_slot([2 * i, 2 * i + 1], Zone.DEDICATED, WorkerRole.COLOCATED) for i in range(4)
    ]
    router = Router()
    factory = Factory(table, fail=fail)
    rebuilder = InterScaleRebuilder(
        table, router, factory, weight_version=lambda: 3, sync_seconds=lambda n: 2.0, finalize_s=5.0
    )
    return table, slots, router, factory, rebuilder


def test_shrink_and_expand_while_a_batch_runs():
    batch = generate_batch(get_profile("game"), num_tasks=1, group_size=8, seed=0)
    table, slots, router, factory, rebuilder = setup()

    async def main():
        assert await rebuilder.expand(
            {slots[0]: WorkerRole.COLOCATED, slots[1]: WorkerRole.COLOCATED}
        )
        run = asyncio.ensure_future(
            run_rollout_batch(batch, router, AsyncioClock(), AgentLoopConfig(1000))
        )
        await asyncio.sleep(1.0)
        partials = await rebuilder.shrink([slots[1]])  # preempted mid-batch
        t0 = asyncio.get_running_loop().time()
        assert await rebuilder.expand(
            {slots[2]: WorkerRole.COLOCATED, slots[3]: WorkerRole.COLOCATED}
        )
        admitted = asyncio.get_running_loop().time() - t0
        result = await run
        for w in list(rebuilder.workers.values()):
            w.close()
        return partials, admitted, result

    partials, admitted, result = run_virtual(main)[0]
    assert abs(admitted - (30.0 + 2.0 + 5.0)) < 1e-9  # prepare, weight sync, finalize
    assert any(p.finish_reason == "abort" for p in partials)
    # Every trajectory completed exactly once, every turn with its full response.
    assert sorted(t.session_id for t in result.trajectories) == sorted(
        f"{t.task_id}/{t.index_in_group}" for t in batch.trajectories
    )
    for traj in result.trajectories:
        for out, turn in zip(traj.turns, traj.trajectory.turns, strict=True):
            assert len(out.token_ids) == turn.response_tokens
    assert router.turns_resumed >= 1
    # Counted: one shrink, of one worker, that was serving the turns it cut short.
    assert rebuilder.busy_shrinks == rebuilder.workers_shrunk == rebuilder.busy_workers_shrunk == 1
    assert rebuilder.turns_cut_by_shrinks == len(partials)
    snap = table.snapshot()
    assert [snap.slot(s).status for s in slots] == [
        WorkerStatus.ACTIVE,
        WorkerStatus.INACTIVE,
        WorkerStatus.ACTIVE,
        WorkerStatus.ACTIVE,
    ]
    assert factory.stopped == [slots[1]]


def test_expansion_is_all_or_nothing():
    table, slots, router, factory, rebuilder = setup(fail={"never"})
    factory.fail = {slots[3]}

    async def main():
        ok = await rebuilder.expand(
            {slots[2]: WorkerRole.COLOCATED, slots[3]: WorkerRole.COLOCATED}
        )
        return ok

    ok = run_virtual(main)[0]
    assert ok is False and rebuilder.expansions_cancelled == 1
    snap = table.snapshot()
    assert (
        snap.slot(slots[2]).status is WorkerStatus.INACTIVE
        and snap.slot(slots[3]).status is WorkerStatus.INACTIVE
    )
    assert factory.stopped == [slots[2]]  # the one that did start is released
    assert router.colocated == []


def test_role_switch_mid_batch_from_colocated_to_disaggregated():
    batch = generate_batch(get_profile("game"), num_tasks=1, group_size=8, seed=0)
    table, slots, _, factory, _ = setup()

    class InstantMover:
        async def move(self, src, dst, session_id, token_ids, start, end):
            await dst.import_kv(session_id, token_ids, start, end)
            return (end - start) * 4, 0.0

    router = Router(InstantMover())
    rebuilder = InterScaleRebuilder(table, router, factory, lambda: 0, lambda n: 0.0)

    async def main():
        await rebuilder.expand({slots[0]: WorkerRole.COLOCATED, slots[1]: WorkerRole.COLOCATED})
        run = asyncio.ensure_future(
            run_rollout_batch(batch, router, AsyncioClock(), AgentLoopConfig(1000))
        )
        await asyncio.sleep(2.0)
        handed = await rebuilder.reassign(
            {slots[0]: WorkerRole.PREFILL, slots[1]: WorkerRole.DECODE}
        )
        result = await run
        for w in rebuilder.workers.values():
            w.close()
        return handed, result

    handed, result = run_virtual(main)[0]
    assert router.disaggregated
    for traj in result.trajectories:
        assert [len(o.token_ids) for o in traj.turns] == [
            t.response_tokens for t in traj.trajectory.turns
        ]
    late_turns = [
        o
        for t in result.trajectories
        for o in t.turns
        if o.telemetry.prefill_worker == "w0" and o.telemetry.decode_worker == "w1"
    ]
    assert late_turns  # turns after the switch went prefill -> decode


def test_a_role_switch_goes_on_when_a_worker_it_switches_died_meanwhile():
    """Two failures at once: the survivors' switch (a failed worker's shrink) also reaches a
    worker that died since and not yet reported. The live ones switch; the dead one's call
    raises and is left to its own failure report, instead of failing the first one's."""
    table, slots, router, factory, rebuilder = setup()

    async def main():
        three = {s: WorkerRole.COLOCATED for s in slots[:3]}
        assert await rebuilder.expand(three)
        rebuilder.workers[slots[2]].close()  # its process dies
        partials = await rebuilder.reassign(
            {slots[0]: WorkerRole.PREFILL, slots[1]: WorkerRole.DECODE, slots[2]: WorkerRole.DECODE}
        )
        roles = [rebuilder.workers[s].role for s in slots[:2]]
        for w in list(rebuilder.workers.values()):
            w.close()
        return partials, roles

    partials, roles = run_virtual(main)[0]
    assert partials == [] and roles == [WorkerRole.PREFILL, WorkerRole.DECODE]


def test_a_joiner_misses_no_weights_trained_while_it_switches_role_at_admission():
    """The race behind a chaos run's StalenessError: a replacement worker caught up with the
    newest weights, then took its role at admission (a call to the worker) while the trainer
    published a newer version and the regular sync pushed it to the *active* workers only.
    The joiner was admitted one version behind. Admission now checks the version again with
    no await between that check and the worker becoming active."""
    table, slots, router, factory, _ = setup()
    version = {"trained": 3}

    class SlowSwitch(CheckedWorker):
        async def set_role(self, role):
            await asyncio.sleep(1.0)  # the call's round trip, during which v4 is trained
            return await super().set_role(role)

    async def start(slot, role):
        await asyncio.sleep(factory.prepare_s)
        w = SlowSwitch(
            f"w{slot.slot_id}", FlatCost(), SimEngineConfig(num_kv_blocks=2048), role=role
        )
        w.table, w.slot_id = table, slot.slot_id
        return w

    factory.start = start
    rebuilder = InterScaleRebuilder(
        table, router, factory, lambda: version["trained"], lambda n: 2.0, finalize_s=5.0
    )
    sync = WeightSync(lambda: list(rebuilder.workers.values()), lambda n: 2.0)

    async def train_meanwhile():
        await asyncio.sleep(30.0 + 2.0 + 5.0 + 0.5)  # inside the joiner's set_role
        version["trained"] = 4
        await sync.sync(4)  # the pipeline's sync after the step: active workers only

    async def main():
        assert await rebuilder.expand({slots[0]: WorkerRole.COLOCATED})
        trainer = asyncio.ensure_future(train_meanwhile())  # the second worker joins now
        assert await rebuilder.expand(
            {slots[1]: WorkerRole.COLOCATED},
            roles_at_admission=lambda active: (
                {s: WorkerRole.PREFILL for s in active[:1]}
                | {s: WorkerRole.DECODE for s in active[1:]}
            ),
        )
        await trainer
        versions = {s: w.requested_version for s, w in rebuilder.workers.items()}
        for w in list(rebuilder.workers.values()):
            w.close()
        return versions

    versions = run_virtual(main)[0]
    assert versions == {slots[0]: 4, slots[1]: 4}
