"""Token sampling from logits: greedy, temperature, top-k, top-p, per-request seeds (torch),
as one batched operation on the logits' device.

A token's log-probability is taken under the distribution it was drawn from: softmax of
the logits over the temperature, truncated by top-k then top-p and renormalized
(``truncated_log_softmax``; vLLM's ``logprobs_mode=processed_logprobs`` returns the same).
The trainer recomputes it with the same function, so its importance ratio is 1 on the
weights that sampled.

Drawing is by inverse CDF, all rows at once: each row's token is the first whose
cumulative probability exceeds the row's uniform draw. A request with a seed gets the draw
``row_uniform(seed, position)``, a counter-based hash of the two (53 random bits, no state
carried between rows, calls or devices): the token at a position depends on the seed, the
position and the row's logits only, not on the batch around it or on which engine samples
it. Rows without a seed draw from the engine's generator. (Gumbel-max with hashed noise
per token, the other stateless choice, costs a hash and two logarithms per vocabulary entry:
3.5x the old per-row ``multinomial`` on this CPU, where the cumulative sum costs one pass.)
"""

from __future__ import annotations

import torch

from pearl.engine.sequence import SamplingParams

_M32 = 0xFFFF_FFFF


def _mix32(x: int) -> int:
    """A bijective 32-bit hash: Chris Wellons's lowbias32 (hash-prospector, its second round
    of constants)."""
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & _M32
    x ^= x >> 15
    x = (x * 0x735A2D97) & _M32
    return x ^ (x >> 15)


def _hash(seed: int, position: int, salt: int) -> int:
    """32 bits from (the low 64 bits of ``seed``, ``position``, ``salt``)."""
    s = seed & 0xFFFF_FFFF_FFFF_FFFF
    h = _mix32((position & _M32) ^ salt)
    h = _mix32(h ^ (s & _M32))
    return _mix32(h ^ (s >> 32))


def row_uniform(seed: int, position: int) -> float:
    """The draw in [0, 1) of the token at ``position`` of a request seeded ``seed`` (any
    integer: its low 64 bits count): 53 bits from two hashes of the pair."""
    high = _hash(seed, position, 0x9E3779B9) >> 5  # 27 bits
    low = _hash(seed, position, 0x85EBCA6B) >> 6  # 26 bits
    return (high * (1 << 26) + low) * 2.0**-53


def sample(
    logits: torch.Tensor,  # [n, vocab], any float dtype, on the engine's device
    params: list[SamplingParams],
    positions: list[int],  # index in the sequence of each token being sampled
    generator: torch.Generator,  # CPU: the draws of rows without a seed
) -> tuple[list[int], list[float]]:
    """Pick one token per row; return the tokens and their log-probabilities (under
    ``softmax(logits)`` for greedy rows). Batched operations on ``logits``' device and one
    transfer of the results."""
    n = logits.shape[0]
    if n == 0:
        return [], []
    logits = logits.float()
    device = logits.device
    temps = [p.temperature if p.temperature > 0 else 1.0 for p in params]
    if all(t == 1.0 for t in temps):  # x / 1.0 == x: skip a pass over [n, vocab]
        logprobs = torch.log_softmax(logits, dim=-1)
    else:
        scale = torch.tensor(temps, dtype=logits.dtype).to(device, non_blocking=True)
        logprobs = torch.log_softmax(logits / scale.unsqueeze(1), dim=-1)
    greedy = [p.greedy for p in params]
    if all(greedy):
        tokens = torch.argmax(logits, dim=-1)
    else:
        # Rows truncated alike are truncated together (in RL all rows share their settings).
        cuts: dict[tuple[int, float], list[int]] = {}
        for i, p in enumerate(params):
            if not p.greedy and (p.top_k or p.top_p < 1.0):
                cuts.setdefault((p.top_k, p.top_p), []).append(i)
        for (top_k, top_p), rows in cuts.items():
            if len(rows) == n:
                logprobs = truncated_log_softmax(logprobs, top_k, top_p)
            else:
                index = torch.tensor(rows, device=device)
                logprobs[index] = truncated_log_softmax(logprobs[index], top_k, top_p)
        drawn = torch.rand(n, dtype=torch.float64, generator=generator).tolist()
        draws = [
            row_uniform(p.seed, positions[i]) if p.seed is not None else drawn[i]
            for i, p in enumerate(params)
        ]
        cdf = torch.cumsum(logprobs.exp(), dim=-1, dtype=torch.float64)  # summed in float64
        total = cdf[:, -1:]
        target = torch.tensor(draws, dtype=torch.float64).to(device, non_blocking=True)
        # u * total, kept below the total so that the token found has probability > 0
        target = torch.minimum(target.unsqueeze(1) * total, torch.nextafter(total, total * 0))
        tokens = torch.searchsorted(cdf, target, right=True).squeeze(1)
        if any(greedy):
            mask = torch.tensor(greedy).to(device, non_blocking=True)
            tokens = torch.where(mask, torch.argmax(logits, dim=-1), tokens)
    chosen = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
    both = torch.stack([tokens.to(torch.float64), chosen.to(torch.float64)]).cpu()
    return [int(t) for t in both[0].tolist()], both[1].tolist()


def truncated_log_softmax(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``log_softmax`` of each row of ``logits`` [n, vocab] (already over the temperature)
    restricted to its top-k tokens (ties with the k-th kept; 0 disables), then to the
    smallest set of the most probable of those whose mass reaches ``top_p`` (a token is
    kept while the tokens more probable than it hold less than ``top_p``; the most probable
    always stays); -inf elsewhere. Differentiable in the kept logits (the trainer's ratio)."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits.detach(), top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits.detach() < kth, float("-inf"))
    if top_p < 1.0:
        with torch.no_grad():
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            before = torch.cumsum(probs, dim=-1) - probs  # mass of the more probable tokens
            drop_sorted = before >= top_p
            drop_sorted[..., 0] = False
            drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.log_softmax(logits, dim=-1)
