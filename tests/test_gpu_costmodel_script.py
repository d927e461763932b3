"""scripts/gpu_costmodel.py, the first GPU measurement of the cost model, run here at tiny
shapes on the CPU: every row it writes has its measurement and the cost model's price."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location(
        "gpu_costmodel", ROOT / "scripts" / "gpu_costmodel.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_costmodel"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules["gpu_costmodel"]


def test_tiny_run_writes_every_row_beside_its_price(script, tmp_path):
    out = tmp_path / "gpu_costmodel.json"
    script.main(["--tiny", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["tiny"] and result["pricing"]["tp"] == 2
    assert [m["model"] for m in result["models"]] == ["Qwen3-8B (tiny)", "Qwen3-30B-A3B (tiny)"]
    plan = script.TINY_PLAN
    for model in result["models"]:
        kinds = [r["kind"] for r in model["rows"]]
        assert kinds == ["decode"] * len(plan.decode_batches) + ["prefill_chunk"] * len(
            plan.chunk_priors
        ) + ["prefill"] * len(plan.prefill_tokens)
        assert [r["sequences"] for r in model["rows"][: len(plan.decode_batches)]] == list(
            plan.decode_batches
        )
        moe = model["per_gpu_shard"]["experts"] > 0
        for row in model["rows"]:
            measured, price = row["measured"], row["price"]
            assert measured["whole_model_s"] == pytest.approx(
                measured["stack_s"] * model["scale"] + measured["lm_head_s"]
            )
            assert price["kernels_s"] == pytest.approx(price["linear_s"] + price["attention_s"])
            assert price["kernels_s"] > 0 and price["total_s"] >= price["kernels_s"]
            assert row["ratio"] == pytest.approx(measured["whole_model_s"] / price["kernels_s"])
            assert all(math.isfinite(v) and v > 0 for v in row["reached"].values())
            assert (row["experts_touched"] is not None) == moe
    # The TP2 shard of the tiny MoE: heads and the expert width halved, KV heads 2 -> 1.
    shard = result["models"][1]["per_gpu_shard"]
    assert (shard["q_heads"], shard["kv_heads"], shard["expert_intermediate"]) == (8, 1, 32)


def test_attention_is_causal_attention_over_the_whole_context(script):
    """Decode's folded GQA call and a chunk's lower-right mask compute plain attention."""
    torch.manual_seed(0)
    q_heads, kv_heads, dim = 8, 2, 16
    for tokens, prior in ((1, 11), (5, 0), (5, 7)):
        q = torch.randn(2, q_heads, tokens, dim)
        k, v = (torch.randn(2, kv_heads, prior + tokens, dim) for _ in range(2))
        expanded = [t.repeat_interleave(q_heads // kv_heads, dim=1) for t in (k, v)]
        scores = q @ expanded[0].transpose(-1, -2) / math.sqrt(dim)
        allowed = torch.ones(tokens, prior + tokens, dtype=torch.bool).tril(prior)
        expected = scores.masked_fill(~allowed, -math.inf).softmax(-1) @ expanded[1]
        got = script.attend(q, k, v, prior)
        assert torch.allclose(got, expected, atol=1e-5), (tokens, prior)
