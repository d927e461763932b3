"""The iteration scheduler, driven without torch by a deterministic fake model."""

import dataclasses
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.engine.block_manager import BlockManager
from pearl.engine.config import EngineConfig
from pearl.engine.scheduler import Scheduler, _common_prefix_length
from pearl.engine.sequence import FinishReason, Request, Role, SamplingParams, Sequence
from pearl.errors import EngineStateError, RequestError

VOCAB = 50


def fake_next_token(history: list[int]) -> int:
    """A 'model' whose next token depends on the whole history, like a real one."""
    return (sum(history) * 31 + len(history)) % VOCAB


def make_scheduler(num_blocks=64, block_size=4, budget=32, max_seqs=8, role=Role.COLOCATED, **kw):
    """A scheduler of an engine's defaults but for the given limits (``kw``: other fields)."""
    engine = EngineConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs)
    cfg = dataclasses.replace(engine.scheduler_config(512, role), **kw)
    return Scheduler(cfg, BlockManager(num_blocks, block_size))


def submit(sched, rid, prompt, max_new=8, session=None, pin=False):
    sp = SamplingParams(temperature=0, max_new_tokens=max_new, ignore_eos=True)
    sched.add(Sequence(Request(rid, list(prompt), sp, session_id=session, pin_session=pin), 0, 0.0))


def drive(sched, max_iters=5000, on_step=None):
    outputs = []
    for _ in range(max_iters):
        if not sched.has_work():
            break
        out = sched.schedule()
        if on_step:
            on_step(out)
        assert out.num_tokens <= sched.config.max_num_batched_tokens
        assert len(sched.running) <= sched.config.max_num_seqs
        seqs = out.sampling_sequences()
        tokens = [fake_next_token(s.token_ids) for s in seqs]
        outputs += sched.postprocess(out, tokens, [-1.0] * len(tokens), weight_version=3)
        sched.blocks.check_invariants(sched.all_block_tables())
    assert not sched.has_work(), "scheduler did not finish"
    return {o.request_id: o for o in outputs}


