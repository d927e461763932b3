"""TokenRuns behaves as the list of its ids: every operation checked against a list."""

import itertools
import random

import pytest

from pearl.token_runs import LITERAL, TokenRuns, block_keys, id_pool, id_walk

VOCAB = 1000  # small pools: walks wrap and pools share ids, the awkward cases


def build(rng: random.Random) -> tuple[TokenRuns, list[int]]:
    """A random sequence of walks (two pools), sampled-looking appends and literals."""
    runs, ids = TokenRuns.empty(VOCAB), []
    for _ in range(rng.randrange(1, 8)):
        kind = rng.randrange(4)
        n = rng.randrange(0, 300)
        start = rng.randrange(10**6)
        if kind == 0:
            piece = TokenRuns.walk(VOCAB, 0, start, n)
            runs += piece
            ids += id_walk(VOCAB, 0, start, n)
        elif kind == 1:
            runs.extend_walk(start, n)
            ids += id_walk(VOCAB, 1, start, n)
        elif kind == 2:
            for token in id_walk(VOCAB, 1, start, min(n, 20)):
                runs.append(token)
                ids.append(token)
        else:
            runs.append(0)  # not in the sampler's pool: a literal
            ids.append(0)
    return runs, ids


@pytest.mark.parametrize("seed", range(40))
def test_every_list_operation_gives_the_lists_answer(seed):
    rng = random.Random(seed)
    runs, ids = build(rng)
    assert len(runs) == len(ids) and runs.tolist() == ids and runs == ids
    for _ in range(20):
        a, b = sorted(rng.randrange(len(ids) + 1) for _ in range(2))
        assert runs[a:b].tolist() == ids[a:b]
        assert runs[a:].tolist() == ids[a:] and runs[:b].tolist() == ids[:b]
        if ids:
            i = rng.randrange(-len(ids), len(ids))
            assert runs[i] == ids[i]
    a, b = sorted(rng.randrange(len(ids) + 1) for _ in range(2))
    cut = runs.copy()
    del cut[a:b]
    assert cut.tolist() == ids[:a] + ids[b:]
    assert (runs + cut).tolist() == ids + ids[:a] + ids[b:]
    assert ([5, 6] + runs).tolist() == [5, 6] + ids
    assert runs.tolist() == ids  # copies and slices left the original alone


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("seed", range(40))
def test_common_prefix_and_equality_are_exact(seed):
    rng = random.Random(seed)
    a, a_ids = build(rng)
    b = a.copy()
    b_ids = list(a_ids)
    # Edit b: cut, then continue differently (as an agent's edited context).
    keep = rng.randrange(len(a_ids) + 1)
    del b[keep:]
    del b_ids[keep:]
    more, more_ids = build(rng)
    b += more
    b_ids += more_ids
    limit = rng.choice([None, rng.randrange(len(a_ids) + 1)])
    want = lcp(a_ids, b_ids) if limit is None else min(limit, lcp(a_ids, b_ids))
    assert a.common_prefix(b, limit) == want == b.common_prefix(a, limit)
    assert (a == b) == (a_ids == b_ids)


def test_the_same_ids_in_different_runs_still_compare_equal():
    """A coincidence across pools (a token of one pool continuing a run of another):
    comparison falls back to tokens and stays exact."""
    pool0 = id_pool(VOCAB, 0)
    x = TokenRuns.walk(VOCAB, 0, 10, 5)
    y = TokenRuns.empty(VOCAB)
    for token in pool0[10:15]:
        y.append(token)  # looked up in the sampler's pool: other runs, the same ids
    assert x.num_runs == 1 and y.num_runs > 1
    assert x == y and x.common_prefix(y) == 5


def sharing_a_prefix(rng: random.Random) -> tuple[int, TokenRuns, list[int], TokenRuns]:
    """A block size and two sequences, the second a cut of the first continued otherwise
    (the first's ids too, built as a list beside it)."""
    bs = rng.choice([1, 4, 16])
    a, a_ids = build(rng)
    b = a[: rng.randrange(len(a) + 1)]
    b += build(rng)[0]
    return bs, a, a_ids, b


@pytest.mark.parametrize("seed", range(20))
def test_block_keys_are_equal_exactly_for_equal_blocks(seed):
    bs, a, a_ids, b = sharing_a_prefix(random.Random(seed))
    b_ids = b.tolist()
    na, nb = len(a_ids) // bs, len(b_ids) // bs
    ka, kb = a.block_keys(0, na, bs), b.block_keys(0, nb, bs)
    assert len(ka) == na and len(kb) == nb
    for i in range(na):
        # A key determines the block's ids.
        assert a.block_keys(i, i + 1, bs) == [ka[i]]
        for j in range(nb):
            if ka[i] == kb[j]:
                assert a_ids[i * bs : (i + 1) * bs] == b_ids[j * bs : (j + 1) * bs]
    # Both built the same way up to the cut: shared blocks get the same keys.
    shared = lcp(a_ids, b_ids) // bs
    assert ka[:shared] == kb[:shared]
    # The list form: the blocks' ids.
    assert block_keys(a_ids, 0, na, bs) == [tuple(a_ids[i * bs : (i + 1) * bs]) for i in range(na)]


