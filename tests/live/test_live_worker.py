"""Live workers: engines as Ray actors, driven by the same router and agent loop."""

import asyncio
import dataclasses
import statistics

import pytest
from tiny_model import tiny_model

from pearl.control.agent_loop import AgentLoopConfig, run_trajectory
from pearl.control.interfaces import AsyncioClock, TurnRequest, WorkerRole
from pearl.control.router import Router
from pearl.engine.config import EngineConfig
from pearl.engine.engine import LLMEngine
from pearl.engine.sequence import Request, SamplingParams
from pearl.live.server import EngineServer, ModelSpec
from pearl.models.config import ModelConfig
from pearl.workloads.batch import Trajectory, Turn
from pearl.workloads.token_ids import observation_token_ids

MODEL = tiny_model(vocab_size=300, head_dim=16, max_position_embeddings=1024)
ENGINE = dict(
    block_size=8, num_kv_blocks=256, max_num_batched_tokens=64, max_num_seqs=8, model_id="tiny"
)

TRAJ = Trajectory(
    task_id="t",
    index_in_group=0,
    turns=tuple(
        Turn(observation_tokens=30 if k == 0 else 12, response_tokens=6, response_tokens_kept=6)
        for k in range(3)
    ),
)


def reference_tokens():
    """The trajectory's turns on one in-process engine, greedy."""
    engine = LLMEngine.from_model_config(
        ModelConfig.from_dict(MODEL), EngineConfig(**ENGINE), seed=0
    )
    context, outs = [], []
    for k, turn in enumerate(TRAJ.turns):
        context = context + observation_token_ids(TRAJ, k, MODEL["vocab_size"])
        sp = SamplingParams(temperature=0, max_new_tokens=turn.response_tokens, ignore_eos=True)
        out = engine.generate([Request(f"r{k}", context, sp, "s", pin_session=True)])[f"r{k}"]
        outs.append(out.token_ids)
        context = context + out.token_ids
    return outs


def test_our_engine_server_fills_the_whole_rollout_engine_interface():
    from pearl.control.rollout_engine import Capability, RolloutEngine

    server = EngineServer("w0", ModelSpec(config=MODEL), EngineConfig(**ENGINE))
    assert isinstance(server, RolloutEngine)
    assert all(server.capabilities.has(c) for c in Capability)


def test_engine_server_serves_turns_between_iterations():
    async def main():
        server = EngineServer("w0", ModelSpec(config=MODEL), EngineConfig(**ENGINE))
        turns = [
            TurnRequest(f"r{i}", f"s{i}", [1 + i, 2, 3, 4, 5], 8, temperature=0) for i in range(3)
        ]
        outs = await asyncio.gather(*(server.run_turn(t) for t in turns))
        held = await server.session_length("s0")
        return outs, held

    outs, held = asyncio.run(main())
    assert [len(o.token_ids) for o in outs] == [8, 8, 8]
    assert held == 5 + 7  # prompt plus all but the last sampled token


def test_a_released_worker_frees_its_weights_and_kv_and_serves_again_after_a_sync():
    """Borrowing between rounds: release_device frees weights and KV (the process stays),
    weights installed while released come back with restore_device."""

    async def main():
        server = EngineServer("w0", ModelSpec(config=MODEL), EngineConfig(**ENGINE))
        turn = TurnRequest("r0", "s0", [3, 1, 4, 1, 5], 6, temperature=0)
        before = await server.run_turn(turn)
        await server.release_session("s0")
        weights = {n: p.detach().clone().numpy() for n, p in server.engine.model.named_parameters()}
        await server.release_device()
        await server.release_device()  # idempotent
        released = (
            server.engine.asleep,
            sum(p.numel() for p in server.engine.model.parameters()),
            server.engine.runner.kv_cache,
        )
        await server.load_weights((7, weights))  # the trainer's newest, while released
        await server.restore_device()
        after = await server.run_turn(dataclasses.replace(turn, request_id="r1"))
        return before, released, after

    before, (asleep, params, kv), after = asyncio.run(main())
    assert asleep and params == 0 and kv is None
    assert after.token_ids == before.token_ids and after.weight_version == 7


def test_engine_server_logs_iteration_shapes_the_cost_model_can_price():
    async def main():
        server = EngineServer("w0", ModelSpec(config=MODEL), EngineConfig(**ENGINE))
        await server.log_iterations(True)
        turns = [
            TurnRequest(f"r{i}", f"s{i}", list(range(1, 40)), 5, temperature=0) for i in range(2)
        ]
        await asyncio.gather(*(server.run_turn(t) for t in turns))
        log = await server.log_iterations(False)
        stats = await server.stats()
        return log, stats

    log, stats = asyncio.run(main())
    assert len(log) == stats["iterations"]
    prefilled = sum(n for prefills, _, _ in log for n, _ in prefills)
    decoded = sum(len(decodes) for _, decodes, _ in log)
    assert prefilled == stats["prefill_tokens"] == 2 * 39
    assert decoded == stats["decode_tokens"] == 2 * 4  # the first token comes with the prefill
    assert all(seconds > 0 for _, _, seconds in log)
    # Chunked prefill: a 64-token budget cannot hold both 39-token prompts in one iteration.
    assert sum(n for n, _ in log[0][0]) == 64 and any(start > 0 for n, start in log[1][0])


@pytest.fixture(scope="module")
def ray_runtime():
    ray = pytest.importorskip("ray")
    from pearl.live.cluster import ensure_ray

    ensure_ray(num_cpus=2)
    yield ray
    ray.shutdown()


