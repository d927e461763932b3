"""From a ``pearl simulate`` config to the simulator's objects: the cost model (GPU, model
shape, an optional fitted cost profile), the simulated engine, the rollout batch (a
workload profile or a trace), and the setting every policy of an RL experiment shares;
a workload no worker can hold is rejected before anything runs."""

from __future__ import annotations

from dataclasses import replace

from pearl.config.simulate import RLExperimentConfig, SimSection, SimulateConfig
from pearl.control.decision import DecisionConfig
from pearl.errors import ConfigError
from pearl.sim.cost_profile import load_cost_profile
from pearl.sim.costmodel import CostConstants, CostModel
from pearl.sim.hardware import get_gpu
from pearl.sim.policy_run import RLSetting
from pearl.sim.shapes import load_model_shape
from pearl.sim.worker import SimEngineConfig
from pearl.workloads.agentic import generate_batch
from pearl.workloads.batch import RolloutBatch
from pearl.workloads.profiles import get_profile
from pearl.workloads.traces import load_rollout_trace


def build_cost_model(cfg: SimulateConfig) -> CostModel:
    gpu = get_gpu(cfg.cluster.gpu)
    constants = CostConstants()
    shape = load_model_shape(cfg.model.name)
    latencies = None
    if cfg.cluster.profile:
        profile = load_cost_profile(cfg.cluster.profile)
        gpu = profile.gpu or gpu
        constants = profile.constants
        shape = profile.adapt_model(shape)  # e.g. float32 weights and KV for a CPU profile
        latencies = profile.model_latencies(shape)
    return CostModel(gpu, shape, tp=cfg.cluster.tp, constants=constants, latencies=latencies)


def build_batch(cfg: SimulateConfig) -> RolloutBatch:
    w = cfg.workload
    if w.trace:
        return load_rollout_trace(w.trace, max_model_len=engine_config(cfg.sim).max_model_len)
    return generate_batch(
        get_profile(w.profile), num_tasks=w.num_tasks, group_size=w.group_size, seed=w.seed
    )


def engine_config(sim: SimSection) -> SimEngineConfig:
    """The simulated engine a config's ``sim`` section describes."""
    return SimEngineConfig(
        block_size=sim.block_size,
        max_num_batched_tokens=sim.max_num_batched_tokens,
        max_num_seqs=sim.max_num_seqs,
        max_model_len=sim.max_model_len,
        scheduling=sim.scheduling,
        chunked_prefill_size=sim.chunked_prefill_size,
        max_prefill_tokens=sim.max_prefill_tokens,
        flush_cache_on_weight_update=sim.flush_cache_on_weight_update,
        cross_turn_reuse=sim.cross_turn_reuse,
        pd_decode_reuse=sim.pd_decode_reuse,
        fast_forward=sim.fast_forward,
    )


def check_fits(cost: CostModel, engine: SimEngineConfig, longest: int, what: str) -> None:
    """Reject up front a workload whose longest sequence (``longest`` tokens) no worker can
    hold: beyond ``sim.max_model_len`` or beyond one worker's KV memory."""
    capacity = cost.kv_capacity_tokens()
    where = f"{cost.model.name} on TP{cost.tp} {cost.gpu.name}"
    limit = cost.model.max_position_embeddings
    if limit is not None and engine.max_model_len > limit:
        raise ConfigError(
            f"sim.max_model_len is {engine.max_model_len}, beyond {cost.model.name}'s own "
            f"context limit of {limit} tokens (max_position_embeddings); use at most {limit}"
        )
    if longest > engine.max_model_len:  # exactly max_model_len fits, as in vLLM
        raise ConfigError(
            f"{what} reaches {longest} tokens, but sim.max_model_len is {engine.max_model_len}; "
            f"raise sim.max_model_len to {longest} or shorten the workload"
        )
    if longest > capacity:  # the last token's KV is never computed
        raise ConfigError(
            f"{what} reaches {longest} tokens, but one worker of {where} holds the KV of "
            f"{capacity} tokens; use a larger TP (cluster.tp) or a GPU with more memory"
        )


def build_setting(cfg: RLExperimentConfig) -> RLSetting:
    profile = get_profile(cfg.workload.profile)
    if cfg.workload.num_tasks or cfg.workload.group_size:
        profile = replace(
            profile,
            num_tasks=cfg.workload.num_tasks or profile.num_tasks,
            group_size=cfg.workload.group_size or profile.group_size,
        )
    c = cfg.cluster
    cost = build_cost_model(cfg)  # type: ignore[arg-type]
    check_fits(
        cost,
        engine_config(cfg.sim),
        profile.max_context_tokens,
        f"workload {profile.name} (max_context_tokens)",
    )
    return RLSetting(
        cost=cost,
        profile=profile,
        reserved_gpus=c.reserved_gpus,
        max_preemptible_gpus=c.max_preemptible_gpus,
        training_gpus=c.training_gpus,
        duration_s=cfg.rl.duration_s,
        max_staleness=cfg.rl.max_staleness,
        overlap_batches=cfg.rl.overlap_batches,
        seed=cfg.workload.seed,
        engine=engine_config(cfg.sim),
        decision=DecisionConfig(
            mode_switch_threshold=cfg.pd.mode_switch_threshold,
            ratio_change_threshold=cfg.pd.ratio_change_threshold,
        ),
    )