def chain(keys: list, prev: int) -> list[int]:
    out = []
    for key in keys:
        prev = hash((prev, key))
        out.append(prev)
    return out


@pytest.mark.parametrize("seed", range(30))
def test_block_hashes_identify_a_blocks_whole_prefix_by_its_keys(seed):
    """Identities are equal exactly where the chain over block keys is (the plain chain:
    the same prefix of keys), however the blocks are split into calls."""
    rng = random.Random(seed)
    bs, a, _, b = sharing_a_prefix(rng)
    c = b.copy()
    c.extend_walk(rng.randrange(10**6), rng.randrange(200))  # a decode continuing b
    seqs = [x for x in (a, b, c) if len(x) >= bs]
    ids, plain = [], []
    for x in seqs:
        n = len(x) // bs
        whole = x.block_hashes(0, n, bs, -1)
        # In pieces: each call chained from the last identity of the one before.
        cuts = sorted({0, n, *(rng.randrange(n + 1) for _ in range(3))})
        pieces: list[int] = []
        for lo, hi in itertools.pairwise(cuts):
            pieces += x.block_hashes(lo, hi, bs, pieces[-1] if lo else -1)
        assert pieces == whole and len(whole) == n
        ids.append(whole)
        plain.append(chain(x.block_keys(0, n, bs), -1))
    # One identity for each plain chain value and the other way round.
    pairs = {(h, g) for hs, gs in zip(ids, plain, strict=True) for h, g in zip(hs, gs, strict=True)}
    assert len({h for h, _ in pairs}) == len(pairs) == len({g for _, g in pairs})
    # Not chained (a root at ``first``): its first block's identity is the plain chain's.
    x = seqs[-1]
    n = len(x) // bs
    if n > 1:
        assert (
            x.block_hashes(1, n, bs, -1, chained=False)[0] == chain(x.block_keys(1, 2, bs), -1)[0]
        )


def test_literals_and_errors():
    r = TokenRuns.empty(VOCAB)
    r.append(0)
    assert r._runs == [(LITERAL, 0, 1)] and r.tolist() == [0]
    with pytest.raises(IndexError):
        r[1]
    with pytest.raises(TypeError):
        r[::2]
    with pytest.raises(TypeError):
        hash(r)


def test_runs_mean_the_same_in_another_process():
    """A pool's id is a function of the pool: a pickled TokenRuns is the same ids in a
    fresh interpreter."""
    import pickle
    import subprocess
    import sys

    runs, ids = build(random.Random(7))
    code = "import pickle, sys; print(pickle.loads(sys.stdin.buffer.read()).tolist())"
    out = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(runs), capture_output=True, check=True
    )
    assert out.stdout.decode().strip() == str(ids)


@pytest.mark.parametrize("deployment", ["2C", "1P1D"])
def test_a_simulated_batch_is_the_same_on_runs_as_on_lists(deployment):
    """The engine's scheduler and block manager on TokenRuns contexts give what they give
    on token lists: every turn's timing, tokens and cache hits, colocated and through PD
    (KV moved between workers), on the paper's SWE workload (edited contexts)."""
    from pearl.control.deployment import Deployment
    from pearl.sim.costmodel import CostModel
    from pearl.sim.fixed import simulate_fixed_rollout
    from pearl.sim.hardware import get_gpu
    from pearl.sim.shapes import load_model_shape
    from pearl.workloads.agentic import generate_batch
    from pearl.workloads.profiles import get_profile

    cost = CostModel(get_gpu("H800"), load_model_shape("Qwen3-8B"), tp=2)
    batch = generate_batch(get_profile("swe_paper"), num_tasks=2, group_size=4, seed=5)

    def run(token_runs: bool):
        report = simulate_fixed_rollout(
            batch, cost, Deployment.parse(deployment), token_runs=token_runs
        )
        turns = [
            (o.request_id, o.finish_reason, o.telemetry, list(o.token_ids))
            for t in report.result.trajectories
            for o in t.turns
        ]
        return report.makespan_s, turns

    on_runs, on_lists = run(True), run(False)
    assert on_runs[0] == on_lists[0]
    assert on_runs[1] == on_lists[1]