def test_disaggregated_ray_workers_match_a_colocated_engine(ray_runtime):
    from pearl.live.worker import LiveKVMover, LiveWorker

    async def main():
        p = LiveWorker("p0", ModelSpec(config=MODEL), EngineConfig(**ENGINE), WorkerRole.PREFILL)
        d = LiveWorker("d0", ModelSpec(config=MODEL), EngineConfig(**ENGINE), WorkerRole.DECODE)
        await asyncio.gather(p.ready(), d.ready())
        mover = LiveKVMover()
        router = Router(mover)
        router.set_topology(prefill=[p], decode=[d])
        result = await run_trajectory(
            TRAJ, router, AsyncioClock(), AgentLoopConfig(MODEL["vocab_size"], temperature=0)
        )
        stats = await d.stats()
        p.kill()
        d.kill()
        return result, mover, stats

    result, mover, stats = asyncio.run(main())
    assert [o.token_ids for o in result.turns] == reference_tokens()
    assert mover.transfers == 3 and mover.bytes_moved > 0
    assert stats["role"] == "decode" and stats["prefill_tokens"] == 0  # D never prefilled


def test_fidelity_compares_the_live_mean_of_repeats_with_one_simulation(ray_runtime):
    import dataclasses
    import statistics

    from pearl.apps import fidelity as fid
    from pearl.sim.cost_profile import CostProfile
    from pearl.sim.hardware import CPU_PLACEHOLDER

    profile = CostProfile(  # any fitted-looking profile: this checks the protocol, not the error
        gpu=dataclasses.replace(
            CPU_PLACEHOLDER, peak_flops=2e10, hbm_bandwidth_Bps=1e10, hbm_bytes=8e9
        ),
        dtype_bytes=4,
    )
    case = fid.FidelityCase("swe-cpu 2 traj, 1 colocated", "swe-cpu", 1, 2, "1C", seed=3)
    lines: list[str] = []
    (result,) = fid.compare(profile, [case], log=lines.append, live_repeats=2)
    row = result.row()
    assert row["live_repeats"] == 2 and len(row["live_makespans_s"]) == 2
    assert row["live_makespan_s"] == pytest.approx(statistics.fmean(row["live_makespans_s"]))
    assert row["makespan_error"] == pytest.approx(
        row["sim_makespan_s"] / row["live_makespan_s"] - 1
    )
    turns = sum(len(t.turns) for t in case.batch().trajectories)
    assert len(result.turn_errors) == turns
    assert any("x2, spread" in line for line in lines)
    with pytest.raises(ValueError, match="calibration seed"):
        fid.compare(profile, [dataclasses.replace(case, seed=fid.CALIBRATION_SEED)])


def test_held_out_runs_measure_iterations_and_the_turn_calls_gap_under_load(ray_runtime):
    from pearl.apps import fidelity as fid

    model = ModelSpec(config=fid.CALIBRATION_MODEL)
    vocab = fid.CALIBRATION_MODEL["vocab_size"]
    measured = fid.held_out_samples(model, fid.CALIBRATION_ENGINE, vocab, "1P1D", "swe-cpu")
    assert measured.samples and all(s.seconds > 0 for s in measured.samples)
    turns = sum(
        len(t.turns)
        for t in fid.FidelityCase("h", "swe-cpu", 2, 4, "1P1D", seed=fid.CALIBRATION_SEED)
        .batch()
        .trajectories
    )
    # one prefill call per turn, one decode call per turn with more than one token
    assert turns <= len(measured.gaps) <= 2 * turns
    assert all(g > 0 for g in measured.gaps)  # a Ray call costs more than the engine's part
    overhead, rpc = measured.load_overheads(0.0, 0.001)
    assert overhead == pytest.approx(statistics.median(measured.gaps))
    assert rpc == pytest.approx(0.001 + overhead)


def test_load_overheads_add_what_load_added_to_a_turn_call_to_every_call():
    from pearl.apps.fidelity import HeldOut

    assert HeldOut().load_overheads(0.002, 0.001) == (0.002, 0.001)  # nothing measured
    loaded = HeldOut(gaps=[0.004, 0.008, 0.006])
    assert loaded.load_overheads(0.002, 0.001) == pytest.approx((0.006, 0.005))
    assert loaded.load_overheads(0.010, 0.001) == pytest.approx((0.006, 0.001))


@pytest.mark.parametrize("to", ["1P1D", "1C"])
def test_live_mode_switch_and_shrink_mid_batch_complete_every_turn(ray_runtime, to):
    from pearl.apps import fidelity as fid

    case = fid.FidelityCase(f"2C -> {to}", "swe-cpu", 1, 2, "2C", seed=4, changes=((1.0, to),))
    model = ModelSpec(config=fid.CALIBRATION_MODEL)
    vocab = fid.CALIBRATION_MODEL["vocab_size"]
    result, iterations = fid.run_live_case(case, model, fid.CALIBRATION_ENGINE, vocab)
    batch = case.batch()
    by_session = {f"{t.task_id}/{t.index_in_group}": t for t in batch.trajectories}
    assert sorted(t.session_id for t in result.trajectories) == sorted(by_session)
    for traj in result.trajectories:
        spec = by_session[traj.session_id]
        assert [len(o.token_ids) for o in traj.turns] == [t.response_tokens for t in spec.turns]
    # `submitted_at` is stamped (on the host's monotonic clock, as the driver's loop) when a
    # turn reaches the worker's actor: a turn routed to w1 just before the change can reach
    # it after its abort and run there until w1 is stopped, so "late" is what reached a
    # worker once the change had taken effect (w1 stopped, the roles set).
    (changed,) = result.reconfigured_at
    late = [o.telemetry for t in result.trajectories for o in t.turns]
    late = [t for t in late if t.submitted_at > changed]
    assert late, "the batch ended before the change"
    from scripted_checks import assert_served_by_new_topology

    assert_served_by_new_topology(late, to)
    assert iterations  # the shrunk worker's log is kept too
