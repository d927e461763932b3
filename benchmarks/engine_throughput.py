"""Engine throughput benchmark: PEARL's engine vs Hugging Face ``generate`` on a multi-turn replay.

Replays a seeded agentic workload (16 sessions x 4 turns by default, the issue's 32 x 8 with
``--full``; every session starts
with a shared system prompt, each later turn appends the previous response plus an
observation of 64-512 tokens; responses are 32-128 tokens) on a ~30M-parameter Qwen3
model with random weights, fp32, on CPU, with one torch thread.

* PEARL: one ``LLMEngine`` over the model folder; every session runs concurrently and a
  session's next turn is submitted the moment its previous turn finishes (continuous
  batching; pinned sessions append, the prefix cache serves the shared system prompt).
  Environment time is zero.
* Hugging Face: the same weights (the engine loads the folder ``save_pretrained`` wrote),
  ``Qwen3ForCausalLM.generate(do_sample=False, use_cache=True)``. Per turn round, the
  sessions' full contexts are left-padded into batches (``--hf-batch``); each batch
  generates the longest response length in it and every session keeps only its own
  length. Contexts are re-prefilled every turn (``generate`` keeps no cache across calls).

Both replays do the same useful work: identical prompt lengths and response lengths
(token ids differ only where greedy decoding of the two implementations diverges).
Also measured: steady-state decode tokens/s at batch 1, 8, 32, 64 for both, in lockstep
(one engine step inside every ``generate`` step, so both see the same machine load;
``--decode-only --decode-repeats N`` for the table alone, repeated), and the engine's
scheduler overhead (schedule + postprocess) as a fraction of iteration time.

Prints one table and writes JSON (``--out``). ``--quick`` is a smoke run (< 1 minute).

    .venv/bin/python benchmarks/engine_throughput.py            # 16 x 4 (~8 min, 2-core CPU)
    .venv/bin/python benchmarks/engine_throughput.py --full     # 32 x 8 (20-45 min, mostly HF)
    .venv/bin/python benchmarks/engine_throughput.py --quick    # smoke run (< 1 min)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from pearl.engine.config import EngineConfig
from pearl.engine.engine import LLMEngine
from pearl.engine.sequence import Request, SamplingParams  # noqa: E402
from pearl.models.config import ModelConfig  # noqa: E402

BLOCK_SIZE = 16
# Workload sizes. Token ranges are the same for the default and --full; the full replay
# (the 32 x 8) takes 20-45 min here, mostly HF: it re-prefills every context each turn.
FULL_SESSIONS, FULL_TURNS = 32, 8
DEFAULT_SESSIONS, DEFAULT_TURNS = 16, 4

# ~30M parameters (embeddings tied): 6 layers, hidden 512, GQA 8/4 heads of 64.
MODEL_HF_CONFIG = dict(
    vocab_size=16384,
    hidden_size=512,
    intermediate_size=1792,
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    max_position_embeddings=8192,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)


# -- workload ------------------------------------------------------------------------
@dataclass
class WorkloadSpec:
    sessions: int = FULL_SESSIONS
    turns: int = FULL_TURNS
    system_tokens: int = 256  # shared by every session (prefix cache)
    task_tokens: tuple[int, int] = (16, 64)  # per-session task statement after the system prompt
    observation_tokens: tuple[int, int] = (64, 512)  # appended before turns 2..T
    response_tokens: tuple[int, int] = (32, 128)
    seed: int = 0


@dataclass
class Session:
    sid: str
    first_prompt: list[int]  # system prompt + task
    observations: list[list[int]]  # observations[k] precedes turn k+1 (k = 1..T-1); [0] unused
    response_lengths: list[int]

    def max_context(self) -> int:
        return (
            len(self.first_prompt)
            + sum(len(o) for o in self.observations)
            + sum(self.response_lengths)
        )


def make_workload(spec: WorkloadSpec, vocab: int) -> list[Session]:
    rng = random.Random(spec.seed)

    # Token 0 is kept out of the prompts (it is the HF pad id).
    def toks(n: int) -> list[int]:
        return [rng.randrange(1, vocab) for _ in range(n)]

    system = toks(spec.system_tokens)
    sessions = []
    for i in range(spec.sessions):
        first = system + toks(rng.randint(*spec.task_tokens))
        obs = [[]] + [toks(rng.randint(*spec.observation_tokens)) for _ in range(spec.turns - 1)]
        lens = [rng.randint(*spec.response_tokens) for _ in range(spec.turns)]
        sessions.append(Session(f"s{i}", first, obs, lens))
    return sessions


def workload_totals(sessions: list[Session]) -> dict:
    """Token counts of the replay (identical for both systems)."""
    prompt = gen = 0
    for s in sessions:
        ctx = len(s.first_prompt)
        for k, n in enumerate(s.response_lengths):
            if k:
                ctx += len(s.observations[k])
            prompt += ctx
            gen += n
            ctx += n
    return {
        "total_turns": sum(len(s.response_lengths) for s in sessions),
        "prompt_tokens": prompt,
        "generated_tokens": gen,
        "max_context": max(s.max_context() for s in sessions),
        "mean_final_context": statistics.fmean(s.max_context() for s in sessions),
    }


# -- model ---------------------------------------------------------------------------
def build_hf_model(folder: Path, seed: int):
    """A random-weight Qwen3 saved as a HF folder; returns the HF model (eval, fp32)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(**MODEL_HF_CONFIG)
    model = Qwen3ForCausalLM(cfg).eval().to(torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def engine_config(sessions: list[Session], max_num_seqs: int = 64) -> EngineConfig:
    """Enough KV blocks to keep every session pinned for the whole replay (plus slack)."""
    per_session = sum(-(-(s.max_context() + 1) // BLOCK_SIZE) for s in sessions)
    max_len = max(s.max_context() for s in sessions) + 2
    return EngineConfig(
        block_size=BLOCK_SIZE,
        num_kv_blocks=per_session + 64,
        max_num_batched_tokens=512,
        max_num_seqs=max_num_seqs,
        max_model_len=min(max(max_len, 256), MODEL_HF_CONFIG["max_position_embeddings"]),
    )


def parity_check(engine: LLMEngine, hf, vocab: int) -> dict:
    """Greedy tokens and their logprobs from the engine vs HF on one 200-token prompt."""
    rng = random.Random(1234)
    ids = [rng.randrange(1, vocab) for _ in range(200)]
    n = 16
    out = engine.generate(
        [Request("parity", ids, SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True))]
    )["parity"]
    with torch.inference_mode():
        hf_ids = hf.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
        )[0, len(ids) :].tolist()
        logits = hf(torch.tensor([ids + out.token_ids[:-1]])).logits[0, -n:]
        ref = (
            torch.log_softmax(logits.float(), -1)
            .gather(1, torch.tensor(out.token_ids)[:, None])
            .squeeze(1)
        )
    diff = (ref - torch.tensor(out.logprobs)).abs().max().item()
    return {"greedy_tokens_equal": out.token_ids == hf_ids, "max_logprob_abs_diff": diff}


# -- PEARL replay --------------------------------------------------------------------
@dataclass
class ReplayResult:
    wall_s: float
    generated_tokens: int
    prompt_tokens: int
    turn_latencies_s: list[float] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


def replay_pearl(
    engine: LLMEngine, sessions: list[Session], progress: bool = False
) -> ReplayResult:
    dkv = engine.runner.decode_kv
    dkv_keys = ("filled_tokens", "moved_rows", "resorts", "fallbacks")
    dkv_before = {k: getattr(dkv, k) for k in dkv_keys} if dkv is not None else {}
    before = engine.stats()
    before = {
        k: getattr(before, k)
        for k in (
            "iterations",
            "prefill_tokens",
            "decode_tokens",
            "scheduler_time",
            "model_time",
            "cache_hit_tokens",
            "cache_query_tokens",
            "preemptions",
        )
    }
    ctx = {s.sid: list(s.first_prompt) for s in sessions}
    by_id = {s.sid: s for s in sessions}
    turn = {s.sid: 0 for s in sessions}
    submitted: dict[str, float] = {}
    latencies: list[float] = []
    gen = prompt = 0
    batch_sizes: list[int] = []

    def submit(s: Session) -> None:
        k = turn[s.sid]
        rid = f"{s.sid}-t{k}"
        submitted[rid] = time.perf_counter()
        engine.add_request(
            Request(
                rid,
                list(ctx[s.sid]),
                SamplingParams(
                    temperature=0, max_new_tokens=s.response_lengths[k], ignore_eos=True
                ),
                session_id=s.sid,
                pin_session=True,
            )
        )

    t0 = time.perf_counter()
    for s in sessions:
        submit(s)
    steps = 0
    while engine.has_unfinished():
        finished = engine.step()
        steps += 1
        now = time.perf_counter()
        for o in finished:
            s = by_id[o.session_id]
            k = turn[s.sid]
            assert len(o.token_ids) == s.response_lengths[k], (o.request_id, len(o.token_ids))
            latencies.append(now - submitted[o.request_id])
            prompt += len(ctx[s.sid])
            gen += len(o.token_ids)
            ctx[s.sid].extend(o.token_ids)
            turn[s.sid] = k + 1
            if progress and len(latencies) % len(sessions) == 0:
                print(
                    f"  pearl: {len(latencies)} turns done, {time.perf_counter() - t0:.0f}s",
                    flush=True,
                )
            if k + 1 < len(s.response_lengths):
                ctx[s.sid].extend(s.observations[k + 1])
                submit(s)
        st = engine.stats()
        batch_sizes.append(st.running + st.waiting)
    wall = time.perf_counter() - t0
    st = engine.stats()
    d = {k: getattr(st, k) - v for k, v in before.items()}
    sched_frac = d["scheduler_time"] / max(d["scheduler_time"] + d["model_time"], 1e-12)
    for s in sessions:
        engine.release_session(s.sid)
    return ReplayResult(
        wall,
        gen,
        prompt,
        latencies,
        {
            "steps": steps,
            "engine_iterations": d["iterations"],
            "prefill_tokens_computed": d["prefill_tokens"],
            "decode_tokens": d["decode_tokens"],
            "cache_hit_tokens": d["cache_hit_tokens"],
            "cache_query_tokens": d["cache_query_tokens"],
            "cache_hit_rate": d["cache_hit_tokens"] / max(d["cache_query_tokens"], 1),
            "preemptions": d["preemptions"],
            "scheduler_time_s": d["scheduler_time"],
            "model_time_s": d["model_time"],
            "scheduler_fraction": sched_frac,
            "unaccounted_time_s": wall - d["scheduler_time"] - d["model_time"],
            "mean_requests_in_flight": statistics.fmean(batch_sizes) if batch_sizes else 0.0,
            # Contiguous decode K/V rows: tokens copied in from the paged cache, rows moved,
            # re-sorts, iterations that fell back to per-layer gathers (buffer over its cap).
            "decode_rows": {k: getattr(dkv, k) - v for k, v in dkv_before.items()},
        },
    )


# -- HF replay -----------------------------------------------------------------------
def hf_generate(hf, contexts: list[list[int]], max_new: int) -> list[list[int]]:
    """Greedy ``generate`` on a left-padded batch; returns each row's ``max_new`` new tokens."""
    width = max(len(c) for c in contexts)
    ids = torch.zeros(len(contexts), width, dtype=torch.long)
    mask = torch.zeros(len(contexts), width, dtype=torch.long)
    for i, c in enumerate(contexts):
        ids[i, width - len(c) :] = torch.tensor(c)
        mask[i, width - len(c) :] = 1
    with torch.inference_mode():
        out = hf.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new,
            min_new_tokens=max_new,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
        )
    return out[:, width:].tolist()


