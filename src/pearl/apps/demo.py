"""The default main job: multi-turn generation on a small random-weight model, colocated and
disaggregated (prefill engine -> KV transfer -> decode engine), with throughput and agreement."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from pearl.engine.config import EngineConfig
from pearl.engine.disagg import run_disaggregated
from pearl.engine.engine import LLMEngine
from pearl.engine.sequence import Request, Role, SamplingParams
from pearl.models.config import ModelConfig

DEMO_MODEL = {
    "model_type": "qwen3",
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}


@dataclass(slots=True)
class DemoReport:
    parameters: int
    sessions: int
    turns: int
    generated_tokens: int
    colocated_seconds: float
    disaggregated_seconds: float
    turns_identical: int
    turns_total: int
    kv_bytes_moved: int
    prefix_cache_hit_rate: float


def _demo_engines(cfg: ModelConfig, seed: int) -> tuple[LLMEngine, LLMEngine, LLMEngine]:
    """The colocated engine and the prefill and decode pair, alike but for their roles."""
    engine_cfg = dict(
        block_size=16,
        num_kv_blocks=1024,
        max_num_batched_tokens=512,
        max_num_seqs=64,
        model_id="demo",
    )
    colocated = LLMEngine.from_model_config(cfg, EngineConfig(**engine_cfg), seed=seed)
    prefill = LLMEngine.from_model_config(
        cfg, EngineConfig(**engine_cfg, role=Role.PREFILL), seed=seed
    )
    decode = LLMEngine.from_model_config(
        cfg, EngineConfig(**engine_cfg, role=Role.DECODE), seed=seed
    )
    return colocated, prefill, decode


def _turn_requests(
    history: dict[str, list[int]], turn: int, lengths: dict[str, int], tag: str
) -> list[Request]:
    """One greedy request per session on its history so far, ``lengths[sid]`` tokens long."""
    return [
        Request(
            f"{sid}/{turn}/{tag}",
            list(h),
            SamplingParams(temperature=0, max_new_tokens=lengths[sid], ignore_eos=True),
            sid,
            pin_session=True,
        )
        for sid, h in history.items()
    ]


def run_demo(sessions: int = 8, turns: int = 4, seed: int = 0, log=print) -> DemoReport:
    """Run ``sessions`` agent sessions for ``turns`` turns both ways; compare the tokens."""
    import torch  # live extra

    torch.set_num_threads(1)
    cfg = ModelConfig.from_dict(DEMO_MODEL, source="demo model")
    colocated, prefill, decode = _demo_engines(cfg, seed)
    rng = random.Random(seed)
    system = [rng.randrange(cfg.vocab_size) for _ in range(128)]  # shared by all sessions
    history = {
        f"s{i}": system + [rng.randrange(cfg.vocab_size) for _ in range(rng.randint(32, 96))]
        for i in range(sessions)
    }
    log(
        f"model: random Qwen3, {cfg.num_parameters() / 1e6:.1f}M parameters; {sessions} sessions x {turns} turns"
    )
    identical = total = generated = moved = 0
    t_coloc = t_disagg = 0.0
    for turn in range(turns):
        lengths = {sid: rng.randint(16, 64) for sid in history}
        t0 = time.perf_counter()
        c_out = colocated.generate(_turn_requests(history, turn, lengths, "c"))
        t1 = time.perf_counter()
        d_out = run_disaggregated(prefill, decode, _turn_requests(history, turn, lengths, "d"))
        t2 = time.perf_counter()
        t_coloc += t1 - t0
        t_disagg += t2 - t1
        for sid in history:
            a, b = c_out[f"{sid}/{turn}/c"].token_ids, d_out[f"{sid}/{turn}/d"]
            identical += a == b.token_ids
            total += 1
            generated += len(a)
            moved += b.kv_bytes_moved
            observation = [rng.randrange(cfg.vocab_size) for _ in range(rng.randint(16, 128))]
            history[sid] = history[sid] + a + observation
        log(
            f"turn {turn + 1}: colocated {t1 - t0:.2f}s, disaggregated {t2 - t1:.2f}s, identical {sum(c_out[f'{s}/{turn}/c'].token_ids == d_out[f'{s}/{turn}/d'].token_ids for s in history)}/{len(history)}"
        )
    stats = colocated.stats()
    return DemoReport(
        parameters=cfg.num_parameters(),
        sessions=sessions,
        turns=turns,
        generated_tokens=generated,
        colocated_seconds=t_coloc,
        disaggregated_seconds=t_disagg,
        turns_identical=identical,
        turns_total=total,
        kv_bytes_moved=moved,
        prefix_cache_hit_rate=stats.cache_hit_tokens / max(1, stats.cache_query_tokens),
    )
