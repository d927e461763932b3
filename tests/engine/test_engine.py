"""The torch engine: PD equivalence, prefix cache, preemption, abort, sleep/wake, weights, bad input."""

import dataclasses

import numpy as np
import pytest
import torch

from pearl.engine.config import EngineConfig
from pearl.engine.engine import LLMEngine
from pearl.engine.kv_transfer import KVChunk
from pearl.engine.scheduler import InFlight
from pearl.engine.sequence import FinishReason, Request, Role, SamplingParams
from pearl.errors import EngineStateError, KVTransferError, RequestError
from pearl.models.loader import build_model

GREEDY = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)


def make_engine(cfg, role=Role.COLOCATED, seed=0, **kw):
    defaults = dict(
        block_size=4,
        num_kv_blocks=256,
        max_num_batched_tokens=24,
        max_num_seqs=8,
        role=role,
        model_id="tiny",
    )
    defaults.update(kw)
    eng = LLMEngine(build_model(cfg, seed=seed), EngineConfig(**defaults))
    eng.runner.keep_logits = True
    return eng


def run_collecting_logits(eng, rid):
    """Step until ``rid`` finishes; return its output and the logits of each of its tokens."""
    logits = []
    while True:
        out = eng.scheduler.schedule()
        samplers = out.sampling_sequences()
        tokens, logprobs = eng.runner.execute(out) if not out.is_empty else ([], [])
        for i, seq in enumerate(samplers):
            if seq.request_id == rid:
                logits.append(eng.runner.last_logits[i].clone())
        for o in eng.scheduler.postprocess(out, tokens, logprobs, eng.weight_version):
            if o.request_id == rid:
                return o, logits


def prompts(n, lengths, vocab=97, seed=0):
    g = np.random.default_rng(seed)
    return [g.integers(0, vocab, size=length).tolist() for length in lengths[:n]]


def pd_turn(P, D, rid, sid, prompt, sp):
    """One turn disaggregated: prefill on P, move the new KV to D, decode on D."""
    P.add_request(Request(f"{rid}/p", prompt, sp, session_id=sid))
    out_p, logits_p = run_collecting_logits(P, f"{rid}/p")
    assert out_p.finish_reason is FinishReason.PREFILLED
    held = D.session_length(sid)
    chunk = P.export_kv(sid, held, len(prompt))
    assert D.import_kv(chunk) == len(prompt) - held
    first = out_p.token_ids
    rest = dataclasses.replace(sp, max_new_tokens=sp.max_new_tokens - 1)
    D.add_request(Request(f"{rid}/d", prompt + first, rest, session_id=sid, pin_session=True))
    out_d, logits_d = run_collecting_logits(D, f"{rid}/d")
    return first + out_d.token_ids, out_p.logprobs + out_d.logprobs, logits_p + logits_d


def coloc_turn(C, rid, sid, prompt, sp):
    C.add_request(Request(rid, prompt, sp, session_id=sid, pin_session=True))
    out, logits = run_collecting_logits(C, rid)
    return out.token_ids, out.logprobs, logits


@pytest.mark.parametrize(
    "sampling",
    [
        GREEDY,
        SamplingParams(
            temperature=0.9, top_p=0.9, top_k=20, seed=7, max_new_tokens=10, ignore_eos=True
        ),
    ],
)
def test_prefill_transfer_decode_matches_colocated_over_turns(tiny_config, sampling):
    C = make_engine(tiny_config)
    P = make_engine(tiny_config, role=Role.PREFILL)
    D = make_engine(tiny_config, role=Role.DECODE)
    history = prompts(1, [37])[0]
    for turn in range(3):
        tc, lc, xc = coloc_turn(C, f"c{turn}", "s", history, sampling)
        tp, lp, xp = pd_turn(P, D, f"t{turn}", "s", history, sampling)
        assert tp == tc, f"turn {turn}"
        assert np.allclose(lp, lc, atol=1e-4)
        assert len(xp) == len(xc)
        for a, b in zip(xp, xc, strict=True):
            assert torch.allclose(a, b, atol=1e-4)
        history = history + tc + prompts(1, [9 + 5 * turn], seed=turn + 1)[0]
    # Later turns were append-prefills: P and D reused what they held.
    assert P.stats().cache_hit_tokens > 0 and D.stats().prefill_tokens < 10


