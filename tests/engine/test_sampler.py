"""The batched sampler: seeds give the same tokens whatever the batch, draws follow the
(truncated) softmax, log-probabilities are those of the distribution drawn from."""

import math

import pytest
import torch

from pearl.engine.sampler import row_uniform, sample, truncated_log_softmax
from pearl.engine.sequence import SamplingParams

VOCAB = 50


def random_logits(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed)) * 2


def test_a_seeded_row_draws_the_same_token_alone_and_in_any_batch():
    logits = random_logits(8)
    params = [SamplingParams(temperature=0.8, seed=100 + i) for i in range(8)]
    positions = list(range(30, 38))
    batch, batch_lp = sample(logits, params, positions, torch.Generator().manual_seed(1))
    for i in range(8):  # alone, after other draws of the engine's generator
        alone, alone_lp = sample(
            logits[i : i + 1], [params[i]], [positions[i]], torch.Generator().manual_seed(i)
        )
        assert alone == [batch[i]] and alone_lp == pytest.approx([batch_lp[i]], abs=0)
    # in another order, beside unseeded and greedy rows
    order = [5, 2, 7, 0]
    mixed_params = [params[i] for i in order] + [SamplingParams(), SamplingParams(temperature=0)]
    mixed_logits = torch.cat([logits[order], random_logits(2, seed=9)])
    mixed, _ = sample(
        mixed_logits, mixed_params, [positions[i] for i in order] + [0, 0], torch.Generator()
    )
    assert mixed[:4] == [batch[i] for i in order]
    assert mixed[5] == int(torch.argmax(mixed_logits[5]))


def test_the_draw_depends_on_seed_and_position_only_and_is_uniform():
    draws = {row_uniform(s, p) for s in (0, 1, 2**40, -1) for p in (0, 1, 2, 10**6)}
    assert len(draws) == 16 and all(0 <= u < 1 for u in draws)
    assert row_uniform(7, 3) == row_uniform(7 + 2**64, 3)  # the low 64 bits of the seed count
    many = torch.tensor([row_uniform(s, p) for s in range(200) for p in range(50)])
    assert float(many.mean()) == pytest.approx(0.5, abs=0.01)
    assert float(many.var()) == pytest.approx(1 / 12, abs=0.005)
    # consecutive positions of one seed are not correlated
    pairs = torch.tensor([[row_uniform(3, p), row_uniform(3, p + 1)] for p in range(5000)])
    assert abs(float(torch.corrcoef(pairs.T)[0, 1])) < 0.05


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic over the cells expected >= 5 (the rest pooled) and its degrees
    of freedom."""
    expected = probs * counts.sum()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().unsqueeze(0)])
    exp = torch.cat([expected[big], expected[~big].sum().unsqueeze(0)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return stat, int(keep.sum()) - 1


def chi_square_critical(df: int) -> float:
    """The 0.999 quantile of chi-square(df) (Wilson-Hilferty)."""
    z = 3.0902
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=10),
        SamplingParams(temperature=0.9, top_p=0.8),
    ],
    ids=["t1", "t0.7", "top_k", "top_p"],
)
def test_seeded_draws_follow_the_truncated_softmax(params):
    """20,000 draws, each with its own (seed, position), of one row: a chi-square test
    against the distribution the log-probabilities name (p < 0.001 fails), and each drawn
    token's log-probability is that distribution's."""
    torch.manual_seed(0)
    row = random_logits(1, seed=3)
    n = 20_000
    logits = row.expand(n, VOCAB)
    rows = [
        SamplingParams(params.temperature, params.top_p, params.top_k, seed=s // 7)
        for s in range(n)
    ]
    tokens, logprobs = sample(logits, rows, [s % 7 for s in range(n)], torch.Generator())
    dist = truncated_log_softmax(row / params.temperature, params.top_k, params.top_p)[0]
    assert logprobs == pytest.approx(dist[tokens].tolist(), abs=1e-6)
    counts = torch.bincount(torch.tensor(tokens), minlength=VOCAB).double()
    assert counts[dist == float("-inf")].sum() == 0  # nothing outside the truncation
    stat, df = chi_square(counts, dist.exp().double())
    assert stat < chi_square_critical(df), (stat, df)


def test_unseeded_draws_follow_the_softmax_and_come_from_the_engines_generator():
    row = random_logits(1, seed=4)
    n = 20_000
    params = [SamplingParams(temperature=1.0)] * n
    tokens, _ = sample(row.expand(n, VOCAB), params, [0] * n, torch.Generator().manual_seed(5))
    counts = torch.bincount(torch.tensor(tokens), minlength=VOCAB).double()
    stat, df = chi_square(counts, torch.softmax(row[0], -1).double())
    assert stat < chi_square_critical(df), (stat, df)
    again, _ = sample(row.expand(n, VOCAB), params, [0] * n, torch.Generator().manual_seed(5))
    other, _ = sample(row.expand(n, VOCAB), params, [0] * n, torch.Generator().manual_seed(6))
    assert again == tokens and other != tokens


def test_greedy_rows_take_the_argmax_with_its_full_softmax_log_probability():
    logits = random_logits(3, seed=6)
    greedy = SamplingParams(temperature=0, top_k=3)
    tokens, logprobs = sample(logits, [greedy] * 3, [0, 1, 2], torch.Generator())
    assert tokens == torch.argmax(logits, -1).tolist()
    full = torch.log_softmax(logits, -1)
    assert logprobs == pytest.approx([float(full[i, t]) for i, t in enumerate(tokens)], abs=1e-6)


def test_rows_truncated_differently_each_keep_their_own_truncation():
    logits = random_logits(400, seed=8)
    params = [
        SamplingParams(temperature=1.0, top_k=1 + i % 3, seed=i)
        if i % 2
        else SamplingParams(seed=i)
        for i in range(400)
    ]
    tokens, logprobs = sample(logits, params, [0] * 400, torch.Generator())
    for i, (p, t) in enumerate(zip(params, tokens, strict=True)):
        dist = truncated_log_softmax(logits[i : i + 1], p.top_k, p.top_p)[0]
        assert torch.isfinite(dist[t]) and logprobs[i] == pytest.approx(float(dist[t]), abs=1e-6)
        if p.top_k == 1:
            assert t == int(torch.argmax(logits[i]))


def test_bfloat16_logits_sample_like_their_float32_values():
    logits = random_logits(4, seed=10)
    params = [SamplingParams(temperature=0.8, seed=i) for i in range(4)]
    want, _ = sample(logits.bfloat16().float(), params, [1] * 4, torch.Generator())
    got, got_lp = sample(logits.bfloat16(), params, [1] * 4, torch.Generator())
    assert got == want and all(math.isfinite(x) for x in got_lp)