def expected_tokens(prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(fake_next_token(seq))
    return seq[len(prompt) :]


def test_importing_the_scheduler_does_not_import_torch():
    code = "import sys, pearl.engine.scheduler, pearl.engine.block_manager, pearl.engine.kv_transfer; print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"


def test_chunked_prefill_splits_a_long_prompt_by_the_token_budget():
    sched = make_scheduler(budget=16)
    submit(sched, "a", range(1, 41), max_new=2)
    chunks = []
    drive(sched, on_step=lambda o: chunks.extend((c.start, c.end) for c in o.prefills))
    assert chunks == [(0, 16), (16, 32), (32, 40)]


def test_decodes_are_never_stalled_by_a_new_prefill():
    sched = make_scheduler(budget=16, num_blocks=128)
    for i in range(4):
        submit(sched, f"d{i}", [i + 1] * 5, max_new=30)
    for _ in range(2):  # get the four into decode
        out = sched.schedule()
        sched.postprocess(
            out,
            [fake_next_token(s.token_ids) for s in out.sampling_sequences()],
            [0.0] * len(out.sampling_sequences()),
            0,
        )
    submit(sched, "long", range(1, 100), max_new=2)
    out = sched.schedule()
    assert len(out.decodes) == 4  # decode-first
    assert [c.num_tokens for c in out.prefills] == [12]  # the rest of the budget


def test_outputs_carry_tokens_logprobs_and_weight_version():
    sched = make_scheduler()
    submit(sched, "a", [3, 4, 5], max_new=5)
    out = drive(sched)["a"]
    assert out.token_ids == expected_tokens([3, 4, 5], 5)
    assert out.logprobs == [-1.0] * 5
    assert out.weight_version == 3
    assert out.finish_reason is FinishReason.LENGTH


def test_stop_token_finishes_unless_ignore_eos():
    prompt = [3, 4, 5]
    first = expected_tokens(prompt, 1)[0]
    sched = make_scheduler(eos_token_ids=(first,))
    sched.add(
        Sequence(Request("a", prompt, SamplingParams(temperature=0, max_new_tokens=5)), 0, 0.0)
    )
    sched.add(
        Sequence(
            Request("b", prompt, SamplingParams(temperature=0, max_new_tokens=5, ignore_eos=True)),
            0,
            0.0,
        )
    )
    outs = drive(sched)
    assert outs["a"].finish_reason is FinishReason.STOP and outs["a"].token_ids == [first]
    assert len(outs["b"].token_ids) == 5


def test_pinned_session_appends_only_the_new_tokens():
    sched = make_scheduler(block_size=4)
    submit(sched, "t1", range(1, 11), max_new=3, session="s", pin=True)
    t1 = drive(sched)["t1"]
    history = list(range(1, 11)) + t1.token_ids + [7, 7, 7, 7, 7]
    submit(sched, "t2", history, max_new=3, session="s", pin=True)
    t2 = drive(sched)["t2"]
    # Turn 1 computed 10 prompt tokens + 2 decoded ones; the third sampled token had no KV yet.
    assert t2.telemetry.prefill_tokens_cached == 12
    assert t2.telemetry.prefill_tokens_computed == len(history) - 12
    assert t2.token_ids == expected_tokens(history, 3)
    assert sched.session_length("s") == len(history) + 2
    assert sched.release_session("s") and sched.session_length("s") == 0


def test_grpo_siblings_share_the_prompt_prefix():
    sched = make_scheduler(block_size=4, budget=64)
    submit(sched, "g0", range(1, 34), max_new=2)
    drive(sched)
    for i in range(1, 4):
        submit(sched, f"g{i}", range(1, 34), max_new=2)
    outs = drive(sched)
    assert all(outs[f"g{i}"].telemetry.prefill_tokens_cached == 32 for i in range(1, 4))


def test_preemption_by_recompute_loses_nothing():
    ample = make_scheduler(num_blocks=256, budget=32, max_seqs=8)
    tight = make_scheduler(num_blocks=14, budget=32, max_seqs=8)
    for sched in (ample, tight):
        for i in range(6):
            submit(sched, f"r{i}", [i + 1] * (5 + 3 * i), max_new=20)
    want, got = drive(ample), drive(tight)
    assert tight.num_preemptions > 0
    assert {k: v.token_ids for k, v in got.items()} == {k: v.token_ids for k, v in want.items()}
    assert sum(o.telemetry.preemptions for o in got.values()) == tight.num_preemptions


def test_abort_returns_the_partial_output_and_frees_blocks():
    sched = make_scheduler()
    submit(sched, "a", [1, 2, 3], max_new=50)
    for _ in range(4):
        out = sched.schedule()
        seqs = out.sampling_sequences()
        sched.postprocess(out, [fake_next_token(s.token_ids) for s in seqs], [0.0] * len(seqs), 0)
    partial = sched.abort("a")
    assert partial.finish_reason is FinishReason.ABORT
    assert partial.token_ids == expected_tokens([1, 2, 3], 4)
    assert sched.blocks.num_free_blocks == sched.blocks.num_blocks
    assert sched.abort("a") is None and not sched.has_work()


def test_prefill_role_holds_kv_after_the_first_token():
    sched = make_scheduler(role=Role.PREFILL)
    submit(sched, "p", range(1, 20), max_new=10, session="s")
    out = drive(sched)["p"]
    assert out.finish_reason is FinishReason.PREFILLED
    assert out.token_ids == expected_tokens(range(1, 20), 1)
    assert sched.session_length("s") == 19


def test_decode_role_rejects_requests_without_imported_kv():
    sched = make_scheduler(role=Role.DECODE)
    with pytest.raises(EngineStateError, match="import KV"):
        submit(sched, "d", range(1, 20), session="s")
    assert not sched.has_work()


def test_decode_role_with_local_prefill_runs_short_appends():
    sched = make_scheduler(role=Role.COLOCATED)
    submit(sched, "t1", range(1, 11), max_new=3, session="s", pin=True)
    t1 = drive(sched)["t1"]
    sched.config.role = Role.DECODE
    sched.config.local_prefill_max_tokens = 8
    history = list(range(1, 11)) + t1.token_ids + [5, 5, 5]
    submit(sched, "t2", history, max_new=2, session="s", pin=True)  # 4 uncomputed tokens
    assert drive(sched)["t2"].token_ids == expected_tokens(history, 2)
    too_long = history + expected_tokens(history, 2) + [9] * 20
    with pytest.raises(EngineStateError):
        submit(sched, "t3", too_long, session="s")


def test_bad_requests_are_rejected_without_changing_state():
    sched = make_scheduler()
    with pytest.raises(RequestError, match="max_model_len"):
        submit(sched, "long", [1] * 600)
    submit(sched, "a", [1, 2])
    with pytest.raises(RequestError, match="already in flight"):
        submit(sched, "a", [1, 2])
    assert sched.num_requests() == 1


@settings(max_examples=40, deadline=None)
@given(
    prompts=st.lists(st.integers(1, 60), min_size=1, max_size=10),
    news=st.lists(st.integers(1, 25), min_size=10, max_size=10),
    num_blocks=st.integers(22, 80),  # >= one sequence's 85 tokens
    budget=st.integers(1, 64),
    max_seqs=st.integers(1, 8),
)
def test_random_workloads_complete_exactly_once_with_correct_tokens(
    prompts, news, num_blocks, budget, max_seqs
):
    sched = make_scheduler(num_blocks=num_blocks, block_size=4, budget=budget, max_seqs=max_seqs)
    want = {}
    for i, n in enumerate(prompts):
        prompt = [(i * 7 + j) % VOCAB for j in range(n)]
        submit(sched, f"r{i}", prompt, max_new=news[i])
        want[f"r{i}"] = expected_tokens(prompt, news[i])
    got = drive(sched)
    assert {k: v.token_ids for k, v in got.items()} == want


def test_a_sequence_longer_than_the_whole_kv_cache_finishes_with_length():
    sched = make_scheduler(num_blocks=17, block_size=4, budget=64)
    submit(sched, "a", [1] * 60, max_new=25)
    out = drive(sched)["a"]
    assert out.finish_reason is FinishReason.LENGTH
    assert len(out.token_ids) == 17 * 4 - 60 + 1  # every slot used; the last token has no KV


def test_match_session_keeps_the_block_aligned_common_prefix_of_an_edited_context():
    sched = make_scheduler(num_blocks=32, block_size=4)
    submit(sched, "t1", range(1, 15), max_new=6, session="s", pin=True)  # 14 + 6 tokens
    t1 = drive(sched)["t1"]
    held = sched.session_length("s")
    assert held == 19  # the last sampled token's KV is never computed
    free_before = sched.blocks.num_free_blocks
    # Pure append: everything held is kept.
    append = list(range(1, 15)) + t1.token_ids + [7, 7]
    assert sched.match_session("s", append) == 19
    # The agent stripped the response (its "thinking") and appended an observation:
    # tokens [0, 14) agree, so whole blocks up to 12 stay and the rest is dropped.
    edited = list(range(1, 15)) + [9, 9, 9]
    assert sched.match_session("s", edited) == 12
    assert sched.session_length("s") == 12
    assert sched.session_tokens("s") == edited[:12]
    assert sched.blocks.num_free_blocks > free_before
    sched.blocks.check_invariants(sched.all_block_tables())
    # A context sharing less than one block drops the session; an unknown one holds nothing.
    assert sched.match_session("s", [42] * 20) == 0
    assert sched.session_length("s") == 0
    assert sched.match_session("nope", edited) == 0
    sched.blocks.check_invariants(sched.all_block_tables())


def test_import_errors_say_whether_the_prefix_differs_or_memory_is_short():
    from pearl.errors import KVOutOfMemory, KVPrefixMismatch

    sched = make_scheduler(num_blocks=8, block_size=4, role=Role.DECODE)
    sched.import_session("s", 0, list(range(1, 9)), [])
    with pytest.raises(KVPrefixMismatch):
        sched.import_session("s", 8, [5, 6], [0] * 8)  # continues other tokens
    with pytest.raises(KVPrefixMismatch):
        sched.import_session("s", 12, [5, 6], list(range(12)))  # starts past what is held
    assert sched.session_length("s") == 8  # nothing changed
    with pytest.raises(KVOutOfMemory):  # 40 tokens > 8 blocks of 4, even after unpinning "s"
        sched.import_session("t", 0, list(range(40)), [])
    assert sched.session_length("t") == 0
    sched.blocks.check_invariants(sched.all_block_tables())


def test_kv_is_labelled_with_the_weights_installed_not_the_last_iterations():
    """New weights land between iterations (``new_weights``). A request that hits KV
    imported after that, before this engine ran an iteration, holds KV of the new weights
    (a staleness check would otherwise see the old ones: a spurious StalenessError); KV
    imported from an exporter still on older weights never enters the prefix cache (a hit
    on it would be labelled with the new ones: staleness understated)."""
    prompt = list(range(1, 13))  # 3 full blocks of 4
    sched = make_scheduler(num_blocks=32, block_size=4, role=Role.COLOCATED)
    sched.new_weights(1)
    sched.import_session("a", 0, prompt, [], kv_version=1)  # computed elsewhere by v1
    assert sched.blocks.num_cached_blocks == 3
    sched.release_session("a")  # its blocks stay cached
    submit(sched, "b", prompt + [99])
    sched.schedule()
    (b,) = sched.running
    assert b.num_computed_tokens == 12 and b.kv_version == 1

    old = make_scheduler(num_blocks=32, block_size=4, role=Role.COLOCATED)
    old.new_weights(2)
    old.import_session("c", 0, prompt, [], kv_version=1)  # the sender had not updated yet
    assert old.blocks.num_cached_blocks == 0 and old.sessions["c"].kv_version == 1
    old.release_session("c")
    submit(old, "d", prompt + [99])
    old.schedule()
    (d,) = old.running
    assert d.num_computed_tokens == 0  # no hit on the old weights' KV


def test_prompts_waiting_when_weights_land_share_their_prefix_under_the_new_weights():
    """An update mid-rollout (``new_weights``): the running sequence's KV (old weights)
    never enters the cache, but prompts still waiting, holding no KV, compute theirs with
    the new weights: the first registers the shared prefix and the others attach it (they
    all prefilled it again before: each update at a batch's start cost a prefix per prompt)."""
    shared = list(range(1, 13))  # 3 full blocks of 4
    sched = make_scheduler(num_blocks=64, block_size=4, budget=13, max_seqs=8)
    submit(sched, "running", shared + [40], max_new=4)
    out = sched.schedule()  # its whole prompt is computed by the old weights
    tokens = [fake_next_token(x.token_ids) for x in out.sampling_sequences()]
    sched.postprocess(out, tokens, [-1.0] * len(tokens), weight_version=0)
    for rid in ("w1", "w2", "w3"):
        submit(sched, rid, shared + [40 + int(rid[1]), 50, 51], max_new=2)
    sched.new_weights(1)
    cached = {}

    def on_step(out):
        for chunk in out.prefills:
            cached.setdefault(chunk.seq.request_id, chunk.start)

    drive(sched, on_step=on_step)
    assert cached["w1"] == 0  # the first computes the prefix, now with the new weights ...
    assert cached["w2"] == cached["w3"] == 12  # ... and the others attach it
    assert "running" not in cached  # (its prompt was computed before the update)


def test_sglang_mode_runs_prefill_batches_alone_and_first():
    from pearl.engine.scheduler import SchedulingMode

    sched = make_scheduler(
        num_blocks=256,
        budget=64,
        mode=SchedulingMode.SGLANG,
        chunked_prefill_size=16,
        max_prefill_tokens=24,
    )
    submit(sched, "a", range(1, 6), max_new=20)
    shapes = []

    def record(out):
        shapes.append((sum(c.num_tokens for c in out.prefills), len(out.decodes)))

    for _ in range(3):  # "a" prefills, then decodes alone
        out = sched.schedule()
        record(out)
        toks = [fake_next_token(s.token_ids) for s in out.sampling_sequences()]
        sched.postprocess(out, toks, [0.0] * len(toks), 0)
    submit(sched, "b", range(11, 51), max_new=3)  # 40 tokens: chunks of 16
    outputs = drive(sched, on_step=record)
    # Never mixed; b's prefill stalls a's decodes (prefill first), in chunks of <= 16 tokens.
    assert all(p == 0 or d == 0 for p, d in shapes)
    assert shapes[:3] == [(5, 0), (0, 1), (0, 1)]
    assert shapes[3:6] == [(16, 0), (16, 0), (8, 0)]
    assert outputs["b"].token_ids == expected_tokens(range(11, 51), 3)


def test_both_modes_generate_the_same_tokens():
    import random

    from pearl.engine.scheduler import SchedulingMode

    rng = random.Random(4)
    reqs = [
        (f"r{i}", [rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 60))]) for i in range(12)
    ]
    results = []
    for mode in SchedulingMode:
        sched = make_scheduler(num_blocks=40, budget=16, mode=mode, chunked_prefill_size=12)
        for rid, prompt in reqs:
            submit(sched, rid, prompt, max_new=9)
        results.append({k: v.token_ids for k, v in drive(sched).items()})
    assert results[0] == results[1]
    assert results[0]["r3"] == expected_tokens(reqs[3][1], 9)