def test_colocated_results_do_not_depend_on_batching_or_chunking(tiny_config):
    ps = prompts(5, [5, 17, 33, 8, 50])
    alone = {}
    for i, p in enumerate(ps):
        eng = make_engine(tiny_config, max_num_batched_tokens=512)
        alone[f"r{i}"] = eng.generate([Request(f"r{i}", p, GREEDY)])[f"r{i}"].token_ids
    eng = make_engine(tiny_config, max_num_batched_tokens=7, max_num_seqs=3)
    together = eng.generate([Request(f"r{i}", p, GREEDY) for i, p in enumerate(ps)])
    assert {k: v.token_ids for k, v in together.items()} == alone


def test_prefix_cache_serves_grpo_siblings_with_identical_results(tiny_config):
    eng = make_engine(tiny_config)
    prompt = prompts(1, [41])[0]
    first = eng.generate([Request("g0", prompt, GREEDY)])["g0"]
    siblings = eng.generate([Request(f"g{i}", prompt, GREEDY) for i in range(1, 4)])
    for out in siblings.values():
        assert out.token_ids == first.token_ids
        assert out.telemetry.prefill_tokens_cached == 40
        assert out.telemetry.prefill_tokens_computed == 1


def test_preemption_under_memory_pressure_gives_the_same_tokens(tiny_config):
    ps = prompts(6, [20, 25, 30, 15, 22, 28], seed=3)

    def reqs():
        sp = SamplingParams(temperature=0, max_new_tokens=30, ignore_eos=True)
        return [Request(f"r{i}", p, sp) for i, p in enumerate(ps)]

    ample = make_engine(tiny_config).generate(reqs())
    tight_engine = make_engine(tiny_config, num_kv_blocks=30)
    tight = tight_engine.generate(reqs())
    assert tight_engine.stats().preemptions > 0
    assert {k: v.token_ids for k, v in tight.items()} == {k: v.token_ids for k, v in ample.items()}


def test_abort_returns_partial_output_and_engine_keeps_serving(tiny_config):
    eng = make_engine(tiny_config)
    p = prompts(1, [10])[0]
    full = eng.generate([Request("ref", p, GREEDY)])["ref"].token_ids
    eng.add_request(Request("a", p, GREEDY))
    while True:
        eng.step()
        seq = eng.scheduler.find("a")
        if seq.num_output_tokens >= 5:
            break
    partial = eng.abort("a")
    assert partial.finish_reason is FinishReason.ABORT
    assert partial.token_ids == full[: len(partial.token_ids)] and len(partial.token_ids) >= 5
    assert len(partial.logprobs) == len(partial.token_ids)
    # Resuming elsewhere from the partial prefix reproduces the rest.
    rest = eng.generate(
        [
            Request(
                "b",
                p + partial.token_ids,
                dataclasses.replace(GREEDY, max_new_tokens=12 - len(partial.token_ids)),
            )
        ]
    )["b"]
    assert partial.token_ids + rest.token_ids == full


def test_sleep_releases_device_state_and_wake_restores_it(tiny_config):
    eng = make_engine(tiny_config)
    p = prompts(1, [12])[0]
    before = eng.generate([Request("a", p, GREEDY)])["a"].token_ids
    eng.sleep()
    assert eng.asleep and eng.runner.kv_cache is None
    assert all(t.numel() == 0 for t in eng.model.parameters())
    with pytest.raises(EngineStateError, match="asleep"):
        eng.add_request(Request("x", p, GREEDY))
    eng.wake()
    after = eng.generate([Request("b", p, GREEDY)])["b"]
    assert after.token_ids == before
    assert after.telemetry.prefill_tokens_cached == 0  # KV did not survive sleep