def replay_hf(hf, sessions: list[Session], batch: int, progress: bool = False) -> ReplayResult:
    ctx = {s.sid: list(s.first_prompt) for s in sessions}
    latencies: list[float] = []
    gen = prompt = padded = 0
    turns = len(sessions[0].response_lengths)
    t0 = time.perf_counter()
    for k in range(turns):
        round_start = time.perf_counter()
        for s in sessions:
            if k:
                ctx[s.sid].extend(s.observations[k])
        for g in range(0, len(sessions), batch):
            group = sessions[g : g + batch]
            contexts = [ctx[s.sid] for s in group]
            max_new = max(s.response_lengths[k] for s in group)
            outs = hf_generate(hf, contexts, max_new)
            done = time.perf_counter()
            padded += len(group) * (max(len(c) for c in contexts) + max_new)
            for s, o in zip(group, outs, strict=True):
                n = s.response_lengths[k]
                prompt += len(ctx[s.sid])
                gen += n
                latencies.append(done - round_start)
                ctx[s.sid].extend(o[:n])
        if progress:
            print(f"  hf: turn {k + 1} done, {time.perf_counter() - t0:.0f}s", flush=True)
    wall = time.perf_counter() - t0
    return ReplayResult(
        wall,
        gen,
        prompt,
        latencies,
        {
            "batch": batch,
            "padded_token_slots": padded,
            "useful_fraction_of_slots": (gen + prompt) / max(padded, 1),
        },
    )