def test_flush_prefix_cache_drops_sessions_and_cached_blocks():
    sched = make_scheduler()
    submit(sched, "t1", range(1, 15), max_new=4, session="s", pin=True)
    drive(sched)
    assert sched.session_length("s") > 0 and sched.blocks.num_cached_blocks > 0
    sched.flush_prefix_cache()
    assert sched.session_length("s") == 0 and sched.blocks.num_cached_blocks == 0
    sched.blocks.check_invariants(sched.all_block_tables())


def test_unknown_scheduling_mode_is_rejected_with_the_valid_ones():
    with pytest.raises(ValueError, match="mixed, sglang"):
        make_scheduler(mode="vllm")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 3), max_size=40),
    st.lists(st.integers(0, 3), max_size=40),
    st.one_of(st.none(), st.integers(0, 45)),
)
def test_common_prefix_length_matches_a_token_by_token_scan(a, b, limit):
    n = min(len(a), len(b)) if limit is None else min(limit, len(a), len(b))
    expected = next((i for i in range(n) if a[i] != b[i]), n)
    assert _common_prefix_length(a, b, limit) == expected


def test_an_imported_session_is_unpinned_last_and_kept_when_its_turn_must_wait():
    """A decode worker's imported KV is claimed until its turn starts from it: memory
    pressure unpins every other session first (a PD decode server keeps the KV it
    preallocated for a transfer), and a turn that cannot be admitted yet gives its session
    back pinned instead of dropping it (it would prefill the whole prompt again)."""
    from pearl.engine.scheduler import SchedulingMode
    from pearl.errors import KVOutOfMemory

    sched = make_scheduler(
        num_blocks=9, block_size=4, mode=SchedulingMode.SGLANG, reserved_decode_tokens=0
    )
    submit(sched, "old", range(1, 9), max_new=1, session="old", pin=True)
    drive(sched)  # "old" pinned (3 blocks): a session no turn waits for
    sched.config.role = Role.DECODE
    sched.import_session("a", 0, list(range(100, 116)), [])  # 4 blocks, claimed
    sched.import_session("b", 0, list(range(200, 216)), [])  # 4 more: "old" goes, not "a"
    assert sched.session_length("a") == 16 and sched.session_length("old") == 0
    with pytest.raises(KVOutOfMemory):  # only claimed KV is left to unpin: refused
        sched.import_session("c", 0, list(range(300, 316)), [])
    assert sched.session_length("a") == sched.session_length("b") == 16
    # "b"'s turn takes the last free block for its sampled token; "a"'s turn attaches its
    # 16 tokens, finds no block for its own and waits, its imported KV pinned again.
    submit(sched, "b/d", list(range(200, 216)) + [7], max_new=3, session="b")
    submit(sched, "a/d", list(range(100, 116)) + [7], max_new=2, session="a")
    out = sched.schedule()
    assert [s.request_id for s in out.decodes] == ["b/d"]
    assert [s.request_id for s in sched.waiting] == ["a/d"] and sched.session_length("a") == 16
    sched.postprocess(out, [1], [-1.0], weight_version=0)
    sched.blocks.check_invariants(sched.all_block_tables())
    outs = drive(sched)
    assert outs["a/d"].telemetry.prefill_tokens_computed == 1  # its last token only
    assert outs["a/d"].telemetry.prefill_tokens_cached == 16