def test_a_sleeping_engine_switches_role_and_serves_in_it_after_waking(tiny_config):
    """The toggle sets a borrowed worker's role before restoring its device state (CI once
    failed when the decision gave an overlap worker a non-colocated role)."""
    eng = make_engine(tiny_config)
    eng.sleep()
    assert eng.set_role(Role.PREFILL, InFlight.HAND_BACK) == []
    eng.wake()
    assert eng.scheduler.config.role is Role.PREFILL
    eng.set_role(Role.COLOCATED)
    assert eng.generate([Request("a", [1, 2, 3], GREEDY)])["a"].token_ids


def test_sleep_refuses_with_requests_in_flight(tiny_config):
    eng = make_engine(tiny_config)
    eng.add_request(Request("a", [1, 2, 3], GREEDY))
    with pytest.raises(EngineStateError, match="in flight"):
        eng.sleep()
    assert len(eng.run()[0].token_ids) == 12


def test_load_weights_swaps_weights_tags_version_and_invalidates_cache(tiny_config):
    eng = make_engine(tiny_config, seed=0)
    other = build_model(tiny_config, seed=1)
    p = prompts(1, [30])[0]
    eng.generate([Request("a", p, GREEDY)])
    eng.load_weights(other.state_dict(), version=5)
    out = eng.generate([Request("b", p, GREEDY)])["b"]
    ref = make_engine(tiny_config, seed=1).generate([Request("c", p, GREEDY)])["c"]
    assert out.weight_version == 5
    assert out.token_ids == ref.token_ids
    assert out.telemetry.prefill_tokens_cached == 0


def test_sleep_without_host_copy_then_load_weights_then_wake(tiny_config):
    eng = make_engine(tiny_config, seed=0)
    eng.sleep(keep_weights_on_host=False)
    with pytest.raises(EngineStateError, match="load_weights"):
        eng.wake()
    eng.load_weights(build_model(tiny_config, seed=1).state_dict(), version=2)
    eng.wake()
    p = prompts(1, [9])[0]
    ref = make_engine(tiny_config, seed=1).generate([Request("r", p, GREEDY)])["r"].token_ids
    assert eng.generate([Request("a", p, GREEDY)])["a"].token_ids == ref


def test_a_bfloat16_engine_woken_with_weights_loaded_asleep_stays_bfloat16(tiny_config):
    """Weights loaded while asleep are checked on a float32 probe; wake restores them in the
    engine's dtype (it once woke a bfloat16 engine in float32 beside a bfloat16 KV cache)."""
    eng = make_engine(tiny_config, dtype="bfloat16")
    eng.sleep(keep_weights_on_host=False)
    eng.load_weights(build_model(tiny_config, seed=1).state_dict(), version=1)
    eng.wake()
    assert {p.dtype for p in eng.model.parameters()} == {torch.bfloat16}
    assert eng.generate([Request("a", [1, 2, 3], GREEDY)])["a"].token_ids


