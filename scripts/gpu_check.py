"""The engine on a GPU against transformers on the same GPU: logits and a greedy continuation,
in float32 and in bfloat16, and decode tokens/s at batch 1-64 beside transformers'
``generate`` on the same prompts. Run by scripts/gpu_check.sh; ``--device cpu`` runs the
same checks here (the test suite does, on a tiny model).

    python scripts/gpu_check.py --device cuda --model smollm2-135m --out gpu_check/engine.json

The JSON: ``checks`` (one row per dtype: logits, greedy tokens, ok) and ``decode`` (one row
per dtype and batch: the engine's and ``generate``'s tokens/s, each the best of two runs
after a warm-up, prompts of 64 tokens, 64 new tokens each, sampled at temperature 1).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from pearl.engine.config import EngineConfig
from pearl.engine.engine import LLMEngine
from pearl.engine.sequence import Request, SamplingParams
from pearl.models.catalog import resolve_model
from pearl.models.devices import torch_device, torch_dtype

TOLERANCE = {"float32": 1e-3, "bfloat16": 0.25}  # max |logit difference| against transformers
# Architectures to build with random weights where no weights can travel (a GPU machine
# with no network): SmolLM2-135M-Instruct's config.json (HuggingFaceTB, the model card's).
ARCHITECTURES = {
    "smollm2-135m": {
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    }
}


def random_model(name: str, folder: Path) -> Path:
    """``name``'s architecture with random weights, saved in ``folder`` (config.json and
    safetensors, which transformers loads too)."""
    from pearl.models.config import ModelConfig
    from pearl.models.loader import build_model, save_model

    if name not in ARCHITECTURES:
        raise SystemExit(f"--random-model {name!r}: known are {', '.join(ARCHITECTURES)}")
    folder.mkdir(parents=True, exist_ok=True)
    save_model(build_model(ModelConfig.from_dict(ARCHITECTURES[name]), seed=0), folder)
    return folder


def check(model: str, device: str, dtype: str, prompt_len: int = 48) -> dict:
    import transformers

    dev, dt = torch_device(device), torch_dtype(dtype)
    folder = resolve_model(model)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dt).to(dev).eval()
    vocab = theirs.config.vocab_size
    ids = [(7 * i + 3) % vocab for i in range(prompt_len)]
    engine = LLMEngine.from_folder(folder, EngineConfig(device=device, dtype=dtype))
    engine.runner.keep_logits = True
    sp = SamplingParams(temperature=0, max_new_tokens=16, ignore_eos=True)
    engine.add_request(Request("r", ids, sp))
    first = None
    out = None
    while out is None:
        for o in engine.step():
            out = o
        if first is None and engine.runner.last_logits is not None:
            first = engine.runner.last_logits[0].float().cpu()
    with torch.no_grad():
        x = torch.tensor([ids], device=dev)
        expected = theirs(x).logits[0, -1].float().cpu()
        reference = theirs.generate(x, max_new_tokens=16, do_sample=False)[0, len(ids) :].tolist()
    assert first is not None
    diff = float((first - expected).abs().max())
    agree = next(
        (i for i, (a, b) in enumerate(zip(out.token_ids, reference, strict=False)) if a != b), 16
    )
    # decode rate: 32 sequences of 64 new tokens
    batch = [
        Request(
            f"b{i}",
            ids[: 16 + i],
            SamplingParams(temperature=1.0, seed=i, max_new_tokens=64, ignore_eos=True),
        )
        for i in range(32)
    ]
    t0 = time.perf_counter()
    engine.generate(batch)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return {
        "device": device,
        "dtype": dtype,
        "max_logit_diff": diff,
        "tolerance": TOLERANCE[dtype],
        "greedy_tokens_equal": agree,
        "decode_tokens_per_s": 32 * 64 / seconds,
        "ok": diff <= TOLERANCE[dtype] and (dtype != "float32" or agree == 16),
    }


def decode_rates(model: str, device: str, dtype: str, batches: list[int], new: int = 64) -> list:
    """Decode tokens/s of the engine and of ``generate`` at each batch size, same prompts."""
    import transformers

    dev, dt = torch_device(device), torch_dtype(dtype)
    folder = resolve_model(model)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dt).to(dev).eval()
    vocab = theirs.config.vocab_size
    engine = LLMEngine.from_folder(folder, EngineConfig(device=device, dtype=dtype))

    def timed(fn) -> float:
        fn()  # warm-up (allocations, kernels)
        best = float("inf")
        for _ in range(2):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return best

    rows = []
    for b in batches:
        prompts = [[(11 * i + 5 * j + 1) % vocab for j in range(64)] for i in range(b)]

        def ours(prompts=prompts) -> None:
            engine.generate(
                [
                    Request(
                        f"d{i}-{time.perf_counter_ns()}",
                        p,
                        SamplingParams(
                            temperature=1.0, seed=i, max_new_tokens=new, ignore_eos=True
                        ),
                    )
                    for i, p in enumerate(prompts)
                ]
            )

        def hf(prompts=prompts) -> None:
            with torch.no_grad():
                theirs.generate(
                    torch.tensor(prompts, device=dev),
                    attention_mask=torch.ones(len(prompts), 64, dtype=torch.long, device=dev),
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    max_new_tokens=new,
                    min_new_tokens=new,
                    pad_token_id=0,
                )

        engine_s, hf_s = timed(ours), timed(hf)
        rows.append(
            {
                "dtype": dtype,
                "batch": b,
                "engine_tokens_per_s": b * new / engine_s,
                "generate_tokens_per_s": b * new / hf_s,
                "engine_vs_generate": hf_s / engine_s,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument(
        "--random-model",
        default=None,
        help=f"instead of --model, an architecture with random weights built here "
        f"({', '.join(ARCHITECTURES)}), for a machine no weights can reach",
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--out", default="gpu_check/engine.json")
    args = parser.parse_args()
    if args.random_model:
        folder = Path(args.out).parent / f"random-{args.random_model}"
        args.model = str(random_model(args.random_model, folder))
    rows = [check(args.model, args.device, dtype) for dtype in args.dtypes]
    for r in rows:
        print(
            f"engine {r['device']} {r['dtype']}: max |logit diff| {r['max_logit_diff']:.2e} "
            f"(<= {r['tolerance']}), greedy tokens equal {r['greedy_tokens_equal']}/16, "
            f"decode {r['decode_tokens_per_s']:.0f} tok/s: {'ok' if r['ok'] else 'FAILED'}"
        )
    decode = [
        r
        for dtype in args.dtypes
        for r in decode_rates(args.model, args.device, dtype, args.batches)
    ]
    for r in decode:
        print(
            f"decode {r['dtype']} batch {r['batch']}: engine {r['engine_tokens_per_s']:.0f} tok/s, "
            f"generate {r['generate_tokens_per_s']:.0f} tok/s ({r['engine_vs_generate']:.2f}x)"
        )
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"checks": rows, "decode": decode}, indent=2) + "\n")
    if not all(r["ok"] for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