@pytest.mark.parametrize("mode", ["sglang", "mixed"])
def test_sglang_mode_admits_an_import_only_with_room_to_decode(mode):
    """SGLang's decode server takes a transfer only if 512 tokens per request
    (--num-reserved-decode-tokens) stay free for decoding, so its running requests are
    not retracted as they grow; the mixed mode (vLLM-like) takes whatever fits."""
    from pearl.engine.scheduler import SGLANG_RESERVED_DECODE_TOKENS, SchedulingMode
    from pearl.errors import KVOutOfMemory

    assert SGLANG_RESERVED_DECODE_TOKENS == 512
    sched = make_scheduler(
        num_blocks=40, block_size=16, role=Role.DECODE, mode=SchedulingMode(mode)
    )
    sched.import_session("a", 0, list(range(100)), [])  # 7 blocks + 32 reserved: fits 40
    if mode == "sglang":
        with pytest.raises(KVOutOfMemory, match="decode growth"):
            sched.import_session("b", 0, list(range(100)), [])  # 7 + 2 x 32 > 33 free
        assert sched.session_length("b") == 0 and sched.session_length("a") == 100
    else:
        sched.import_session("b", 0, list(range(100)), [])
        assert sched.session_length("b") == 100
    sched.blocks.check_invariants(sched.all_block_tables())