def test_bad_weights_are_rejected_and_the_old_ones_keep_serving(tiny_config):
    eng = make_engine(tiny_config)
    p = prompts(1, [9])[0]
    before = eng.generate([Request("a", p, GREEDY)])["a"].token_ids
    state = build_model(tiny_config, seed=1).state_dict()
    state["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(Exception, match="up_proj"):
        eng.load_weights(state, version=1)
    del state["model.layers.0.mlp.up_proj.weight"]
    with pytest.raises(Exception, match="missing"):
        eng.load_weights(state, version=1)
    assert eng.weight_version == 0
    assert eng.generate([Request("b", p, GREEDY)])["b"].token_ids == before


@pytest.mark.parametrize(
    "prompt, sampling, match",
    [
        ([1, 2, 500], GREEDY, "outside the vocabulary"),
        ([1, -2], GREEDY, "outside the vocabulary"),
        ([], GREEDY, "non-empty"),
        ([1] * 2000, GREEDY, "max_model_len"),
        ([1, 2], SamplingParams(temperature=-1), "temperature"),
        ([1, 2], SamplingParams(temperature=float("nan")), "temperature"),
        ([1, 2], SamplingParams(top_p=0), "top_p"),
        ([1, 2], SamplingParams(top_k=-3), "top_k"),
        ([1, 2], SamplingParams(max_new_tokens=0), "max_new_tokens"),
        ([1, 2], SamplingParams(max_new_tokens=10**9), "max_new_tokens"),
        ([1, 2], SamplingParams(stop_token_ids=(1000,)), "stop token"),
    ],
)
def test_bad_requests_get_clear_errors_and_the_engine_stays_usable(
    tiny_config, prompt, sampling, match
):
    eng = make_engine(tiny_config)
    with pytest.raises(RequestError, match=match):
        eng.add_request(Request("bad", prompt, sampling))
    assert not eng.has_unfinished()
    assert len(eng.generate([Request("ok", [1, 2, 3], GREEDY)])["ok"].token_ids) == 12


def test_generate_with_one_bad_request_queues_none_of_them(tiny_config):
    eng = make_engine(tiny_config)
    good, bad = Request("good", [1, 2, 3], GREEDY), Request("bad", [1, 500], GREEDY)
    with pytest.raises(RequestError, match="'bad'"):
        eng.generate([good, bad])
    assert not eng.has_unfinished()
    outs = eng.generate([Request("next", [4, 5], GREEDY)])
    assert list(outs) == ["next"]  # 'good' was not left queued to come back here
    with pytest.raises(RequestError, match="already in flight"):  # duplicates in one call
        eng.generate([Request("x", [1], GREEDY), Request("x", [2], GREEDY)])
    assert not eng.has_unfinished()


def test_engines_of_different_weights_have_different_model_ids(tiny_config, tmp_path):
    """KV moves only between engines of the same weights: a same-named folder holding
    other weights (or another random seed) is a different model."""
    from pearl.models.loader import build_model, save_model

    a = LLMEngine.from_model_config(tiny_config, seed=0)
    assert LLMEngine.from_model_config(tiny_config, seed=0).model_id == a.model_id
    assert LLMEngine.from_model_config(tiny_config, seed=1).model_id != a.model_id
    ids = []
    for seed in (0, 1):
        folder = tmp_path / f"run{seed}" / "model"  # same folder name, other weights
        save_model(build_model(tiny_config, seed=seed), folder)
        ids.append(LLMEngine.from_folder(folder).model_id)
    assert ids[0] != ids[1] and ids[0] == a.model_id  # the weights, not where they came from
    P = LLMEngine.from_folder(tmp_path / "run1" / "model", EngineConfig(role=Role.PREFILL))
    P.generate([Request("p", [1, 2, 3, 4, 5], GREEDY, session_id="s")])
    with pytest.raises(KVTransferError, match="for model"):
        a.import_kv(P.export_kv("s"))


def test_kv_import_rejects_mismatches_and_changes_nothing(tiny_config):
    P = make_engine(tiny_config, role=Role.PREFILL)
    D = make_engine(tiny_config, role=Role.DECODE)
    p = prompts(1, [20])[0]
    P.generate([Request("p", p, GREEDY, session_id="s")])
    good = P.export_kv("s", 0, 20)
    bad_cases = {
        "model": dataclasses.replace(good, model_id="other-model"),
        "version": dataclasses.replace(good, weight_version=9),
        "dtype": dataclasses.replace(good, dtype="bfloat16"),
        "starts": dataclasses.replace(good, start=4, end=24),
        "vocabulary": dataclasses.replace(good, token_ids=(10**6,) + good.token_ids[1:]),
    }
    for name, chunk in bad_cases.items():
        with pytest.raises(KVTransferError):
            D.import_kv(chunk)
        assert D.session_length("s") == 0, name
    assert D.import_kv(good) == 20
    # An overlapping chunk whose token ids disagree with the held ones is rejected.
    tail = P.export_kv("s", 10, 20)
    with pytest.raises(KVTransferError, match="token ids differ"):
        D.import_kv(
            dataclasses.replace(tail, token_ids=(tail.token_ids[0] + 1,) + tail.token_ids[1:])
        )
    assert D.import_kv(tail) == 0  # the consistent overlap adds nothing
    # A decode request whose tokens do not extend the imported ones is refused, not decoded.
    with pytest.raises(EngineStateError, match="import KV"):
        D.add_request(Request("d", [p[0] + 1] + p[1:] + [3], GREEDY, session_id="s"))
    # Prefix tokens that disagree with what D holds are rejected too.
    P2 = make_engine(tiny_config, role=Role.PREFILL)
    P2.generate([Request("p", [5] + p[1:] + [1, 2, 3, 4], GREEDY, session_id="s")])
    with pytest.raises(KVTransferError, match="prefix"):
        D.import_kv(P2.export_kv("s", 20, 24))
    assert D.session_length("s") == 20


def test_kv_chunk_round_trips_through_bytes_without_pickle(tiny_config):
    P = make_engine(tiny_config, role=Role.PREFILL)
    P.generate([Request("p", list(range(1, 15)), GREEDY, session_id="s")])
    chunk = P.export_kv("s")
    again = KVChunk.from_bytes(chunk.to_bytes())
    assert again.token_ids == chunk.token_ids and np.array_equal(again.keys, chunk.keys)
    with pytest.raises(KVTransferError):
        KVChunk.from_bytes(b"garbage!" + b"\0" * 20)
    data = chunk.to_bytes()
    n = int.from_bytes(data[8:16], "little")
    header = data[16 : 16 + n]
    broken = {
        "too short": data[:10],
        "truncated": data[: 16 + n // 2],
        "body": data[:-3],
        "checksum": data[:-1] + bytes([data[-1] ^ 1]),  # one bit flipped in the body
        "header": data[:16] + header.replace(b'"start"', b'"stort"') + data[16 + n :],
        "malformed": data[:16] + b"{" + header[1:-1] + b"!" + data[16 + n :],
        "flag": data[:16]
        + header.replace(b'"cacheable": true', b'"cacheable": "ye"')
        + data[16 + n :],
    }
    why = {
        "too short": "too short",
        "truncated": "truncated",
        "body": "body has",
        "checksum": "checksum",
        "header": "malformed",
        "malformed": "malformed",
        "flag": "cacheable must be true or false",
    }
    for name, raw in broken.items():
        with pytest.raises(KVTransferError, match=why[name]):
            KVChunk.from_bytes(raw)


def test_role_change_hand_back_returns_partials_and_drain_finishes_them(tiny_config):
    eng = make_engine(tiny_config)
    eng.add_request(Request("a", prompts(1, [10])[0], GREEDY))
    for _ in range(3):
        eng.step()
    handed = eng.set_role(Role.PREFILL, InFlight.HAND_BACK)
    assert [o.finish_reason for o in handed] == [FinishReason.HANDED_BACK]
    assert len(handed[0].token_ids) >= 1 and eng.role is Role.PREFILL and not eng.has_unfinished()

    eng = make_engine(tiny_config)
    eng.add_request(Request("b", prompts(1, [10])[0], GREEDY))
    eng.step()
    drained = eng.set_role(Role.PREFILL, InFlight.DRAIN)
    assert [o.finish_reason for o in drained] == [FinishReason.LENGTH]
    assert len(drained[0].token_ids) == 12 and eng.role is Role.PREFILL


def test_disaggregated_turns_with_edited_context_match_colocated(tiny_config):
    """Turn 2's context drops turn 1's response (thinking stripped, as agent scaffolds do):
    the decode engine keeps the common prefix and imports exactly what it lacks; the tokens
    equal a colocated engine's."""
    from pearl.engine.disagg import run_disaggregated

    C = make_engine(tiny_config)
    P = make_engine(tiny_config, role=Role.PREFILL)
    D = make_engine(tiny_config, role=Role.DECODE)
    sp = SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True)
    prompt = prompts(1, [23])[0]
    contexts = [prompt]
    for turn in range(3):
        ctx = contexts[-1]
        req = Request(f"t{turn}", ctx, sp, session_id="s", pin_session=True)
        coloc = C.generate([dataclasses.replace(req, request_id=f"c{turn}")])[f"c{turn}"]
        pd = run_disaggregated(P, D, [req])[f"t{turn}"]
        assert pd.token_ids == coloc.token_ids, f"turn {turn}"
        assert np.allclose(pd.logprobs, coloc.logprobs, atol=1e-4)
        observation = prompts(1, [6], seed=turn + 1)[0]
        if turn == 0:
            # Next turn keeps only the response's last 2 tokens (its answer), not its thinking.
            contexts.append(ctx + coloc.token_ids[-2:] + observation)
            held = ctx + coloc.token_ids[:-1]  # what D holds after turn 0
            common = next(
                i for i, (a, b) in enumerate(zip(held, contexts[-1], strict=False)) if a != b
            )
            kept = common // 4 * 4  # block-aligned common prefix
            assert kept < len(ctx) + 2 and pd.kv_tokens_moved == len(ctx)
        else:
            contexts.append(ctx + coloc.token_ids + observation)
            if turn == 1:
                # D kept the block-aligned common prefix and received only the rest.
                assert pd.kv_tokens_moved == len(ctx) - kept


def test_sglang_and_mixed_scheduling_give_the_same_tokens(tiny_config):
    ps = prompts(6, [5, 17, 33, 8, 50, 21], seed=2)
    sp = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_new_tokens=9, ignore_eos=True)
    outs = []
    for mode in ("mixed", "sglang"):
        eng = make_engine(tiny_config, scheduling=mode, chunked_prefill_size=16)
        outs.append(eng.generate([Request(f"r{i}", p, sp) for i, p in enumerate(ps)]))
        assert eng.scheduler.config.mode == mode
    for rid, out in outs[0].items():
        assert outs[1][rid].token_ids == out.token_ids
        assert np.allclose(outs[1][rid].logprobs, out.logprobs, atol=1e-4)


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 28_311_552, 2**31 + 7])
def test_fingerprint_samples_stay_inside_large_parameters(n):
    """SmolLM2's embedding has 28,311,552 values: float32 linspace put its last sample at
    index n (out of bounds) and every SmolLM2 engine failed to start."""
    from pearl.engine.engine import spread_indices

    index = spread_indices(n, 64)
    assert len(index) == min(n, 64) and int(index[0]) == 0 and int(index[-1]) == n - 1
    assert bool((index[1:] > index[:-1]).all())


