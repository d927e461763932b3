"""Contiguous K/V rows of decoding sequences: they mirror the paged cache, and the engine's
tokens and logprobs are the ones of the per-layer block gather they replace."""

import numpy as np
import torch

from pearl.engine.config import EngineConfig
from pearl.engine.decode_kv import DecodeKV, _contiguous_groups
from pearl.engine.engine import LLMEngine
from pearl.engine.sequence import Request, SamplingParams, SequenceStatus
from pearl.models.loader import build_model


def make_engine(cfg, gather=False, **kw):
    defaults = dict(block_size=4, num_kv_blocks=256, max_num_batched_tokens=24, max_num_seqs=8)
    defaults.update(kw)
    eng = LLMEngine(build_model(cfg, seed=0), EngineConfig(**defaults))
    if gather:
        eng.runner.decode_kv = None  # the previous path: gather blocks in every layer
    return eng


def workload(seed=0, n=7):
    g = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        prompt = g.integers(0, 97, size=int(g.integers(3, 60))).tolist()
        sp = SamplingParams(temperature=0, max_new_tokens=int(g.integers(2, 40)), ignore_eos=True)
        reqs.append(Request(f"r{i}", prompt, sp))
    return reqs


def rows_match_paged_cache(eng):
    """Every row holds exactly its sequence's K/V from the paged cache."""
    dk = eng.runner.decode_kv
    kv = eng.runner.kv_cache  # [layers, 2, kv_heads, blocks, block_size, dim]
    layers, _, heads, _, bs, dim = kv.shape
    flat = kv.view(layers, 2, heads, -1, dim)
    for r, (seq, n) in enumerate(zip(dk.seqs, dk.lens, strict=True)):
        if seq.status is SequenceStatus.FINISHED:  # its blocks are gone; the row goes next step
            continue
        slots = torch.tensor([seq.block_table[p // bs] * bs + p % bs for p in range(n)])
        assert torch.equal(dk.buf[:, :, r, :, :n], flat[:, :, :, slots]), (r, seq.request_id)


def test_rows_mirror_the_paged_cache_as_sequences_join_and_leave(tiny_config):
    eng = make_engine(tiny_config)
    reqs = workload()
    for r in reqs[:4]:
        eng.add_request(r)
    steps = 0
    while eng.has_unfinished():
        eng.step()
        steps += 1
        if steps == 5:
            for r in reqs[4:]:
                eng.add_request(r)
        rows_match_paged_cache(eng)
    dk = eng.runner.decode_kv
    assert dk.moved_rows > 0 and dk.filled_tokens > 0 and dk.fallbacks == 0


def same_outputs(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].token_ids == b[k].token_ids, k
        assert np.allclose(a[k].logprobs, b[k].logprobs, atol=1e-5), k


def test_rows_give_the_gather_paths_tokens_and_logprobs(tiny_config):
    reqs = workload(seed=1, n=8)
    rows = make_engine(tiny_config).generate(reqs)
    gather = make_engine(tiny_config, gather=True).generate(reqs)
    same_outputs(rows, gather)


def test_rows_survive_preemption_and_sessions(tiny_config):
    """Preempted sequences recompute their KV by prefill: their rows are refilled."""
    reqs = workload(seed=2, n=8)
    tight = make_engine(tiny_config, num_kv_blocks=40)
    out = tight.generate(reqs)
    assert tight.stats().preemptions > 0
    same_outputs(out, make_engine(tiny_config, gather=True).generate(reqs))

    # Pinned sessions: turn 2 appends to turn 1's KV and decodes from a fresh row.
    outs = {}
    for gather in (False, True):
        eng = make_engine(tiny_config, gather=gather)
        history = workload(seed=3, n=1)[0].prompt_token_ids
        got = []
        for turn in range(3):
            sp = SamplingParams(temperature=0, max_new_tokens=9, ignore_eos=True)
            o = eng.generate([Request(f"t{turn}", history, sp, session_id="s", pin_session=True)])
            got.append(o[f"t{turn}"])
            history = history + o[f"t{turn}"].token_ids + [5, 6, 7]
        outs[gather] = {o.request_id: o for o in got}
    same_outputs(outs[False], outs[True])


def test_a_buffer_over_its_memory_limit_falls_back_to_gathering(tiny_config):
    reqs = workload(seed=4, n=6)
    eng = make_engine(tiny_config)
    eng.runner.decode_kv.max_bytes = 1024  # smaller than any useful buffer
    out = eng.generate(reqs)
    assert eng.runner.decode_kv.fallbacks > 0 and eng.runner.decode_kv.buf is None
    same_outputs(out, make_engine(tiny_config, gather=True).generate(reqs))


def test_interleaved_lengths_are_sorted_into_few_groups(tiny_config):
    eng = make_engine(tiny_config, max_num_batched_tokens=512, max_num_seqs=16)
    g = np.random.default_rng(5)
    sp = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)
    lengths = [4, 200, 8, 150, 12, 180, 6, 220, 10, 160, 5, 190, 9, 170, 7, 210]
    reqs = [Request(f"r{i}", g.integers(0, 97, size=n).tolist(), sp) for i, n in enumerate(lengths)]
    out = eng.generate(reqs)
    dk = eng.runner.decode_kv
    assert dk.resorts > 0
    same_outputs(
        out,
        make_engine(tiny_config, gather=True, max_num_batched_tokens=512, max_num_seqs=16).generate(
            reqs
        ),
    )


def test_contiguous_groups_bound_padding():
    lengths = [100, 101, 400, 402, 100, 99]
    groups = _contiguous_groups(lengths)
    assert groups[0][0] == 0 and groups[-1][1] == len(lengths)
    for (_, b), (c, _) in zip(groups, groups[1:], strict=False):
        assert b == c
    for a, b in groups:
        assert (b - a) * max(lengths[a:b]) <= 1.25 * sum(lengths[a:b])
    assert _contiguous_groups([7] * 10) == [(0, 10)]


def test_forget_refills_a_row_from_the_paged_cache():
    kv = torch.randn(2, 2, 2, 8, 4, 3)  # layers, K/V, heads, blocks, block size, dim
    dk = DecodeKV(kv, block_size=4, max_bytes=1 << 20)

    class Seq:
        def __init__(self, n, table):
            self.num_tokens, self.block_table = n, table

    s = Seq(10, [5, 2, 7])
    plan = dk.plan([s])
    assert plan.order == [0] and dk.lens == [10]
    flat = kv.view(2, 2, 2, -1, 3)
    slots = torch.tensor([[5, 2, 7][p // 4] * 4 + p % 4 for p in range(9)])
    assert torch.equal(dk.buf[:, :, 0, :, :9], flat[:, :, :, slots])
    kv.view(2, 2, 2, -1, 3)[:, :, :, slots] += 1.0  # the paged cache changes under it
    dk.forget(s)
    s.num_tokens = 11
    dk.plan([s])
    assert torch.equal(dk.buf[:, :, 0, :, :9], flat[:, :, :, slots])