# -- decode rates --------------------------------------------------------------------
def decode_pearl(
    folder: Path,
    batch: int,
    prompt_len: int,
    steps: int,
    windows: int,
    vocab: int,
    gather: bool = False,
) -> dict:
    """Steady-state decode of ``batch`` sequences: ``windows`` timed windows of ``steps``
    decode-only iterations each (median window reported; the CPU is shared, so windows vary).
    ``gather``: the engine's previous decode path (every layer gathers each sequence's
    blocks out of the paged cache) instead of its contiguous per-sequence K/V rows."""
    warmup = 4
    engine = decoding_engine(folder, batch, prompt_len, warmup + windows * steps, vocab, gather)
    for _ in range(warmup):
        engine.step()
    rates, scheds, models, walls = [], [], [], []
    for _ in range(windows):
        s0 = engine.stats()
        p0, d0, sc0, m0 = s0.prefill_tokens, s0.decode_tokens, s0.scheduler_time, s0.model_time
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        wall = time.perf_counter() - t0
        s1 = engine.stats()
        assert s1.prefill_tokens == p0 and s1.decode_tokens - d0 == batch * steps, (
            "not a pure decode window"
        )
        rates.append(batch * steps / wall)
        walls.append(wall)
        scheds.append(s1.scheduler_time - sc0)
        models.append(s1.model_time - m0)
    i = sorted(range(windows), key=lambda j: rates[j])[windows // 2]
    sched, model = sum(scheds), sum(models)
    return {
        "batch": batch,
        "steps_per_window": steps,
        "windows_tokens_per_s": rates,
        "tokens_per_s": rates[i],
        "ms_per_step": 1000 * walls[i] / steps,
        "scheduler_ms_per_step": 1000 * sched / (steps * windows),
        "model_ms_per_step": 1000 * model / (steps * windows),
        "scheduler_fraction": sched / (sched + model),
        "scheduler_fraction_of_wall": sched / sum(walls),
        "context_len_range": [prompt_len + 1, prompt_len + warmup + windows * steps + 64],
    }


def decoding_engine(
    folder: Path, batch: int, prompt_len: int, budget: int, vocab: int, gather: bool = False
) -> LLMEngine:
    """An engine with ``batch`` requests of ``prompt_len`` random tokens, stepped until every
    one is decoding (one token per step, no prefill left), with room for ``budget`` more
    pure-decode steps."""
    max_new = budget + 64  # sequences admitted first decode during the others' prefill
    max_len = prompt_len + max_new + 16
    engine = LLMEngine.from_folder(
        folder,
        EngineConfig(
            block_size=BLOCK_SIZE,
            num_kv_blocks=batch * (-(-max_len // BLOCK_SIZE)) + 8,
            max_num_batched_tokens=512,
            max_num_seqs=max(64, batch),
            max_model_len=max_len,
        ),
    )
    if gather:
        engine.runner.decode_kv = None
    rng = random.Random(batch)
    for i in range(batch):
        ids = [rng.randrange(1, vocab) for _ in range(prompt_len)]
        engine.add_request(
            Request(
                f"d{i}", ids, SamplingParams(temperature=0, max_new_tokens=max_new, ignore_eos=True)
            )
        )
    # Prefill until every sequence is decoding (one token per step, no prefill).
    for _ in range(10_000):
        a = engine.stats().prefill_tokens
        engine.step()
        s = engine.stats()
        if s.prefill_tokens == a and s.running == batch:
            break
    return engine


class _Lockstep:
    """A logits processor that runs one step of each engine inside every ``generate`` step,
    so the engines and transformers alternate step by step and see the same machine load.
    ``hf[i]`` is the wall time of generate step ``i + 1`` (from the end of the engines' turn
    to the next call: the forward, the cache update and generate's own per-token work)."""

    def __init__(self, engines: dict[str, LLMEngine]) -> None:
        self.engines = engines
        self.times: dict[str, list[float]] = {name: [] for name in engines}
        self.hf: list[float] = []
        self._left: float | None = None

    def __call__(self, input_ids, scores):
        now = time.perf_counter()
        if self._left is not None:
            self.hf.append(now - self._left)
        for name, engine in self.engines.items():
            t0 = time.perf_counter()
            engine.step()
            self.times[name].append(time.perf_counter() - t0)
        self._left = time.perf_counter()
        return scores


def decode_lockstep(
    folder: Path,
    hf,
    batch: int,
    prompt_len: int,
    steps: int,
    windows: int,
    vocab: int,
    compare_gather: bool = False,
) -> dict[str, dict]:
    """Decode tokens/s of the engine (and of its gather path) and of ``generate`` measured in
    lockstep (``_Lockstep``): after 4 warm-up steps, ``windows`` windows of ``steps`` steps;
    each system's rate is its median window, and the ratio is taken window by window."""
    from transformers import LogitsProcessorList

    warmup = 4
    n = warmup + windows * steps
    engines = {"pearl": decoding_engine(folder, batch, prompt_len, n + 1, vocab)}
    if compare_gather:
        engines["pearl_gather"] = decoding_engine(
            folder, batch, prompt_len, n + 1, vocab, gather=True
        )
    before = {k: e.stats() for k, e in engines.items()}
    before = {
        k: (s.prefill_tokens, s.decode_tokens, s.scheduler_time, s.model_time)
        for k, s in before.items()
    }
    rng = random.Random(batch)
    ids = torch.tensor([[rng.randrange(1, vocab) for _ in range(prompt_len)] for _ in range(batch)])
    clock = _Lockstep(engines)
    with torch.inference_mode():
        hf.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n + 1,
            min_new_tokens=n + 1,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
            logits_processor=LogitsProcessorList([clock]),
        )
    assert len(clock.hf) == n, (len(clock.hf), n)
    series = {"hf": clock.hf}
    for name, engine in engines.items():
        s = engine.stats()
        p0, d0, sc0, m0 = before[name]
        assert s.prefill_tokens == p0 and s.decode_tokens - d0 == batch * (n + 1), (
            "not a pure decode run"
        )
        # Engine step i + 1 ran right after generate step i: pair them.
        series[name] = clock.times[name][1:]
    out: dict[str, dict] = {}
    for name, t in series.items():
        walls = [sum(t[warmup + w * steps : warmup + (w + 1) * steps]) for w in range(windows)]
        rates = [batch * steps / x for x in walls]
        i = sorted(range(windows), key=lambda j: rates[j])[windows // 2]
        out[name] = {
            "batch": batch,
            "steps_per_window": steps,
            "windows_tokens_per_s": rates,
            "tokens_per_s": rates[i],
            "ms_per_step": 1000 * walls[i] / steps,
            "median_step_ms": 1000 * statistics.median(t[warmup:]),
        }
        if name != "hf":
            s = engines[name].stats()
            sched, model = s.scheduler_time - before[name][2], s.model_time - before[name][3]
            out[name]["scheduler_fraction"] = sched / (sched + model)
    hf_rates = out["hf"]["windows_tokens_per_s"]
    for name in engines:
        out[name]["windows_ratio_vs_hf"] = [
            a / b for a, b in zip(out[name]["windows_tokens_per_s"], hf_rates, strict=True)
        ]
    return out


def measure_decode(
    folder: Path,
    hf,
    batches: list[int],
    prompt_len: int,
    steps: int,
    repeats: int,
    vocab: int,
    compare_gather: bool = False,
) -> dict:
    """Decode tokens/s per batch size, ``repeats`` times. With ``hf``, the engine(s) and
    ``generate`` run in lockstep (``decode_lockstep``: one engine step inside every generate
    step, so all systems see the same machine load); without, the engine alone
    (``decode_pearl``). Each measurement is the median of 3 windows; reports every repeat,
    their median and min-max spread, and the ratio of medians. ``compare_gather`` also
    measures the engine's previous decode path (``pearl_gather``)."""
    res: dict = {
        "prompt_len": prompt_len,
        "steps": steps,
        "repeats": repeats,
        "method": "engine only" if hf is None else "lockstep with generate",
        "pearl": [],
        "hf": [],
        "summary": [],
    }
    if compare_gather:
        res["pearl_gather"] = []
    for b in batches:
        runs: dict[str, list[dict]] = {"pearl": [], "hf": []}
        if compare_gather:
            runs["pearl_gather"] = []
        for r in range(repeats):
            if hf is None:
                got = {"pearl": decode_pearl(folder, b, prompt_len, steps, 3, vocab)}
                if compare_gather:
                    got["pearl_gather"] = decode_pearl(
                        folder, b, prompt_len, steps, 3, vocab, gather=True
                    )
            else:
                got = decode_lockstep(folder, hf, b, prompt_len, steps, 3, vocab, compare_gather)
            for name, d in got.items():
                runs[name].append(d)
            d = got["pearl"]
            line = (
                f"decode batch {b} repeat {r + 1}/{repeats}: pearl {d['tokens_per_s']:.1f} tok/s "
                f"({d['ms_per_step']:.1f} ms/step, scheduler {d['scheduler_fraction']:.1%})"
            )
            if "pearl_gather" in got:
                line += f", pearl-gather {got['pearl_gather']['tokens_per_s']:.1f} tok/s"
            if "hf" in got:
                hd = got["hf"]
                line += f", hf {hd['tokens_per_s']:.1f} tok/s ({hd['ms_per_step']:.1f} ms/step)"
            print(line, flush=True)
        row: dict = {"batch": b}
        for name, rs in runs.items():
            if not rs:
                continue
            rates = [x["tokens_per_s"] for x in rs]
            med = statistics.median(rates)
            # The repeat closest to the median stands for the system in the per-batch list.
            rep = min(rs, key=lambda x: abs(x["tokens_per_s"] - med))
            res[name].append({**rep, "tokens_per_s": med, "repeats_tokens_per_s": rates})
            row[name] = {"median": med, "min": min(rates), "max": max(rates), "all": rates}
        if "hf" in row:
            row["ratio_of_medians"] = row["pearl"]["median"] / row["hf"]["median"]
            row["ratio_per_repeat"] = [
                a["tokens_per_s"] / h["tokens_per_s"]
                for a, h in zip(runs["pearl"], runs["hf"], strict=True)
            ]
        if "pearl_gather" in row:
            row["speedup_vs_gather_per_repeat"] = [
                a["tokens_per_s"] / g["tokens_per_s"]
                for a, g in zip(runs["pearl"], runs["pearl_gather"], strict=True)
            ]
        res["summary"].append(row)
    return res


def print_decode_table(dec: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=(
            f"Decode tokens/s ({dec['prompt_len']}-token prompts, {dec['steps']}-step windows, "
            f"median of {dec['repeats']} repeat(s), \\[min-max])"
        )
    )
    gather = "pearl_gather" in dec
    cols = ["batch", "PEARL engine", "HF generate", "PEARL / HF (per-repeat range)"]
    if gather:
        cols += ["PEARL, gather path", "rows / gather (per-repeat range)"]
    for c in cols:
        t.add_column(c, justify="right")
    for row in dec["summary"]:

        def fmt(x: dict | None) -> str:
            if x is None:
                return "-"
            return f"{x['median']:.1f} \\[{x['min']:.1f}-{x['max']:.1f}]"

        ratio = ""
        if "ratio_of_medians" in row:
            rr = row["ratio_per_repeat"]
            ratio = f"{row['ratio_of_medians']:.2f}x \\[{min(rr):.2f}-{max(rr):.2f}]"
        cells = [str(row["batch"]), fmt(row.get("pearl")), fmt(row.get("hf")), ratio]
        if gather:
            sp = row["speedup_vs_gather_per_repeat"]
            speedup = row["pearl"]["median"] / row["pearl_gather"]["median"]
            cells += [
                fmt(row.get("pearl_gather")),
                f"{speedup:.2f}x \\[{min(sp):.2f}-{max(sp):.2f}]",
            ]
        t.add_row(*cells)
    Console(width=max(110, Console().width)).print(t)


# -- reporting -----------------------------------------------------------------------
def summarize(r: ReplayResult) -> dict:
    lat = sorted(r.turn_latencies_s)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0.0

    return {
        "wall_s": r.wall_s,
        "generated_tokens": r.generated_tokens,
        "prompt_tokens": r.prompt_tokens,
        "generated_tokens_per_s": r.generated_tokens / r.wall_s,
        "total_tokens_per_s": (r.generated_tokens + r.prompt_tokens) / r.wall_s,
        "turn_latency_mean_s": statistics.fmean(lat) if lat else 0.0,
        "turn_latency_p50_s": pct(0.5),
        "turn_latency_p90_s": pct(0.9),
        "turn_latency_max_s": lat[-1] if lat else 0.0,
        **r.extra,
    }


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    p, h = result["replay"]["pearl"], result["replay"].get("hf")
    t = Table(
        title=(
            f"Multi-turn replay: {result['workload']['sessions']} sessions x {result['workload']['turns']} turns, "
            f"{result['model']['parameters'] / 1e6:.1f}M params fp32, {result['environment']['torch_threads']} thread(s)"
        )
    )
    t.add_column("metric")
    t.add_column("PEARL engine", justify="right")
    t.add_column("HF generate", justify="right")
    t.add_column("PEARL / HF", justify="right")

    def row(name: str, key: str, fmt: str, higher_better: bool = True) -> None:
        a = p[key]
        b = h[key] if h else None
        ratio = "" if b in (None, 0) else f"{(a / b if higher_better else b / a):.2f}x"
        t.add_row(name, format(a, fmt), "-" if b is None else format(b, fmt), ratio)

    row("generated tokens/s", "generated_tokens_per_s", ".1f")
    row("prompt+generated tokens/s", "total_tokens_per_s", ".1f")
    row("wall time (s)", "wall_s", ".1f", higher_better=False)
    row("turn latency mean (s)", "turn_latency_mean_s", ".2f", higher_better=False)
    row("turn latency p50 (s)", "turn_latency_p50_s", ".2f", higher_better=False)
    row("turn latency p90 (s)", "turn_latency_p90_s", ".2f", higher_better=False)
    t.add_section()
    t.add_row("prefix/session cache hit rate", f"{p['cache_hit_rate']:.1%}", "-", "")
    t.add_row("scheduler share of iteration (replay)", f"{p['scheduler_fraction']:.1%}", "-", "")
    t.add_row("preemptions", str(p["preemptions"]), "-", "")
    t.add_section()
    hf_dec = {d["batch"]: d for d in result.get("decode", {}).get("hf", [])}
    for d in result.get("decode", {}).get("pearl", []):
        b = d["batch"]
        hd = hf_dec.get(b)
        t.add_row(
            f"decode tokens/s @ batch {b} (sched {d['scheduler_fraction']:.1%})",
            f"{d['tokens_per_s']:.1f}",
            f"{hd['tokens_per_s']:.1f}" if hd else "-",
            f"{d['tokens_per_s'] / hd['tokens_per_s']:.2f}x" if hd else "",
        )
    Console(width=max(110, Console().width)).print(t)
    quick = result["environment"]["quick"]
    for name, v in result["targets"].items():
        if v["pass"] is None:
            verdict = "not measured"
        elif quick and name.startswith("throughput"):
            verdict = (
                "not judged (--quick uses smoke sizes; the target is for the default/--full replay)"
            )
        else:
            verdict = "PASS" if v["pass"] else "FAIL"
        print(f"target {name}: {v['value']} -> {verdict}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=None)
    ap.add_argument("--turns", type=int, default=None)
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small smoke run (< 1 minute)")
    size.add_argument(
        "--full",
        action="store_true",
        help=f"the issue's workload, {FULL_SESSIONS} sessions x {FULL_TURNS} turns (20-45 min on 2 CPU cores, "
        "almost all of it in HF generate); default is "
        f"{DEFAULT_SESSIONS} x {DEFAULT_TURNS} (~10 minutes)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hf-batch", type=int, default=32, help="sessions per HF generate call")
    ap.add_argument("--skip-hf", action="store_true", help="run only PEARL")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--decode-batches", default="1,8,32,64")
    ap.add_argument("--decode-steps", type=int, default=None)
    ap.add_argument(
        "--decode-only",
        action="store_true",
        help="only the decode table (no replay): engine and HF alternate per batch size",
    )
    ap.add_argument(
        "--decode-repeats",
        type=int,
        default=None,
        help="measurements per batch size and system (default 1; 5 with --decode-only); "
        "the median and the min-max spread over repeats are reported",
    )
    ap.add_argument(
        "--decode-compare-gather",
        action="store_true",
        help="also measure the engine's previous decode path (per-layer block gather)",
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="results/engine_throughput.json")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    spec = WorkloadSpec(sessions=DEFAULT_SESSIONS, turns=DEFAULT_TURNS, seed=args.seed)
    if args.full:
        spec = WorkloadSpec(sessions=FULL_SESSIONS, turns=FULL_TURNS, seed=args.seed)
    if args.quick:
        spec = WorkloadSpec(
            sessions=4,
            turns=3,
            system_tokens=64,
            task_tokens=(8, 16),
            observation_tokens=(32, 96),
            response_tokens=(8, 24),
            seed=args.seed,
        )
    if args.sessions is not None:
        spec.sessions = args.sessions
    if args.turns is not None:
        spec.turns = args.turns
    decode_batches = [int(b) for b in args.decode_batches.split(",") if b]
    decode_steps = args.decode_steps or (4 if args.quick else 32)
    decode_prompt = 32 if args.quick else 128
    decode_repeats = args.decode_repeats or (5 if args.decode_only else 1)

    vocab = MODEL_HF_CONFIG["vocab_size"]
    sessions = make_workload(spec, vocab)
    totals = workload_totals(sessions)
    print(
        f"workload: {spec.sessions} sessions x {spec.turns} turns, {totals['prompt_tokens']} prompt tokens "
        f"(sum over turns), {totals['generated_tokens']} generated, max context {totals['max_context']}",
        flush=True,
    )

    result: dict = {"workload": {**asdict(spec), **totals}}
    phases: dict[str, float] = {}
    t_phase = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal t_phase
        now = time.perf_counter()
        phases[name] = round(now - t_phase, 2)
        t_phase = now

    with tempfile.TemporaryDirectory(prefix="pearl-bench-") as tmp:
        folder = Path(tmp) / "qwen3-30m"
        hf = build_hf_model(folder, args.seed)
        cfg = ModelConfig.from_folder(folder)
        result["model"] = {
            "hf_config": MODEL_HF_CONFIG,
            "parameters": cfg.num_parameters(),
            "hf_parameters": sum(p.numel() for p in hf.parameters()),
            "hf_attn_implementation": hf.config._attn_implementation,
        }
        print(f"model: qwen3 {cfg.num_parameters() / 1e6:.2f}M parameters (fp32)", flush=True)

        ecfg = engine_config(sessions)
        engine = LLMEngine.from_folder(folder, ecfg)
        result["engine_config"] = {
            k: getattr(ecfg, k)
            for k in (
                "block_size",
                "num_kv_blocks",
                "max_num_batched_tokens",
                "max_num_seqs",
                "max_model_len",
            )
        }
        result["parity"] = parity_check(engine, hf, vocab)
        print(f"parity vs HF: {result['parity']}", flush=True)
        phase("setup")

        # Warm-up outside the timed region (first-call allocations, kernel selection).
        warm = make_workload(
            WorkloadSpec(
                sessions=2,
                turns=2,
                system_tokens=32,
                task_tokens=(4, 8),
                observation_tokens=(8, 16),
                response_tokens=(4, 8),
                seed=args.seed + 99,
            ),
            vocab,
        )
        for s in warm:
            s.sid = "warm-" + s.sid
        replay_pearl(engine, warm)
        engine.blocks.reset_prefix_cache()

        if not args.decode_only:
            pearl = replay_pearl(engine, sessions, progress=True)
            result["replay"] = {"pearl": summarize(pearl)}
            print(
                f"pearl replay: {pearl.wall_s:.1f}s, "
                f"{pearl.generated_tokens / pearl.wall_s:.1f} gen tok/s",
                flush=True,
            )
        del engine
        phase("pearl_replay")

        if not args.skip_hf and not args.decode_only:
            replay_hf(hf, warm, args.hf_batch)
            hfr = replay_hf(hf, sessions, args.hf_batch, progress=True)
            assert (hfr.generated_tokens, hfr.prompt_tokens) == (
                pearl.generated_tokens,
                pearl.prompt_tokens,
            )
            result["replay"]["hf"] = summarize(hfr)
            print(
                f"hf replay: {hfr.wall_s:.1f}s, {hfr.generated_tokens / hfr.wall_s:.1f} gen tok/s",
                flush=True,
            )
            phase("hf_replay")

        if not args.skip_decode:
            result["decode"] = measure_decode(
                folder,
                None if args.skip_hf else hf,
                decode_batches,
                decode_prompt,
                decode_steps,
                decode_repeats,
                vocab,
                compare_gather=args.decode_compare_gather,
            )

        if not args.skip_decode:
            phase("decode")
    result["phase_seconds"] = phases
    ratio = None
    if "replay" in result:
        p, h = result["replay"]["pearl"], result["replay"].get("hf")
        ratio = p["generated_tokens_per_s"] / h["generated_tokens_per_s"] if h else None
        result["replay"]["throughput_ratio"] = ratio
    d64 = next((d for d in result.get("decode", {}).get("pearl", []) if d["batch"] == 64), None)
    result["targets"] = {
        "throughput_ratio_vs_hf>=2": {
            "value": None if ratio is None else round(ratio, 3),
            "pass": None if ratio is None else ratio >= 2.0,
        },
        "scheduler_fraction_at_batch64<0.10": {
            "value": None if d64 is None else round(d64["scheduler_fraction"], 4),
            "pass": None if d64 is None else d64["scheduler_fraction"] < 0.10,
        },
    }
    import transformers

    result["environment"] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "quick": args.quick,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if "replay" in result:
        print_table(result)
    if "decode" in result:
        print_decode_table(result["decode"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