@pytest.mark.parametrize("flush", [False, True])
def test_weights_landing_mid_rollout_flush_the_cache_only_when_configured(tiny_config, flush):
    """``flush_cache_on_weight_update`` (SGLang's flush_cache=True), the live engine's as the
    simulated one's: a finished turn's pinned session is dropped with the new weights, so
    the next turn re-prefills its whole context; without it the session is kept."""
    eng = make_engine(tiny_config, flush_cache_on_weight_update=flush)
    sp = SamplingParams(temperature=0.0, max_new_tokens=4)
    prompt = prompts(1, [10])[0]
    eng.generate([Request("t0", prompt, sp, session_id="s", pin_session=True)])
    eng.add_request(Request("other", prompts(1, [6], seed=1)[0], sp))
    eng.step()  # a request in flight: the update lands between iterations
    state = {n: p.detach().clone() for n, p in eng.model.named_parameters()}
    eng.load_weights(state, 1, in_flight=True)
    assert eng.weight_version == 1
    assert eng.session_length("s") == (0 if flush else len(prompt) + 3)


@pytest.mark.parametrize("flush", [False, True])
@pytest.mark.parametrize("busy", [False, True])
def test_no_request_after_a_weight_update_starts_from_the_old_weights_kv(tiny_config, flush, busy):
    """The prefix cache never serves KV the previous weights computed: a prompt sharing a
    40-token prefix with earlier turns samples, after new weights land mid-rollout, exactly
    what an engine built with the new weights samples. Before this, the shared prompt of
    every `pearl train` task was served from the first weights' KV for the whole run (the
    trained policy barely reached its own rollouts). ``busy``: a turn is still decoding when
    the weights land (its old-weight blocks must not re-enter the cache when it goes on)."""
    rng = np.random.default_rng(0)
    shared = rng.integers(0, 97, size=40).tolist()
    first, later = shared + [5, 6, 7], shared + [8, 9, 10, 11]
    sp = SamplingParams(temperature=0.7, seed=123, max_new_tokens=8, ignore_eos=True)
    eng = make_engine(tiny_config, max_num_batched_tokens=64, flush_cache_on_weight_update=flush)
    eng.generate([Request("warm", first, sp)])  # the shared prefix is now cached
    if busy:
        eng.add_request(Request("busy", first, dataclasses.replace(sp, max_new_tokens=20)))
        eng.step()
        eng.step()
    new = build_model(tiny_config, seed=1).state_dict()
    eng.load_weights(new, 1, in_flight=True)
    eng.run()
    out = eng.generate([Request("after", later, sp)])["after"]
    assert out.telemetry.prefill_tokens_cached == 0
    fresh = make_engine(tiny_config, seed=1, max_num_batched_tokens=64)
    expect = fresh.generate([Request("after", later, sp)])["after"]
    assert out.token_ids == expect.token_ids
    assert max(abs(a - b) for a, b in zip(out.logprobs, expect.logprobs, strict=True)) < 1e-5
    # The new weights' own blocks are cached again for the next turn.
    again = eng.generate([Request("again", later, sp)])["again"]
    assert again.telemetry.prefill_tokens_cached > 0