@pytest.mark.parametrize("mode", ["sglang", "mixed"])
def test_a_decode_engine_full_of_imported_turns_still_runs_them(mode):
    """Two imported turns fill a decode engine's KV and neither has a block for its sampled
    token. Nothing runs to free memory, so one session goes (its turn prefills again) and
    both finish; holding every claim would stall the engine for ever."""
    from pearl.engine.scheduler import SchedulingMode

    sched = make_scheduler(
        num_blocks=8,
        block_size=4,
        role=Role.DECODE,
        mode=SchedulingMode(mode),
        reserved_decode_tokens=0,
        local_prefill_max_tokens=64,
    )
    for sid in ("a", "b"):
        sched.import_session(sid, 0, list(range(16)), [])
        submit(sched, f"{sid}/d", list(range(16)) + [7], max_new=2, session=sid)
    outs = drive(sched)
    assert sorted(outs) == ["a/d", "b/d"]


def test_an_aborted_imported_turn_leaves_its_kv_unclaimed():
    """A waiting imported turn that is aborted (a weight update, a hand-back) no longer
    holds its session against memory pressure: the next import may unpin it."""
    from pearl.engine.scheduler import SchedulingMode

    sched = make_scheduler(
        num_blocks=8,
        block_size=4,
        role=Role.DECODE,
        mode=SchedulingMode.SGLANG,
        reserved_decode_tokens=0,
    )
    sched.import_session("a", 0, list(range(16)), [])
    submit(sched, "a/d", list(range(16)) + [7], max_new=2, session="a")
    sched.abort("a/d")
    sched.import_session("c", 0, list(range(100, 132)), [])  # all 8 blocks: "a" goes
    assert sched.session_length("a") == 0 and sched.session_length("c") == 32
    sched.blocks.check_invariants(sched.all_block_tables())


def test_the_decode_reserve_counts_each_request_once():
    """SGLang counts a request once whether it waits or its KV is still arriving: a turn
    waiting on its claimed session is one request, not two."""
    from pearl.engine.scheduler import SchedulingMode

    sched = make_scheduler(
        num_blocks=20,
        block_size=4,
        role=Role.DECODE,
        mode=SchedulingMode.SGLANG,
        reserved_decode_tokens=16,  # 4 blocks per request
    )
    sched.import_session("a", 0, list(range(16)), [])  # 4 blocks + 4 reserved
    submit(sched, "a/d", list(range(16)) + [7], max_new=2, session="a")  # still waiting
    sched.import_session("b", 0, list(range(20)), [])  # 5 blocks + 2 x 4 reserved <= 16 free
    assert sched.session_length("b") == 20
