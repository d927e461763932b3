"""Numerical parity of PEARL's paged-attention Qwen3/Llama with Hugging Face transformers.

Random tiny checkpoints are built with ``transformers``, saved as safetensors (one
sharded), loaded with ``pearl.models.loader.load_model`` and compared in float32:

* prefill logits at every prompt position (whole prompt, and chunked over the paged cache);
* the logits of every engine step of a 64-token greedy generation, against HF's
  logits for the same prefix;
* the greedy tokens, against HF ``generate(do_sample=False)``;
* all of the above with several prompts of different lengths batched concurrently,
  chunked prefill, prefix-cache hits and preemption (batching must not change results).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tiny_model import TINY_LAYERS  # noqa: E402

from pearl.engine.config import EngineConfig  # noqa: E402
from pearl.engine.engine import LLMEngine  # noqa: E402
from pearl.engine.sequence import Request, SamplingParams  # noqa: E402
from pearl.models.attention import AttentionMetadata, PrefillSegment, chunk_causal_mask  # noqa: E402
from pearl.models.decoder import DecoderForCausalLM  # noqa: E402
from pearl.models.loader import load_model  # noqa: E402

torch.set_num_threads(1)

ATOL = 1e-4
VOCAB = 256
NEW_TOKENS = 64


# -- checkpoints ------------------------------------------------------------------------

COMMON = dict(
    vocab_size=VOCAB,
    **TINY_LAYERS,  # GQA
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
    attn_implementation="sdpa",  # bit-identical to ours here; "eager" differs by ~1e-6
)

CASES: dict[str, tuple[str, dict, str | None]] = {
    # name: (architecture, config kwargs, max_shard_size for save_pretrained)
    "qwen3": (
        "qwen3",
        dict(
            head_dim=32, rope_theta=1_000_000.0, tie_word_embeddings=False
        ),  # head_dim != hidden/heads
        None,
    ),
    "qwen3_tied_sharded": (
        "qwen3",
        dict(head_dim=16, rope_theta=10_000.0, tie_word_embeddings=True),
        "40KB",
    ),
    "llama3_scaled_bias_sharded": (
        "llama",
        dict(
            rope_theta=500_000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            attention_bias=True,
            tie_word_embeddings=False,
        ),
        "40KB",
    ),
}


@dataclass
class Checkpoint:
    name: str
    folder: Path
    hf: torch.nn.Module
    ours: DecoderForCausalLM


def _build_hf(arch: str, kwargs: dict, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    if arch == "qwen3":
        cfg = transformers.Qwen3Config(**COMMON, **kwargs)
        model = transformers.Qwen3ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(**COMMON, **kwargs)
        model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        # Perturb every tensor (norm weights, biases too) so a swapped or skipped tensor shows.
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model.float().eval()


@pytest.fixture(scope="module", params=list(CASES))
def ckpt(request, tmp_path_factory) -> Checkpoint:
    name = request.param
    arch, kwargs, shard = CASES[name]
    hf = _build_hf(arch, kwargs, seed=sorted(CASES).index(name))
    folder = tmp_path_factory.mktemp(name)
    if shard is None:
        hf.save_pretrained(folder, safe_serialization=True)
    else:
        hf.save_pretrained(folder, safe_serialization=True, max_shard_size=shard)
    return Checkpoint(name, folder, hf, load_model(folder))


def test_checkpoint_layout_and_loaded_config(ckpt: Checkpoint) -> None:
    """The fixtures exercise what they claim: sharding, tying, config fields from transformers 5."""
    arch, kwargs, shard = CASES[ckpt.name]
    shards = sorted(ckpt.folder.glob("*.safetensors"))
    if shard is None:
        assert [p.name for p in shards] == ["model.safetensors"]
    else:
        assert (ckpt.folder / "model.safetensors.index.json").is_file()
        assert len(shards) > 1
    cfg = ckpt.ours.config
    hf_cfg = ckpt.hf.config
    assert cfg.model_type == arch
    assert cfg.head_dim == hf_cfg.head_dim
    assert cfg.num_key_value_heads == 2 and cfg.num_attention_heads == 4
    assert cfg.rope_theta == kwargs["rope_theta"]
    assert cfg.tie_word_embeddings == kwargs["tie_word_embeddings"]
    assert cfg.attention_bias == kwargs.get("attention_bias", False)
    if "rope_scaling" in kwargs:
        assert cfg.rope_scaling is not None
        assert cfg.rope_scaling.get("rope_type", cfg.rope_scaling.get("type")) == "llama3"
        assert cfg.rope_scaling["factor"] == 8.0
    else:
        assert cfg.rope_scaling is None
    if cfg.tie_word_embeddings:
        assert ckpt.ours.lm_head.weight.data_ptr() == ckpt.ours.model.embed_tokens.weight.data_ptr()
    # Every HF tensor landed in our model unchanged.
    ours = dict(ckpt.ours.named_parameters())
    for name, p in ckpt.hf.named_parameters():
        assert torch.equal(ours[name], p), name


# -- helpers ------------------------------------------------------------------------------


def _prompt(seed: int, length: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (length,), generator=g).tolist()


def _empty_caches(model: DecoderForCausalLM, num_blocks: int, block_size: int):
    cfg = model.config
    shape = (cfg.num_key_value_heads, num_blocks, block_size, cfg.head_dim)
    return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_hidden_layers)]


@torch.inference_mode()
def ours_prefill_logits(
    model: DecoderForCausalLM, ids: list[int], block_size: int = 4
) -> torch.Tensor:
    """Logits at every position of one prefill segment with no prior context."""
    n = len(ids)
    caches = _empty_caches(model, -(-n // block_size), block_size)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n),
        prefills=[PrefillSegment(0, n, n, None, None)],
        num_prefill_tokens=n,
        decode_groups=[],
    )
    hidden = model(torch.tensor(ids), torch.arange(n), caches, meta)
    return model.compute_logits(hidden)


@torch.inference_mode()
def ours_chunked_prefill_logits(
    model: DecoderForCausalLM, ids: list[int], chunk: int, block_size: int = 4
) -> torch.Tensor:
    """Logits at every position, prefilling ``chunk`` tokens at a time over a paged cache
    whose blocks are deliberately non-contiguous and reversed."""
    n = len(ids)
    num_blocks = -(-n // block_size)
    table = list(range(2 * num_blocks - 1, -1, -2))  # e.g. [7, 5, 3, 1]
    caches = _empty_caches(model, 2 * num_blocks, block_size)
    out = []
    for start in range(0, n, chunk):
        end = min(n, start + chunk)
        slots = torch.tensor(
            [table[p // block_size] * block_size + p % block_size for p in range(start, end)]
        )
        if start == 0:
            seg = PrefillSegment(0, end, end, None, None)
        else:
            blocks = torch.tensor(table[: -(-end // block_size)])
            seg = PrefillSegment(
                0,
                end - start,
                end,
                blocks,
                chunk_causal_mask(end - start, end, torch.device("cpu")),
            )
        meta = AttentionMetadata(slots, [seg], end - start, [])
        hidden = model(torch.tensor(ids[start:end]), torch.arange(start, end), caches, meta)
        out.append(model.compute_logits(hidden))
    return torch.cat(out)


_HF_CACHE: dict[tuple[str, tuple[int, ...]], tuple[list[int], torch.Tensor]] = {}


@torch.no_grad()
def hf_reference(ckpt: Checkpoint, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    """HF greedy tokens (``generate``) and HF logits that predicted each of them,
    ``[NEW_TOKENS, vocab]``, from one full forward over prompt + generated tokens."""
    key = (ckpt.name, tuple(prompt))
    if key not in _HF_CACHE:
        ids = torch.tensor([prompt])
        gen = ckpt.hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            pad_token_id=0,
        )
        tokens = gen[0, len(prompt) :].tolist()
        assert len(tokens) == NEW_TOKENS
        full = ckpt.hf(gen).logits[0].float()
        logits = full[len(prompt) - 1 : len(prompt) - 1 + NEW_TOKENS]
        # Self-check of the reference: a full forward's argmax reproduces generate's tokens.
        assert logits.argmax(-1).tolist() == tokens
        _HF_CACHE[key] = (tokens, logits)
    return _HF_CACHE[key]


def record_step_logits(engine: LLMEngine) -> dict[str, list[torch.Tensor]]:
    """Per request, the logits of every step that sampled a token for it, in order."""
    engine.runner.keep_logits = True
    log: dict[str, list[torch.Tensor]] = {}
    execute = engine.runner.execute

    def wrapped(out):
        rids = [s.request_id for s in out.sampling_sequences()]
        engine.runner.last_logits = None
        result = execute(out)
        if rids:
            logits = engine.runner.last_logits
            assert logits is not None and logits.dtype == torch.float32
            assert logits.shape == (len(rids), VOCAB)
            for i, rid in enumerate(rids):
                log.setdefault(rid, []).append(logits[i].clone())
        return result

    engine.runner.execute = wrapped
    return log


def greedy(n: int = NEW_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


def assert_matches_hf(ckpt, prompt, tokens, step_logits, n=NEW_TOKENS) -> float:
    ref_tokens, ref_logits = hf_reference(ckpt, prompt)
    assert tokens == ref_tokens[:n]
    assert len(step_logits) == n
    ours = torch.stack(step_logits)
    diff = (ours - ref_logits[:n]).abs().max().item()
    assert diff <= ATOL, f"max |logit diff| {diff:.3g} > {ATOL}"
    return diff


# -- tests --------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 7, 50])
def test_prefill_logits_every_position(ckpt: Checkpoint, length: int) -> None:
    prompt = _prompt(100 + length, length)
    with torch.no_grad():
        ref = ckpt.hf(torch.tensor([prompt])).logits[0].float()
    ours = ours_prefill_logits(ckpt.ours, prompt)
    assert ours.shape == ref.shape == (length, VOCAB)
    assert (ours - ref).abs().max().item() <= ATOL


@pytest.mark.parametrize("chunk", [5, 16])
def test_chunked_prefill_over_paged_cache_every_position(ckpt: Checkpoint, chunk: int) -> None:
    prompt = _prompt(7, 45)
    with torch.no_grad():
        ref = ckpt.hf(torch.tensor([prompt])).logits[0].float()
    ours = ours_chunked_prefill_logits(ckpt.ours, prompt, chunk)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() <= ATOL


@pytest.mark.parametrize("max_batched", [256, 16], ids=["whole_prefill", "chunked_prefill"])
def test_greedy_generation_and_step_logits_match_hf(ckpt: Checkpoint, max_batched: int) -> None:
    prompt = _prompt(1, 40)
    engine = LLMEngine(
        ckpt.ours, EngineConfig(block_size=4, num_kv_blocks=128, max_num_batched_tokens=max_batched)
    )
    log = record_step_logits(engine)
    outs = engine.generate([Request("a", prompt, greedy())])
    if max_batched < len(prompt):
        assert engine.stats().iterations == -(-len(prompt) // max_batched) + NEW_TOKENS - 1
    assert_matches_hf(ckpt, prompt, outs["a"].token_ids, log["a"])
    # Greedy logprobs are log_softmax of the step logits at the chosen token.
    ref_tokens, ref_logits = hf_reference(ckpt, prompt)
    ref_lp = (
        torch.log_softmax(ref_logits, -1).gather(1, torch.tensor(ref_tokens)[:, None]).squeeze(1)
    )
    assert torch.allclose(torch.tensor(outs["a"].logprobs), ref_lp, atol=ATOL)


# Prompts of different lengths; "p_shared" repeats the first 24 tokens of "p_long" (prefix cache).
BATCH = {
    "p_short": (_prompt(11, 3), NEW_TOKENS),
    "p_long": (_prompt(12, 41), NEW_TOKENS),
    "p_mid": (_prompt(13, 18), 37),  # finishes early, freeing its slot mid-run
    "p_one": (_prompt(14, 1), NEW_TOKENS),
    "p_shared": (_prompt(12, 24) + _prompt(15, 9), NEW_TOKENS),
}


ARRIVALS = {
    0: ["p_short", "p_long", "p_mid"],
    5: ["p_one"],
    20: ["p_shared"],
}  # step -> new requests


@pytest.mark.parametrize("num_kv_blocks", [128, 40], ids=["ample_kv", "preempting_kv"])
def test_continuous_batching_matches_hf(ckpt: Checkpoint, num_kv_blocks: int) -> None:
    engine = LLMEngine(
        ckpt.ours,
        EngineConfig(block_size=4, num_kv_blocks=num_kv_blocks, max_num_batched_tokens=16),
    )
    log = record_step_logits(engine)
    batch_sizes: list[int] = []
    execute = engine.runner.execute
    engine.runner.execute = lambda out: (
        batch_sizes.append(len(out.prefills) + len(out.decodes)),
        execute(out),
    )[1]
    outputs = {}
    step = 0
    while engine.has_unfinished() or step <= max(ARRIVALS):
        for rid in ARRIVALS.get(step, []):  # arrive while others are mid-prefill or decoding
            prompt, n = BATCH[rid]
            engine.add_request(Request(rid, list(prompt), greedy(n)))
        for o in engine.step():
            outputs[o.request_id] = o
        step += 1
        assert step < 2000
    assert set(outputs) == set(BATCH)
    assert max(batch_sizes) >= 4, "requests were meant to run concurrently"
    stats = engine.stats()
    assert stats.cache_hit_tokens > 0 or num_kv_blocks < 128, (
        "p_shared was meant to hit the prefix cache"
    )
    if num_kv_blocks < 128:
        assert stats.preemptions > 0, "the small KV cache was meant to force preemption"
    for rid, (prompt, n) in BATCH.items():
        assert outputs[rid].prompt_len == len(prompt)
        assert_matches_hf(ckpt, prompt, outputs[rid].token_ids, log[rid], n)