@pytest.mark.parametrize("updated", [False, True])
def test_kv_moved_after_a_weight_update_never_enters_the_receivers_prefix_cache(
    tiny_config, updated
):
    """A session prefilled under the old weights and moved after new ones landed (a PD turn
    across an RL weight update) continues on the decode side, but its KV is marked as not
    cacheable, through the wire format too, and the receiver never registers it: no later
    request there starts from the old weights' KV."""
    P = make_engine(tiny_config, role=Role.PREFILL)
    D = make_engine(tiny_config, role=Role.DECODE)
    prompt = prompts(1, [40])[0]
    P.generate([Request("p", prompt, GREEDY, session_id="s")])  # pinned on P
    if updated:
        new = build_model(tiny_config, seed=1).state_dict()
        P.load_weights(new, 1, in_flight=True)  # the pinned session keeps its old KV
        D.load_weights(new, 1)
    chunk = KVChunk.from_bytes(P.export_kv("s", 0, len(prompt)).to_bytes())
    assert chunk.cacheable is not updated
    assert D.import_kv(chunk) == len(prompt)
    assert D.session_length("s") == len(prompt)  # the session continues either way
    assert (D.scheduler.blocks.num_cached_blocks > 0) is not updated


def test_a_bfloat16_engine_keeps_weights_and_kv_in_bfloat16_and_moves_kv_between_its_kind(
    tiny_config,
):
    """``dtype=bfloat16``: weights and KV cache in bfloat16, logits in float32 and close to
    the float32 engine's; KV moves between bfloat16 engines (carried as float32 arrays) and
    is refused by a float32 engine, naming both dtypes."""
    prompt = prompts(1, [11])[0]
    sp = SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True)
    full = make_engine(tiny_config)
    half = make_engine(tiny_config, dtype="bfloat16")
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16}
    assert half.runner.kv_cache.dtype == torch.bfloat16
    _, lp_full, logits_full = coloc_turn(full, "a", "s", prompt, sp)
    _, lp_half, logits_half = coloc_turn(half, "a", "s", prompt, sp)
    assert logits_half[0].dtype == torch.float32
    scale = float(logits_full[0].abs().max())
    assert float((logits_half[0] - logits_full[0]).abs().max()) < 0.05 * scale + 0.05
    # PD between two bfloat16 engines: the chunk says bfloat16, its arrays are float32
    P = make_engine(tiny_config, role=Role.PREFILL, dtype="bfloat16")
    D = make_engine(tiny_config, role=Role.DECODE, dtype="bfloat16")
    P.add_request(Request("p", prompt, dataclasses.replace(sp, max_new_tokens=1), session_id="x"))
    run_collecting_logits(P, "p")
    chunk = P.export_kv("x", 0, len(prompt))
    assert chunk.dtype == "bfloat16" and chunk.keys.dtype == np.float32
    assert D.import_kv(chunk) == len(prompt)
    with pytest.raises(KVTransferError, match="bfloat16.*stores float32"):
        make_engine(tiny_config, role=Role.DECODE).import_kv(chunk)
    with pytest.raises(ValueError, match="not one of float32, bfloat16"):
        make_engine(tiny_config, dtype="float16")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda.is_available"):
            make_engine(tiny_config, device="cuda")


def test_tokens_sampled_on_kv_of_older_weights_carry_its_version(tiny_config):
    """Every output token records which weights sampled it and the oldest weights in the KV
    it attended to: a turn decoding when v1 lands goes on as ``(v1, kv v0)``; the next turn
    of a session kept across the update samples all its tokens on v0's KV; a turn the
    prefix cache cannot serve (it was emptied) computes its own KV under v1; KV moved to a
    decode engine carries its oldest version through the wire format. Before, every token
    of these turns was tagged v1."""
    sp = SamplingParams(temperature=0.7, seed=5, max_new_tokens=10, ignore_eos=True)
    eng = make_engine(tiny_config)
    prompt = prompts(1, [12])[0]
    eng.generate([Request("kept", prompt, sp, session_id="k", pin_session=True)])
    eng.add_request(Request("busy", prompts(1, [9], seed=1)[0], sp, session_id="b"))
    for _ in range(4):  # the prompt in one chunk, then three decodes: 4 tokens sampled
        eng.step()
    new = build_model(tiny_config, seed=1).state_dict()
    eng.load_weights(new, 1, in_flight=True)
    busy = eng.run()[0]
    assert busy.version_spans == ((0, 0, 0), (4, 1, 0))
    assert busy.weight_version == 1
    cont = prompt + [3, 4, 5]  # the kept session's next turn, appended
    nxt = eng.generate([Request("next", cont, sp, session_id="k", pin_session=True)])["next"]
    assert nxt.telemetry.prefill_tokens_cached > 0  # it continued on the old KV
    assert nxt.version_spans == ((0, 1, 0),)
    fresh = eng.generate([Request("fresh", prompts(1, [9], seed=2)[0], sp)])["fresh"]
    assert fresh.version_spans == ((0, 1, 1),)
    # The kept session's KV (computed in part by v0) moved to a decode engine at v1.
    P = make_engine(tiny_config, role=Role.PREFILL)
    D = make_engine(tiny_config, role=Role.DECODE)
    P.generate([Request("p", prompt, GREEDY, session_id="s")])
    P.load_weights(new, 1, in_flight=True)
    D.load_weights(new, 1)
    chunk = KVChunk.from_bytes(P.export_kv("s", 0, len(prompt)).to_bytes())
    assert (chunk.weight_version, chunk.kv_version) == (1, 0)
    D.import_kv(chunk)
    out = D.generate([Request("d", prompt + [7], GREEDY, session_id="s")])["d"]
    assert out.version_spans == ((0, 1, 0),)
